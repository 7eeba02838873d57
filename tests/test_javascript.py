"""JavaScript, the language added as one module (``sandbox/runner/languages/javascript.py``):
what the verifier reads of it without Docker (its names, fences, prompts, the checker role it
does not play), then its programs in the real sandbox: io cases, heap and buffers held to the
job's memory limit, deep recursion, and a problem set posed in JavaScript through ``codepost
verify``. The hostile programs are in the red-team suite (``JS_ATTACKS``), and /run_code's
``nodejs`` in tests/test_verify_server.py."""

from __future__ import annotations

import json

import pytest

from codepost.pipeline.data.prompts import reference_answer
from codepost.sandbox import LANGUAGES, ExecStatus, Job, Limits
from codepost.sandbox.runner import languages
from codepost.verifiers import Problem, build_program, load_problems, verify_command
from codepost.verifiers.chat import user_message
from codepost.verifiers.forms.io import CheckerProgram
from codepost.verifiers.languages import canonical_language, checker_languages
from codepost.verifiers.problems import posed_in

SUM = "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n"
# codecontests-sample's three problems, answered in JavaScript
HANDSHAKES = "const n = BigInt(require('fs').readFileSync(0, 'utf8').trim());\nconsole.log(String(n * (n - 1n) / 2n));\n"
CIRCLE = "const r = parseFloat(require('fs').readFileSync(0, 'utf8'));\nconsole.log((Math.PI * r * r).toFixed(6));\n"
WORDS = "const words = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).slice(1);\nconsole.log(words.sort().join(' '));\n"


def test_the_language_is_known_by_its_names_and_fences():
    assert LANGUAGES == ("cpp", "javascript", "python")
    for name in ("javascript", "JavaScript", "js", "node", "nodejs"):
        assert canonical_language(name) == "javascript"
    node = languages.get("javascript")
    assert not node.compiled and not node.in_runner
    command = node.run_command("/unused", 256)
    assert command[0] == "node" and "--max-old-space-size=256" in command
    assert command[-1] == "/tmp/main.js"
    assert node.packages == ("nodejs",)


def test_a_problem_is_posed_and_answered_in_javascript():
    problem = Problem(
        task_id="sum", prompt="Print a + b.", io=[{"input": "2 3\n", "output": "5\n"}]
    ).in_language("js")
    assert problem.language == "javascript"
    message = user_message(problem)
    assert message.endswith(
        "Answer with the complete JavaScript program in one ```javascript code block."
    )
    answer = f"Python first:\n```python\nprint(5)\n```\nthen mine:\n```js\n{SUM}```\n"
    program = build_program(problem, answer, "chat")
    assert (program.source, program.language) == (SUM, "javascript")
    assert reference_answer(problem.model_copy(update={"canonical_solution": SUM})) == (
        f"```javascript\n{SUM.strip()}\n```"
    )


def test_a_checker_is_written_in_a_language_that_plays_that_role():
    assert checker_languages() == ("cpp", "python")
    with pytest.raises(
        ValueError, match="a checker in 'js' is not run here: checkers are written in cpp, python"
    ):
        CheckerProgram(source="process.exit(0)", language="js")
    # a problem posed in JavaScript keeps its Python checker
    problem = load_problems("codecontests-sample")["1000_B. Circle"]
    assert problem.in_language("javascript").checker == problem.checker


@pytest.mark.docker
def test_programs_run_each_case_within_the_jobs_memory(sandbox_pool):
    """A case per stdin; the heap (V8's limit) and the buffers outside it (the address space
    left past what V8 reserves) both end at the job's memory limit; deep recursion works."""
    limits = Limits(wall_time_s=5.0, cpu_time_s=5.0, memory_mb=128)

    def run(program: str, *stdin: str):
        return sandbox_pool.run(
            Job(program=program, stdin_cases=stdin or ("",), limits=limits, language="javascript")
        )

    result = run(SUM, "2 3\n", "40 2\n")
    assert [(case.status, case.stdout) for case in result.cases] == [
        (ExecStatus.COMPLETED, "5\n"),
        (ExecStatus.COMPLETED, "42\n"),
    ]
    held = run(
        "const hog = [];\ntry { for (;;) hog.push(Buffer.alloc(16 << 20, 1)); } catch (e) {}\n"
        "console.log(hog.length * 16);\n"
    )
    assert held.cases[0].status is ExecStatus.COMPLETED
    assert 64 <= int(held.cases[0].stdout) <= 128, held  # within the limit, and most of it
    heap = run("const hog = [];\nfor (;;) hog.push({ n: hog.length, s: 'x'.repeat(100) });\n")
    assert heap.cases[0].status in (ExecStatus.MEMORY_LIMIT, ExecStatus.TIMEOUT), heap
    deep = run(
        "function down(n) { return n === 0 ? 0 : 1 + down(n - 1); }\nconsole.log(down(300000));\n"
    )
    assert deep.cases[0].stdout == "300000\n", deep
    wrong = run("this is not javascript")
    assert wrong.cases[0].status is ExecStatus.RUNTIME_ERROR
    assert "SyntaxError" in wrong.cases[0].stderr


@pytest.mark.docker
def test_a_problem_set_posed_in_javascript_through_codepost_verify(tmp_path):
    """codecontests-sample posed in JavaScript: right answers pass (a Python checker judges the
    circle's digits), a wrong one fails, a heap bomb ends at its limits, each with its row."""
    rows = [
        {"task_id": "1000_A. Handshakes", "completion": f"```javascript\n{HANDSHAKES}```"},
        {"task_id": "1000_B. Circle", "completion": f"```js\n{CIRCLE}```"},
        {"task_id": "1000_C. Sorting words", "completion": f"```node\n{WORDS}```"},
        {"task_id": "1000_A. Handshakes", "completion": "```js\nconsole.log(0);\n```"},
        {
            "task_id": "1000_C. Sorting words",
            "completion": "```js\nconst a = []; for (;;) a.push([a]);\n```",
        },
    ]
    samples, output = tmp_path / "samples.jsonl", tmp_path / "out.jsonl"
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["verify", str(samples), "--problems", "codecontests-sample", "--language", "javascript"]
    options = ["--output", str(output), "--workers", "2", "--timeout", "3", "--memory-mb", "128"]
    assert verify_command.main([*argv, *options, "--k", "1"]) == 0
    verdicts = [json.loads(line) for line in output.read_text().splitlines()]
    statuses = [verdict["status"] for verdict in verdicts]
    assert statuses[:4] == ["passed", "passed", "passed", "failed"], verdicts
    assert statuses[4] in ("memory_limit", "timeout"), verdicts[4]
    posed = posed_in(load_problems("codecontests-sample"), "javascript")
    assert {problem.language for problem in posed.values()} == {"javascript"}
