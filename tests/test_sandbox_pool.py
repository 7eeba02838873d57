"""The warm Docker pool, for real: both job kinds, limits, concurrency and recovery."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time

import docker
import psutil
import pytest
from processes import gone, wait_until

from codepost.sandbox import (
    ExecStatus,
    Job,
    JudgeSpec,
    Limits,
    PoolConfig,
    SandboxPool,
    SandboxUnavailable,
)
from codepost.sandbox import pool as pool_module

pytestmark = pytest.mark.docker

FAST = Limits(wall_time_s=2.0, cpu_time_s=2.0, memory_mb=256, output_bytes=64_000)


def call_job(
    program: str, *tests: str, setup: str = "f = __remote__('f')", limits: Limits = FAST
) -> Job:
    return Job(program=program, judge=JudgeSpec(setup=setup, tests=tests), limits=limits)


def passed(result) -> list[bool]:
    return [test.passed for test in result.tests]


def test_call_mode_reports_each_test(sandbox_pool):
    result = sandbox_pool.run(
        call_job(
            "def f(x):\n    print('seen', x)\n    return x * 2\n",
            "assert f(2) == 4",
            "assert f(3) == 5",
            "assert f('ab') == 'abab'",
        )
    )
    assert result.status is ExecStatus.COMPLETED
    assert passed(result) == [True, False, True]
    assert "AssertionError" in result.tests[1].error
    assert "seen 2" in result.stdout


def test_a_judge_stuck_in_its_own_test_code_has_reported_the_tests_before(sandbox_pool):
    """The job times out in a test's own code (a caller's inline test that never returns): the
    tests that ended before it keep their outcomes."""
    result = sandbox_pool.run(
        call_job("def f():\n    return 1\n", "assert f() == 1", "import time\ntime.sleep(60)")
    )
    assert result.status is ExecStatus.TIMEOUT
    assert passed(result) == [True]


def test_a_program_that_signals_itself_is_killed_by_that_signal(sandbox_pool):
    """The zygote forks with clone(CLONE_PARENT), not glibc's fork: the child's raise() and a
    thread it starts still work on itself (glibc's cached thread id is the zygote's)."""
    program = (
        "import os, signal, threading\n"
        "def f(kind):\n"
        "    if kind == 'thread':\n"
        "        seen = []\n"
        "        worker = threading.Thread(target=seen.append, args=(os.getpid(),))\n"
        "        worker.start(); worker.join()\n"
        "        return seen == [os.getpid()] and os.getppid() == 1\n"
        "    os.abort() if kind == 'abort' else signal.raise_signal(signal.SIGSEGV)\n"
    )
    results = [
        sandbox_pool.run(call_job(program, f"assert f({kind!r})"))
        for kind in ("thread", "abort", "segv")
    ]
    assert [(r.status, r.error) for r in results] == [
        (ExecStatus.COMPLETED, None),
        (ExecStatus.RUNTIME_ERROR, "killed by signal SIGABRT"),
        (ExecStatus.RUNTIME_ERROR, "killed by signal SIGSEGV"),
    ]
    assert passed(results[0]) == [True]


def test_candidate_objects_stay_in_the_candidate(sandbox_pool):
    program = (
        "class Pair:\n"
        "    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "    def __eq__(self, other):\n        return True\n"
        "def longest(pairs):\n    return max(p.b - p.a for p in pairs)\n"
        "def always():\n    return Pair(0, 0)\n"
        "def check(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    )
    setup = "\n".join(f"{n} = __remote__('{n}')" for n in ("Pair", "longest", "always", "check"))
    result = sandbox_pool.run(
        call_job(
            program,
            "assert longest([Pair(1, 5), Pair(2, 3)]) == 4",  # references travel as arguments
            "assert Pair(1, 2).b == 2",  # attribute access is remote, the value is plain
            "assert always() == 'anything'",  # an always-equal object is only a reference here
            "try:\n    check(-1)\n    raise AssertionError('no error')\nexcept ValueError:\n    pass",
            setup=setup,
        )
    )
    assert passed(result) == [True, True, False, True]


def test_syntax_and_load_errors(sandbox_pool):
    result = sandbox_pool.run(call_job("def f(:\n", "assert True"))
    assert result.status is ExecStatus.SYNTAX_ERROR
    assert "SyntaxError" in result.error
    result = sandbox_pool.run(call_job("raise RuntimeError('boom')\n", "assert True"))
    assert result.status is ExecStatus.RUNTIME_ERROR
    assert "boom" in result.error


@pytest.mark.parametrize(
    ("program", "status", "limit_s"),
    [
        (
            "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "def f():\n    while True:\n        pass\n",
            ExecStatus.TIMEOUT,
            FAST.wall_time_s,
        ),
        ("import time\ndef f():\n    time.sleep(60)\n", ExecStatus.TIMEOUT, FAST.wall_time_s),
        ("def f():\n    x = bytearray(1 << 30)\n", ExecStatus.MEMORY_LIMIT, FAST.wall_time_s),
        (
            "def f():\n    while True:\n        print('x' * 10000)\n",
            ExecStatus.OUTPUT_LIMIT,
            FAST.wall_time_s,
        ),
    ],
    ids=["spin", "sleep", "memory", "flood"],
)
def test_limits_end_the_job_with_the_right_status(sandbox_pool, program, status, limit_s):
    started = time.monotonic()
    result = sandbox_pool.run(call_job(program, "f()"))
    assert result.status is status, result
    # the wall limit does not count time spent waiting for a CPU (this machine may be busy)
    assert time.monotonic() - started < limit_s * sandbox_pool.config.wall_stretch + 1.5


def test_io_mode_returns_stdout_per_case(sandbox_pool):
    job = Job(
        program="import sys\nn = int(sys.stdin.read())\nprint(n * n)\nsys.exit(n % 2)\n",
        stdin_cases=("3\n", "4\n"),
        limits=FAST,
    )
    result = sandbox_pool.run(job)
    assert [case.stdout for case in result.cases] == ["9\n", "16\n"]
    assert [case.exit_code for case in result.cases] == [1, 0]
    assert [case.status for case in result.cases] == [
        ExecStatus.RUNTIME_ERROR,
        ExecStatus.COMPLETED,
    ]
    big = "1\n" * 200_000  # more than a pipe buffer
    result = sandbox_pool.run(
        Job(program="import sys\nprint(len(sys.stdin.read()))\n", stdin_cases=(big,), limits=FAST)
    )
    assert result.cases[0].stdout == f"{len(big)}\n"


def test_io_files_go_in_before_each_case_and_come_back_after(sandbox_pool):
    program = (
        "import os, sys\n"
        "data = open('in/data.txt').read()\n"
        "print(data.upper() + sys.stdin.read())\n"
        "open('out.txt', 'w').write(data + '!')\n"
        "os.mkfifo('fifo')\n"  # opening it must not block the read-back
        "os.mkdir('folder')\n"  # named, and the other files still come back
        "os.symlink('/proc/1/environ', 'root-only')\n"  # read as the sandbox user: refused
        "open('big', 'wb').write(b'x' * 5000)\n"
        "os.remove('in/data.txt')\n"
    )
    job = Job(
        program=program,
        stdin_cases=("a", "b"),
        limits=Limits(wall_time_s=2.0, cpu_time_s=2.0, output_bytes=4000),
        files={"in/data.txt": b"abc"},
        fetch_files=("out.txt", "fifo", "folder", "root-only", "missing", "big", "in/data.txt"),
    )
    result = sandbox_pool.run(job)
    assert [case.stdout for case in result.cases] == ["ABCa\n", "ABCb\n"]
    for case in result.cases:  # the second case found the input again, not the first's files
        assert case.status is ExecStatus.COMPLETED, case
        assert case.files == {"out.txt": b"abc!"}
        assert "left out: big" in case.stderr
        assert "fetch_files: not regular files, left out: fifo, folder" in case.stderr


def test_io_files_at_a_time_limit_are_those_left_then(sandbox_pool):
    program = "import time\nopen('partial', 'w').write('so far')\ntime.sleep(30)\n"
    job = Job(
        program=program,
        stdin_cases=("",),
        limits=Limits(wall_time_s=1.0, cpu_time_s=1.0),
        fetch_files=("partial",),
    )
    (case,) = sandbox_pool.run(job).cases
    assert case.status is ExecStatus.TIMEOUT
    assert case.files == {"partial": b"so far"}


@pytest.mark.parametrize(
    ("files", "fetch", "message"),
    [
        ({"/etc/passwd": b""}, (), "must be relative"),
        ({}, ("../work2/x",), "must be relative"),
        ({"a": b"", "a/b": b""}, (), "inside file 'a'"),
        ({"a/" * 150_000 + "f": b""}, (), "over 4096"),  # once quadratic: hours at 16 MB
        ({}, ("a/" * 100 + "f",), "over 64 parts deep"),
        ({}, ("x" * 256,), "a part over 255 bytes"),
        ({}, ("x",) * 1025, "1025 paths, over the limit of 1024"),
        ({"\ud800": b""}, (), "cannot be encoded as UTF-8"),
    ],
)
def test_job_file_paths_stay_in_the_working_directory(files, fetch, message):
    started = time.monotonic()
    with pytest.raises(ValueError, match=message):
        Job(program="", stdin_cases=("",), files=files, fetch_files=fetch)
    assert time.monotonic() - started < 0.1


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"program": "print('\ud800')"}, "program"),
        ({"stdin_cases": ("ok", "\udfff")}, "stdin_cases[1]"),
        ({"judge": JudgeSpec(setup="x = '\ud800'", tests=("pass",)), "stdin_cases": None}, "judge"),
    ],
)
def test_text_that_cannot_be_encoded_never_reaches_a_container(fields, name):
    with pytest.raises(ValueError, match=rf"{re.escape(name)}.*cannot be encoded as UTF-8"):
        Job(**{"program": "", "stdin_cases": ("",), **fields})


def test_a_job_ends_at_its_whole_time_limit(sandbox_pool):
    program = "import time\ntime.sleep(0.4)\nprint(input())\n"
    limits = Limits(wall_time_s=2.0, cpu_time_s=2.0, job_time_s=1.5)
    job = Job(program=program, stdin_cases=tuple(map(str, range(40))), limits=limits)
    started = time.monotonic()
    result = sandbox_pool.run(job)
    took = time.monotonic() - started
    statuses = [case.status for case in result.cases]
    assert statuses[-1] is ExecStatus.TIMEOUT and len(statuses) < 6, result
    assert "the job's time over 1.5 s" in result.cases[-1].stderr
    assert took < 1.5 + 2.0, took  # the limit, and the round trip on a busy host


def test_a_judge_that_dies_gives_no_verdict_and_costs_no_container():
    with SandboxPool(PoolConfig(size=1)) as single:
        (container,) = single._live
        died = single.run(call_job("def f():\n    pass\n", "f()", setup="import os\nos._exit(3)"))
        assert died.status is ExecStatus.SANDBOX_ERROR and died.attempts == 1, died
        assert "the judge exited with status 3" in died.error
        after = single.run(call_job("def f(x):\n    return x\n", "assert f(1) == 1"))
        assert passed(after) == [True] and single._live == {container}


def test_syntax_errors_read_as_python_prints_them(sandbox_pool):
    (case,) = sandbox_pool.run(Job(program="def f(:\n", stdin_cases=("",), limits=FAST)).cases
    assert case.status is ExecStatus.SYNTAX_ERROR
    assert case.stderr.startswith('  File "<candidate>", line 1')
    assert "SyntaxError" in case.stderr
    assert "runner" not in case.stderr


def test_nothing_persists_between_executions(sandbox_pool):
    leave = call_job(
        "import os, subprocess\n"
        "open('/tmp/left', 'w').write('x')\nopen('left', 'w').write('x')\n"
        "subprocess.Popen(['sleep', '100'], start_new_session=True)\n"
        "def f():\n    return True\n",
        "assert f()",
    )
    look = call_job(
        "import os\n"
        "def f():\n"
        "    uid_line = f'Uid:\\t{os.getuid()}\\t'\n"
        "    others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()\n"
        "              and uid_line in open(f'/proc/{p}/status').read()]\n"
        "    return [os.listdir('/tmp'), os.listdir('.'), others]\n",
        "assert f() == [[], [], []], f()",
    )
    for _ in range(2):  # several containers: make every one of them see a leftover
        assert all(r.tests[0].passed for r in sandbox_pool.map([leave] * 4))
        results = list(sandbox_pool.map([look] * 8))
        assert all(r.tests[0].passed for r in results), [r.tests[0].error for r in results]


def test_many_in_flight_with_asyncio(sandbox_pool):
    jobs = [call_job(f"def f():\n    return {i}\n", f"assert f() == {i}") for i in range(40)]

    async def run_all():
        return await asyncio.gather(*(sandbox_pool.arun(job) for job in jobs))

    results = asyncio.run(run_all())
    assert all(r.tests[0].passed for r in results)


def test_a_dead_container_is_replaced_and_the_job_retried():
    client = docker.from_env()
    # Only this pool's container dies: other pools on this engine (this process's, other
    # users') are none of this test's business.
    this_process = {"label": f"codepost.owner={socket.gethostname()}:{os.getpid()}"}
    others = {c.id for c in client.containers.list(filters=this_process, sparse=True)}
    with SandboxPool(PoolConfig(size=1)) as pool:
        job = call_job(
            "import time\ndef f():\n    time.sleep(1.0)\n    return 1\n", "assert f() == 1"
        )
        future = pool.submit(job)
        time.sleep(0.4)
        mine = [
            c
            for c in client.containers.list(filters=this_process, sparse=True)
            if c.id not in others
        ]
        assert len(mine) == 1
        threading.Thread(target=lambda: [c.kill() for c in mine]).start()
        result = future.result(timeout=60)
    assert result.status is ExecStatus.COMPLETED
    assert result.attempts >= 2
    assert passed(result) == [True]


def test_a_job_that_breaks_a_container_started_for_it_is_the_programs_failure(monkeypatch):
    """The first break may be the infrastructure's, and the job is retried in a new container;
    a second one is the program's doing: a runtime_error, never a sandbox_error (which a
    training run leaves out of its rewards)."""
    with SandboxPool(PoolConfig(size=1, max_attempts=3)) as pool:
        started = []
        real_init, real_request = pool_module._Container.__init__, pool_module._Container.request

        def counted_init(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            started.append(self)

        def breaks_on_run(self, message, *args, **kwargs):
            if message["op"] == "run":
                raise pool_module._ContainerFault("the stream closed mid-job")
            return real_request(self, message, *args, **kwargs)

        monkeypatch.setattr(pool_module._Container, "__init__", counted_init)
        monkeypatch.setattr(pool_module._Container, "request", breaks_on_run)
        result = pool.run(call_job("def f():\n    return 1\n", "assert f() == 1"))
    assert result.status is ExecStatus.RUNTIME_ERROR and result.attempts == 2, result
    assert "broke 2 sandbox containers" in result.error and len(started) == 1


def test_dead_engine_and_missing_image_are_named():
    with pytest.raises(SandboxUnavailable, match=r"nonexistent\.sock"):
        SandboxPool(PoolConfig(docker_hosts=("unix:///nonexistent.sock",))).start()
    with pytest.raises(SandboxUnavailable, match=r"codepost-sandbox:no-such-tag"):
        SandboxPool(PoolConfig(image="codepost-sandbox:no-such-tag")).start()


def test_an_image_built_from_other_runner_code_is_refused(monkeypatch):
    """An old supervisor would skip what it does not know (a job's files): never use one."""
    monkeypatch.setattr(pool_module, "source_version", lambda: "0123456789abcdef")
    mine = {"label": f"codepost.owner={socket.gethostname()}:{os.getpid()}"}
    client = docker.from_env()
    before = {c.id for c in client.containers.list(all=True, filters=mine, sparse=True)}
    with pytest.raises(SandboxUnavailable, match=r"other runner code .*scripts/setup\.sh"):
        SandboxPool(PoolConfig(size=1)).start()
    after = {c.id for c in client.containers.list(all=True, filters=mine, sparse=True)}
    assert after <= before  # the refused container was removed (others may be going away)


def test_several_docker_hosts_back_one_pool():
    hosts = ("unix:///var/run/docker.sock", "unix:///run/docker.sock")
    with SandboxPool(PoolConfig(size=2, docker_hosts=hosts)) as pool:
        results = list(pool.map([call_job("def f():\n    return 1\n", "assert f() == 1")] * 6))
    assert all(r.tests[0].passed for r in results)


def test_close_cancels_queued_jobs_instead_of_running_them():
    pool = SandboxPool(PoolConfig(size=1)).start()
    slow = call_job("import time\ndef f():\n    time.sleep(0.5)\n", "f()")
    futures = [pool.submit(slow) for _ in range(20)]
    time.sleep(0.2)
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 5
    assert sum(future.cancelled() for future in futures) >= 18
    assert futures[0].result().status is ExecStatus.COMPLETED


def test_honest_programs_can_use_threads_under_the_default_limits(sandbox_pool):
    program = (  # all alive at once: each reserves stack and malloc arena address space
        "import threading\n"
        "def f(n):\n"
        "    go = threading.Event()\n"
        "    threads = [threading.Thread(target=go.wait) for _ in range(n)]\n"
        "    for t in threads:\n        t.start()\n"
        "    alive = threading.active_count() - 1\n"
        "    go.set()\n"
        "    for t in threads:\n        t.join()\n"
        "    return alive\n"
    )
    job = Job(
        program=program, judge=JudgeSpec(setup="f = __remote__('f')", tests=("assert f(24) == 24",))
    )
    assert passed(sandbox_pool.run(job)) == [True]


def _killed_pool_owner(kill_its_guard: bool) -> str:
    """Start a process with a pool, SIGKILL it (and its guard): the label of its containers."""
    import signal
    import subprocess
    import sys

    code = (
        "from codepost.sandbox import PoolConfig, SandboxPool\n"
        "pool = SandboxPool(PoolConfig(size=1)).start()\n"
        "print('ready', flush=True)\n"
        "import time; time.sleep(300)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        guards = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "owner_guard.py" in " ".join(p.info["cmdline"] or ())
            and str(owner.pid) in (p.info["cmdline"] or ())
        ]
        assert len(guards) == 1, guards  # one per process and Docker host
        if kill_its_guard:
            guards[0].kill()
            assert wait_until(lambda: gone(guards[0].pid), 10)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    finally:
        if owner.poll() is None:
            owner.kill()
    return f"codepost.owner={socket.gethostname()}:{owner.pid}"


def test_the_containers_of_a_killed_process_are_removed_when_it_dies():
    """A SIGKILLed stage worker's containers ran on until the next run's pool (minutes)."""
    label = _killed_pool_owner(kill_its_guard=False)
    client = docker.from_env()
    assert wait_until(lambda: client.containers.list(all=True, filters={"label": label}) == [], 20)


def test_the_containers_of_a_killed_process_and_guard_are_removed_by_the_next_pool():
    label = _killed_pool_owner(kill_its_guard=True)
    client = docker.from_env()
    assert len(client.containers.list(filters={"label": label})) == 1  # left running
    with SandboxPool(PoolConfig(size=1)):
        assert client.containers.list(filters={"label": label}) == []


def mine(client: docker.DockerClient) -> set[str]:
    """The ids of the containers this process's pools own, stopped ones too."""
    label = f"{pool_module.OWNER_LABEL}={socket.gethostname()}:{os.getpid()}"
    return {c.id for c in client.containers.list(all=True, filters={"label": label})}


def test_a_container_that_fails_its_first_ping_is_removed(monkeypatch):
    pinged = []

    def no_pong(self, *args, **kwargs):
        pinged.append(self.container.id)
        raise pool_module._ContainerFault("no pong")

    monkeypatch.setattr(pool_module._Container, "request", no_pong)
    with pytest.raises(SandboxUnavailable, match="no pong"):
        SandboxPool(PoolConfig(size=1)).start()
    assert len(pinged) == 1 and pinged[0] not in mine(docker.from_env())


def test_a_paused_container_is_replaced_long_before_its_deadline():
    """Its host deadline is 70 s (20 s x 3 + 10 s); its silence gives it away in 10 s."""
    client = docker.from_env()
    limits = Limits(wall_time_s=20.0, cpu_time_s=20.0, memory_mb=256)
    job = call_job(
        "import time\ndef f():\n    time.sleep(1.0)\n    return 1\n",
        "assert f() == 1",
        limits=limits,
    )
    before = mine(client)
    with SandboxPool(PoolConfig(size=1)) as pool:
        (paused,) = [client.containers.get(cid) for cid in mine(client) - before]
        future = pool.submit(job)
        time.sleep(0.5)
        paused.pause()
        started = time.monotonic()
        result = future.result(timeout=40)
        took = time.monotonic() - started
        assert paused.id not in mine(client)
    assert result.status is ExecStatus.COMPLETED and passed(result) == [True], result
    assert result.attempts == 2 and took < 25, (result.attempts, took)


def test_a_job_over_the_frame_limit_is_a_sandbox_error_at_once(sandbox_pool):
    """It used to cost three host deadlines and three containers (issue 17, class 4)."""
    huge = Job(program="print(len(input()))\n", stdin_cases=("1" * (65 << 20),), limits=FAST)
    started = time.monotonic()
    result = sandbox_pool.run(huge)
    assert time.monotonic() - started < 5
    assert result.status is ExecStatus.SANDBOX_ERROR and result.attempts == 1
    assert "over the sandbox's limit" in result.error
    small = Job(program="print(len(input()))\n", stdin_cases=("1" * 1000,), limits=FAST)
    assert sandbox_pool.run(small).cases[0].stdout == "1000\n"


def test_io_stops_at_the_first_failed_case_when_asked(sandbox_pool):
    program = "import time\ntime.sleep(int(input()))\n"
    limits = Limits(wall_time_s=1.0, cpu_time_s=1.0, memory_mb=256)
    job = Job(program=program, stdin_cases=("5\n",) * 4, limits=limits, stop_at_failure=True)
    started = time.monotonic()
    result = sandbox_pool.run(job)
    assert [case.status for case in result.cases] == [ExecStatus.TIMEOUT]
    assert time.monotonic() - started < 3.5  # 4 cases took one wall limit each


def test_containers_keep_no_log_of_the_replies():
    """Every reply reached Docker's json-file log: a disk filled over a training run, and
    dockerd's CPU per job (0.7 ms); the supervisor's errors reach the host in its replies."""
    client = docker.from_env()
    before = mine(client)
    limits = Limits(wall_time_s=5.0, cpu_time_s=5.0, output_bytes=4 << 20)
    loud = Job(program="print('x' * (3 << 20))\n", stdin_cases=("",), limits=limits)
    with SandboxPool(PoolConfig(size=1)) as pool:
        (container,) = [client.containers.get(cid) for cid in mine(client) - before]
        assert pool.run(loud).cases[0].status is ExecStatus.COMPLETED
        container.reload()
        assert container.attrs["HostConfig"]["LogConfig"]["Type"] == "none"
        assert not container.attrs["LogPath"] or not os.path.exists(container.attrs["LogPath"])


LOOK_AROUND = (
    "import os\n"
    "print(sorted(os.listdir('/tmp')))\n"
    "print([line.split()[-1] for line in open('/proc/net/unix').read().splitlines()[1:]"
    " if len(line.split()) > 7])\n"
)


def test_a_local_engines_containers_talk_over_their_supervisors_socket_which_no_program_sees():
    """Frames go past dockerd and containerd's shim; the socket the supervisor listened on
    until the host connected is gone before the first job."""
    with SandboxPool(PoolConfig(size=1)) as pool:
        (container,) = pool._live
        assert not container.demux and container.sock.family == socket.AF_UNIX
        result = pool.run(Job(program=LOOK_AROUND, stdin_cases=("",), limits=FAST))
        called = pool.run(call_job("def f():\n    return 1\n", "assert f() == 1"))
    assert result.cases[0].stdout == "[]\n[]\n", result
    assert passed(called) == [True]


def test_a_host_that_cannot_reach_the_supervisors_socket_uses_the_attached_stream(monkeypatch):
    """As a remote engine's host, or one not root: its next frame, on stdin, tells the
    supervisor to stay there; the same results, and the socket gone all the same."""
    monkeypatch.setattr(pool_module, "_is_local", lambda client: False)
    with SandboxPool(PoolConfig(size=1)) as pool:
        (container,) = pool._live
        assert container.demux
        result = pool.run(Job(program=LOOK_AROUND, stdin_cases=("",), limits=FAST))
        called = list(pool.map([call_job("def f():\n    return 1\n", "assert f() == 1")] * 3))
    assert result.cases[0].stdout == "[]\n[]\n", result
    assert [passed(result) for result in called] == [[True]] * 3
