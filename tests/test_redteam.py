"""Red team: hostile samples through the verifier, against one shared sandbox pool, for real.

No cheat may pass or earn reward, every attack must end within its limit with the right status
(never ``sandbox_error``, never a retry), nothing one program leaves behind may reach the next,
and honest solutions must still pass right after, in the same pool. The samples are in one
module per class of attack (``tests/redteam_*.py``; the shared parts in ``redteam_samples``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Sequence

import pytest
from redteam_cheats import (
    CHEATS,
)
from redteam_checkers import (
    CHECKED_HONEST,
    CHECKER_ATTACKS,
    SPLIT,
)
from redteam_cpp import (
    CPP_ATTACKS,
    CPP_CHECKED_HONEST,
    CPP_CHECKER_ATTACKS,
    CPP_HONEST,
    CPP_LEAVER,
    SPLIT_CPP,
)
from redteam_forms import (
    FORM_ATTACKS,
)
from redteam_javascript import JS_ATTACKS, JS_HONEST, JS_LEAVER
from redteam_resources import (
    AVAILABILITY_ATTACKS,
    IO_ATTACKS,
    POOL_BREAKERS,
    RESOURCE_ATTACKS,
)
from redteam_samples import (
    ADD,
    HONEST,
    LEFTOVERS,
    NOT_PASSED,
    PROBLEMS,
    SQUARE,
    TIMEOUT,
    Attack,
)
from redteam_state import (
    CHECKER,
    JUDGE_CACHE_ATTACKER,
    JUDGE_CACHE_TESTS,
    LARGE_RESULT,
    LARGE_RESULT_TESTS,
    LEAVERS,
    STATE_ATTACKS,
    STATE_VICTIM,
    state_attacker,
)

from codepost.sandbox import (
    ExecStatus,
    ExecutionResult,
    Job,
    JudgeSpec,
    Limits,
    PoolConfig,
    SandboxPool,
    SandboxUnavailable,
)
from codepost.verifiers import Verdict, Verifier

pytestmark = pytest.mark.docker

ATTACKS = (
    CHEATS + RESOURCE_ATTACKS + IO_ATTACKS + AVAILABILITY_ATTACKS + POOL_BREAKERS + FORM_ATTACKS
)

POOL_SIZE = 2
LIMITS = Limits(
    wall_time_s=2.0, cpu_time_s=2.0, memory_mb=256, output_bytes=64_000, processes=16, disk_mb=16
)
MARGIN_S = 1.5  # start-up, sweep and transfer on top of the wall limit
HANG_S = 30.0  # past this the host stops waiting: the job hangs the pool


@pytest.fixture(scope="module")
def pool():
    pool = SandboxPool(PoolConfig(size=POOL_SIZE))
    try:
        pool.start()
    except SandboxUnavailable as exc:
        pytest.fail(f"the Docker sandbox is required for the red-team suite: {exc}")
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def verifier(pool):
    return Verifier(pool, limits=LIMITS)


@dataclasses.dataclass(frozen=True)
class Run:
    verdict: Verdict
    result: ExecutionResult
    expected_tests: int  # call mode: tests in the job
    took: float  # seconds, measured on the host

    def describe(self) -> str:
        tests = [(t.name[:40], t.passed, (t.error or "")[:120]) for t in self.result.tests]
        return (
            f"verdict={self.verdict.status.value} reward={self.verdict.reward} "
            f"sandbox={self.result.status.value} took={self.took:.2f}s "
            f"attempts={self.result.attempts} error={(self.result.error or '')[:300]!r} "
            f"tests={tests} cases={[(c.status.value, c.exit_code) for c in self.result.cases]} "
            f"stdout={self.result.stdout[:200]!r} stderr={self.result.stderr[-300:]!r}"
        )


def run_samples(
    pool: SandboxPool, verifier: Verifier, samples: Sequence[dict], limits: Limits | None = None
) -> list[Run]:
    """The verifier's jobs, all in flight at once, each timed (from before the code is
    extracted on the host) and bounded by HANG_S."""
    started = time.monotonic()
    prepared = verifier.prepare(PROBLEMS, samples)
    jobs = [
        item.job if limits is None else dataclasses.replace(item.job, limits=limits)
        for item in prepared
    ]
    futures = [pool.submit(job) for job in jobs]
    runs = []
    for item, job, future in zip(prepared, jobs, futures, strict=True):
        try:
            result = future.result(timeout=max(0.0, started + HANG_S - time.monotonic()))
        except concurrent.futures.TimeoutError:
            pytest.fail(f"no result after {HANG_S:.0f} s: the job hangs the pool")
        took = time.monotonic() - started
        expected = len(job.judge.tests) if job.judge else 0
        runs.append(Run(verifier.finish(item, result), result, expected, took))
    return runs


def limits_for(attack: Attack) -> Limits:
    return dataclasses.replace(
        LIMITS,
        wall_time_s=attack.wall_time_s or LIMITS.wall_time_s,
        cpu_time_s=attack.cpu_time_s or LIMITS.cpu_time_s,
    )


def honest_run_fails(pool: SandboxPool, verifier: Verifier, task_id: str) -> str | None:
    """Run the canonical solution; None when it passes, else what went wrong."""
    sample = {"task_id": task_id, "completion": PROBLEMS[task_id].canonical_solution}
    (run,) = run_samples(pool, verifier, [sample])
    return None if run.verdict.passed and run.result.attempts == 1 else run.describe()


@pytest.mark.parametrize("attack", ATTACKS, ids=[attack.id for attack in ATTACKS])
def test_attack_is_contained(pool, verifier, attack):
    limits = limits_for(attack)
    (run,) = run_samples(pool, verifier, [attack.sample], limits)
    verdict, result = run.verdict, run.result
    print(f"{attack.id}: {verdict.status.value} in {run.took:.2f} s")
    broken = []
    if verdict.status.value not in attack.expect:
        broken.append(f"status {verdict.status.value!r}, expected {sorted(attack.expect)}")
    if verdict.reward != 0.0:
        broken.append(f"reward {verdict.reward}")
    if sum(test.passed for test in verdict.tests) > attack.max_passed:
        broken.append(f"tests passed: {[t.name for t in verdict.tests if t.passed]}")
    # the wall limit does not count time spent waiting for a CPU (this machine may be busy)
    longest = limits.wall_time_s * pool.config.wall_stretch + MARGIN_S
    if run.took > longest:
        broken.append(f"took {run.took:.2f} s, at most {longest} s")
    if result.attempts != 1:
        broken.append(f"needed {result.attempts} attempts: the attack broke its container")
    if run.expected_tests and len(result.tests) > run.expected_tests:
        broken.append(f"{len(result.tests)} test results for {run.expected_tests} tests")
    if (
        run.expected_tests
        and result.status is ExecStatus.COMPLETED
        and len(result.tests) < run.expected_tests
    ):
        broken.append(
            f"sandbox says completed after {len(result.tests)} of {run.expected_tests} tests"
        )
    after = honest_run_fails(pool, verifier, attack.problem.task_id)
    if after is not None:
        broken.append(f"the canonical solution right after failed: {after}")
    assert not broken, f"{attack.id}: {'; '.join(broken)}\n{run.describe()}"


CPP_LIMITS = dataclasses.replace(LIMITS, compile_time_s=5.0)
IO_ATTACKS = CPP_ATTACKS + JS_ATTACKS
IO_HONEST = {"cpp": CPP_HONEST, "javascript": JS_HONEST}
IO_LEAVERS = {"cpp": CPP_LEAVER, "javascript": JS_LEAVER}


def run_io(
    pool: SandboxPool,
    verifier: Verifier,
    program: str,
    language: str,
    limits: Limits = CPP_LIMITS,
) -> Run:
    """A program in ``language`` through the verifier: a sample answering the io problem
    SQUARE (stdin 7, print 49), timed and bounded by HANG_S."""
    sample = {"task_id": SQUARE.task_id, "completion": program, "language": language}
    (run,) = run_samples(pool, verifier, [sample], limits)
    return run


@pytest.mark.parametrize("attack", IO_ATTACKS, ids=[attack.id for attack in IO_ATTACKS])
def test_an_attack_in_another_language_is_contained(pool, verifier, attack):
    limits = dataclasses.replace(CPP_LIMITS, compile_time_s=attack.compile_time_s)
    run = run_io(pool, verifier, attack.program, attack.language, limits)
    status = run.verdict.status.value
    print(f"{attack.id}: {status} in {run.took:.2f} s")
    broken = []
    if status not in attack.expect:
        broken.append(f"status {status!r}, expected {sorted(attack.expect)}")
    if run.verdict.reward != 0.0:
        broken.append(f"reward {run.verdict.reward}")
    stretch = pool.config.wall_stretch
    longest = (limits.compile_time_s + limits.wall_time_s) * stretch + MARGIN_S
    if run.took > longest:
        broken.append(f"took {run.took:.2f} s, at most {longest} s")
    if run.result.attempts != 1:
        broken.append(f"needed {run.result.attempts} attempts: the attack broke its container")
    after = run_io(pool, verifier, IO_HONEST[attack.language], attack.language)
    if not after.verdict.passed or after.result.attempts != 1:
        broken.append(f"the honest program right after failed: {after.describe()}")
    assert not broken, f"{attack.id}: {'; '.join(broken)}\n{run.describe()}"


@pytest.mark.parametrize("language", list(IO_LEAVERS))
def test_nothing_a_program_in_another_language_leaves_reaches_the_next_program(
    pool, verifier, language
):
    """The language's leaver on every container, then the checker on every container (each
    job is slow enough that no container takes two)."""
    leaver = IO_LEAVERS[language]
    with concurrent.futures.ThreadPoolExecutor(POOL_SIZE) as threads:
        left = list(
            threads.map(lambda _: run_io(pool, verifier, leaver, language), range(POOL_SIZE))
        )
    assert all(run.verdict.passed for run in left), [run.describe() for run in left]
    check = {"task_id": LEFTOVERS.task_id, "completion": f"```python\n{CHECKER}```\n"}
    checked = run_samples(pool, verifier, [check] * POOL_SIZE)
    leftovers = [run.describe() for run in checked if not run.verdict.passed]
    assert not leftovers, leftovers


@pytest.mark.parametrize("name", list(HONEST))
def test_correct_solution_passes(pool, verifier, name):
    (run,) = run_samples(pool, verifier, [HONEST[name]])
    assert run.verdict.passed and run.result.attempts == 1, run.describe()
    assert run.took <= LIMITS.wall_time_s + MARGIN_S, run.describe()


def test_canonical_solutions_still_pass_in_the_same_pool(pool, verifier):
    samples = [
        {"task_id": task_id, "completion": problem.canonical_solution}
        for task_id, problem in PROBLEMS.items()
    ] * POOL_SIZE
    failed = [
        run.describe()
        for run in run_samples(pool, verifier, samples)
        if not (run.verdict.passed and run.result.attempts == 1)
    ]
    assert not failed, failed


@pytest.mark.parametrize("kind", list(LEAVERS))  # in order: some leftovers stay for good
def test_nothing_reaches_the_next_program(pool, verifier, kind):
    """A leaver on every container, then a checker on every container (each job is slow
    enough that no container takes two)."""
    leave = {"task_id": ADD.task_id, "completion": f"```python\n{LEAVERS[kind]}```\n"}
    check = {"task_id": LEFTOVERS.task_id, "completion": f"```python\n{CHECKER}```\n"}
    left = run_samples(pool, verifier, [leave] * POOL_SIZE)
    assert all(run.verdict.passed for run in left), [run.describe() for run in left]
    checked = run_samples(pool, verifier, [check] * POOL_SIZE)
    leftovers = [run.describe() for run in checked if not run.verdict.passed]
    assert not leftovers, leftovers


@pytest.fixture
def one_container():
    """A pool of one container of its own: the attacker and its victim share it."""
    with SandboxPool(PoolConfig(size=1)) as single:
        yield single


def _state(pool: SandboxPool) -> str:
    job = Job(program=STATE_VICTIM, stdin_cases=("",), limits=LIMITS)
    (case,) = pool.run(job).cases
    assert case.status is ExecStatus.COMPLETED, case
    return case.stdout


@pytest.mark.parametrize("kind", list(STATE_ATTACKS))
def test_a_marked_container_is_as_it_was_for_the_next_program(one_container, kind):
    """Attacker, then honest victim, in one container: the victim sees what it saw before."""
    before = _state(one_container)
    attack = Job(program=state_attacker(STATE_ATTACKS[kind]), stdin_cases=("",), limits=LIMITS)
    assert one_container.run(attack).cases[0].status is ExecStatus.COMPLETED
    assert _state(one_container) == before


def test_the_judges_memory_does_not_carry_over(one_container):
    """Exceptions with huge names (the judge makes a class for each), then an honest program
    whose result needs memory in the judge, in one container."""
    limits = dataclasses.replace(LIMITS, wall_time_s=20.0, cpu_time_s=20.0, memory_mb=512)

    def call(program: str, tests: tuple[str, ...]) -> ExecutionResult:
        judge = JudgeSpec(setup="f = __remote__('f')", tests=tests)
        return one_container.run(Job(program=program, judge=judge, limits=limits))

    assert call(LARGE_RESULT, LARGE_RESULT_TESTS).tests[0].passed
    call(JUDGE_CACHE_ATTACKER, JUDGE_CACHE_TESTS)
    after = call(LARGE_RESULT, LARGE_RESULT_TESTS)
    assert after.tests and after.tests[0].passed, after


def test_the_suite_is_large_enough():
    assert len(ATTACKS) >= 30
    assert len({attack.id for attack in ATTACKS}) == len(ATTACKS)


# An honest solution that needs this much CPU passes alone within the limits below, but
# shares its core with spinning neighbours when the pool has more containers than the host
# has cores.
NEIGHBOUR_LIMITS = dataclasses.replace(LIMITS, wall_time_s=2.0, cpu_time_s=2.0)
NEEDS_CPU = """
import time


def add(a, b):
    while time.process_time() < 0.5:
        pass
    return a + b
"""
SPINS = """
def add(a, b):
    while True:
        pass
"""


@pytest.mark.slow
def test_spinning_neighbours_cannot_time_out_an_honest_program():
    """Twice as many containers as cores: the others spin to their CPU limit while an honest
    program that needs a quarter of its CPU limit runs beside them. (A wide stretch: this machine may
    be busy with other work too, and the test is about what is counted, not the cap.)"""
    size = 2 * (os.cpu_count() or 1)
    spinner = {"task_id": ADD.task_id, "completion": f"```python\n{SPINS}```\n"}
    honest = {"task_id": ADD.task_id, "completion": f"```python\n{NEEDS_CPU}```\n"}
    with SandboxPool(PoolConfig(size=size, wall_stretch=20.0)) as crowded:
        verifier = Verifier(crowded, limits=NEIGHBOUR_LIMITS)
        runs = run_samples(crowded, verifier, [spinner] * (size - 1) + [honest])
    *spinners, honest_run = runs
    assert honest_run.verdict.passed, honest_run.describe()
    assert all(run.verdict.status.value == TIMEOUT for run in spinners), [
        run.describe() for run in spinners
    ]


def test_a_checker_program_judges_alone(pool):
    """Right answers other than the expected one pass through the checker; nothing a program
    prints or leaves behind (files, a process rewriting them) makes the checker accept."""
    verifier = Verifier(pool, limits=LIMITS)
    problems = {SPLIT.task_id: SPLIT}
    honest = [SPLIT.canonical_solution, *CHECKED_HONEST]
    samples = [{"task_id": SPLIT.task_id, "completion": code} for code in honest]
    samples += [{"task_id": SPLIT.task_id, "completion": code} for code in CHECKER_ATTACKS.values()]
    verdicts = verifier.verify(problems, samples)
    assert [v.status.value for v in verdicts[: len(honest)]] == ["passed"] * len(honest), [
        v.result for v in verdicts
    ]
    for name, verdict in zip(CHECKER_ATTACKS, verdicts[len(honest) :], strict=True):
        assert verdict.status.value in NOT_PASSED and verdict.reward == 0.0, (name, verdict.result)
        assert not any(test.passed for test in verdict.tests), (name, verdict.tests)
    again = verifier.verify(problems, samples[:1])
    assert again[0].passed, again[0].result


def test_cpp_cannot_forge_a_checkers_verdict(pool):
    """A testlib-style C++ checker accepts right answers other than the expected one; no C++
    program's output, exit status, files or processes make it, or the Python checker of the
    same problem, accept; honest programs pass after the attacks, in the same pool."""
    verifier = Verifier(pool, limits=CPP_LIMITS)
    problems = {problem.task_id: problem for problem in (SPLIT, SPLIT_CPP)}
    honest = [
        *({"task_id": SPLIT_CPP.task_id, "completion": code} for code in CPP_CHECKED_HONEST),
        {"task_id": SPLIT.task_id, "completion": CPP_CHECKED_HONEST[0], "language": "cpp"},
    ]
    verdicts = verifier.verify(problems, honest)
    assert all(v.passed for v in verdicts), [v.result for v in verdicts]
    attacks = [
        (name, {"task_id": problem.task_id, "completion": code, "language": "cpp"})
        for name, code in CPP_CHECKER_ATTACKS.items()
        for problem in (SPLIT_CPP, SPLIT)
    ]
    verdicts = verifier.verify(problems, [sample for _, sample in attacks])
    for (name, sample), verdict in zip(attacks, verdicts, strict=True):
        where = (name, sample["task_id"], verdict.result)
        assert verdict.status.value in NOT_PASSED and verdict.reward == 0.0, where
        assert not any(test.passed for test in verdict.tests), where
    victim = {"task_id": SPLIT_CPP.task_id, "completion": SPLIT_CPP.canonical_solution}
    after = verifier.verify(problems, [victim] * (2 * POOL_SIZE) + honest[-1:])
    assert all(v.passed for v in after), [v.result for v in after]
