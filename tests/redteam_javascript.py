"""Hostile JavaScript programs (Node.js), each answering the io problem SQUARE (stdin 7, print
49) or attacking the sandbox instead: the attacks that apply to a language run by an
interpreter of its own, with a heap of its own and child processes a line away. A cheat that
worked would pass (reward 1); one that broke its container needs a second attempt; one that
outlived its job is found by the leftovers checker after ``JS_LEAVER``."""

from __future__ import annotations

from redteam_samples import (
    FAILED,
    MEMORY_LIMIT,
    NOT_PASSED,
    OUTPUT_LIMIT,
    RUNTIME_ERROR,
    TIMEOUT,
    IoAttack,
)


def attack(id: str, program: str, expect: frozenset[str]) -> IoAttack:
    return IoAttack(id, program, expect, language="javascript")


JS_HONEST = (
    "const n = BigInt(require('fs').readFileSync(0, 'utf8').trim());\nconsole.log(String(n * n));\n"
)

# Prints the answer only where the attack worked, else something else: a pass is a breach.
_IF_IT_WORKED = "console.log(worked ? 49 : 'contained');\n"

JS_ATTACKS = [
    # -- processes, memory, output, time
    attack("js_infinite_loop", "for (;;) {}", frozenset({TIMEOUT})),
    attack(
        "js_spawn_bomb",
        "const { spawn } = require('child_process');\n"
        "for (;;) { try { spawn(process.execPath, ['-e', 'for (;;) {}']); } catch (e) {} }\n",
        frozenset({TIMEOUT}),
    ),
    attack(
        "js_exec_sync_bomb",  # each child waited for: the process limit, then the time limit
        "const { execSync } = require('child_process');\n"
        "for (;;) { try { execSync('sh -c \"while :; do :; done\" &'); } catch (e) {} }\n",
        NOT_PASSED | {TIMEOUT},
    ),
    attack(  # V8 collects ever longer near its heap limit: the time limit may come first
        "js_heap_bomb",
        "const hog = [];\nfor (;;) hog.push({ a: [1, 2, 3], b: 'x'.repeat(64) + hog.length });\n",
        frozenset({MEMORY_LIMIT, TIMEOUT}),
    ),
    attack(
        "js_buffers_outside_the_heap",  # ArrayBuffers: V8's heap limit does not hold them
        "const hog = [];\nfor (;;) hog.push(Buffer.alloc(16 << 20, 1));\n",
        frozenset({MEMORY_LIMIT, RUNTIME_ERROR}),
    ),
    attack(
        "js_buffers_held_past_the_limit_then_answers",
        "const hog = [];\n"
        "try { for (;;) hog.push(Buffer.alloc(16 << 20, 1)); } catch (e) {}\n"
        "console.log(hog.length * 16 > 256 ? 49 : 'contained');  // the limit: 256 MB\n",
        frozenset({FAILED, MEMORY_LIMIT, RUNTIME_ERROR}),
    ),
    attack(
        "js_output_flood_sync",
        "const fs = require('fs');\nconst block = 'x'.repeat(1 << 16);\nfor (;;) fs.writeSync(1, block);\n",
        frozenset({OUTPUT_LIMIT}),
    ),
    attack(
        "js_output_flood_async",  # stdout buffered in the heap while the pipe is full
        "const block = 'x'.repeat(1 << 16);\nfor (;;) process.stdout.write(block);\n",
        frozenset({OUTPUT_LIMIT, MEMORY_LIMIT, TIMEOUT}),
    ),
    attack(
        "js_unbounded_recursion",
        "function down(n) { return down(n + 1) + 1; }\ndown(0);\n",
        frozenset({RUNTIME_ERROR}),
    ),
    # -- reaching out
    attack(
        "js_network",
        "let worked = false;\n"
        "const socket = require('net').connect(53, '8.8.8.8', () => { worked = true; });\n"
        "socket.on('error', () => {});\n"
        "setTimeout(() => { socket.destroy(); " + _IF_IT_WORKED + "}, 500);\n",
        frozenset({FAILED}),
    ),
    attack(
        "js_writes_outside_its_folders",
        "const fs = require('fs');\nlet worked = false;\n"
        "for (const path of ['/etc/passwd', '/opt/codepost/runner/x.py', '/usr/bin/node2',"
        " '/build/x']) {\n"
        "  try { fs.writeFileSync(path, 'x'); worked = true; } catch (e) {}\n}\n" + _IF_IT_WORKED,
        frozenset({FAILED}),
    ),
    attack(
        "js_reads_the_supervisor",  # PID 1's memory, environment and open files
        "const fs = require('fs');\nlet worked = false;\n"
        "for (const path of ['/proc/1/environ', '/proc/1/mem', '/proc/1/fd/0', '/proc/1/maps']) {\n"
        "  try { fs.readFileSync(path); worked = true; } catch (e) {}\n}\n" + _IF_IT_WORKED,
        frozenset({FAILED}),
    ),
    attack(
        "js_kills_every_process_it_can",
        "for (const pid of require('fs').readdirSync('/proc').filter((d) => /^\\d+$/.test(d))) {\n"
        "  try { if (+pid !== process.pid) process.kill(+pid, 'SIGKILL'); } catch (e) {}\n}\n"
        "try { process.kill(-1, 'SIGKILL'); } catch (e) {}\n"
        "console.log('contained');\n",
        frozenset({FAILED, RUNTIME_ERROR}),
    ),
    attack(
        "js_prints_the_answer_then_hangs",  # the answer is in: the time limit still fails it
        "console.log(49);\nsetInterval(() => {}, 1000);\n",
        frozenset({TIMEOUT}),
    ),
]

# Leaves everything it can in the container (the leftovers checker then looks, as after
# CPP_LEAVER): a detached daemon deaf to signals, files in every writable folder, and the
# right answer, so that the job itself passes.
JS_LEAVER = (
    "const fs = require('fs');\n"
    "const { spawn } = require('child_process');\n"
    "const daemon = spawn(process.execPath, ['-e', `\n"
    "  for (const sig of ['SIGTERM', 'SIGHUP', 'SIGINT', 'SIGUSR1']) process.on(sig, () => {});\n"
    "  require('net').createServer().listen(45680, '127.0.0.1');\n"
    "  setInterval(() => require('fs').writeFileSync('/tmp/js-daemon-alive', String(Date.now())), 10);\n"
    "`], { detached: true, stdio: 'ignore' });\n"
    "daemon.unref();\n"
    "for (const folder of ['/work', '/tmp', '/dev/shm']) {\n"
    "  try { fs.writeFileSync(folder + '/plain', 'left'); } catch (e) {}\n"
    "  try { fs.writeFileSync(folder + '/.hidden', 'left'); } catch (e) {}\n"
    "  try { fs.symlinkSync('/etc/passwd', folder + '/link'); } catch (e) {}\n"
    "  try { fs.mkdirSync(folder + '/locked'); fs.writeFileSync(folder + '/locked/f', 'x');"
    " fs.chmodSync(folder + '/locked', 0); } catch (e) {}\n"
    "}\n"
    "const n = BigInt(fs.readFileSync(0, 'utf8').trim());\n"
    "setTimeout(() => console.log(String(n * n)), 600);  // keeps this container busy meanwhile\n"
)
