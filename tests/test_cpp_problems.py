"""C++ problems through the verifier: a problem's (or a sample's) language, fenced C++ blocks,
prompts, C++ references of the schemas, ``compile_error`` verdicts and rewards, testlib-style
C++ checkers, compile limits from every door; then the real sandbox through ``codepost
verify``."""

from __future__ import annotations

import json
from concurrent.futures import Future

import pytest
from fake_executors import CannedExecutor

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.data.prompts import reference_answer
from codepost.pipeline.stages.scoring import ScoreConfig
from codepost.sandbox import CaseOutcome, CompileOutcome, ExecStatus, ExecutionResult, Job, Limits
from codepost.verifiers import (
    Problem,
    ProblemFormatError,
    RewardConfig,
    SampleError,
    Verifier,
    build_program,
    load_problems,
    pass_at_k,
    verify_command,
)
from codepost.verifiers.chat import user_message
from codepost.verifiers.forms.io import (
    TESTLIB_HARNESS,
    CheckerProgram,
    checker_error,
    checker_job,
)
from codepost.verifiers.problems import posed_in
from codepost.verifiers.rewards import format_reward

CPP = '#include <cstdio>\nint main() { int n; std::scanf("%d", &n); std::printf("%d\\n", n); }\n'


def echo_problem(**fields) -> Problem:
    return Problem(
        task_id="echo", prompt="Print n.", io=[{"input": "3\n", "output": "3\n"}], **fields
    )


class Recorder(CannedExecutor):
    """Answers every job with ``result`` and keeps the jobs."""

    def __init__(self, result: ExecutionResult) -> None:
        super().__init__(result)
        self.jobs: list[Job] = []

    def submit(self, job: Job) -> Future[ExecutionResult]:
        self.jobs.append(job)
        return super().submit(job)


def test_a_cpp_answer_is_its_cpp_block_taken_whole():
    answer = (
        "First in Python:\n```python\nprint(input())\n```\nNow C++:\n```c++\n" + CPP + "```\n"
        "and a longer one in another language:\n```rust\nfn main() { /* ... long ... */ }\n```\n"
    )
    program = build_program(echo_problem(language="cpp"), answer, "chat")
    assert (program.source, program.language) == (CPP, "cpp")
    for tag in ("cpp", "cc", "cxx", "CPP"):
        assert build_program(echo_problem(language="cpp"), f"```{tag}\n{CPP}```").source == CPP
    # no block of the language: any block, as for Python; the Python problem keeps its block
    assert build_program(echo_problem(language="cpp"), "```\nint main() {}\n```").source == (
        "int main() {}\n"
    )
    assert build_program(echo_problem(), answer).source == "print(input())\n"


def test_a_problem_names_its_language_and_is_posed_in_another():
    assert echo_problem(language="C++").language == "cpp"  # as data sets write it
    problem = echo_problem(canonical_solution="print(input())\n", references={"c++": CPP})
    cpp = problem.in_language("cpp")
    assert (cpp.language, cpp.canonical_solution) == ("cpp", CPP)
    assert cpp.references == {"python": "print(input())\n"}
    assert cpp.in_language("python") == problem
    call = load_problems("taco-sample")["count-vowels"]
    with pytest.raises(ValueError, match="call tests, which run python programs, not cpp"):
        call.in_language("cpp")
    with pytest.raises(ProblemFormatError, match="call tests"):
        posed_in(load_problems("taco-sample"), "cpp")


def test_a_sample_names_its_language():
    recorder = Recorder(ExecutionResult(ExecStatus.COMPLETED, cases=()))
    verifier = Verifier(recorder)
    problems = {"echo": echo_problem()}
    verifier.verify(
        problems, [{"task_id": "echo", "completion": f"```cpp\n{CPP}```", "language": "c++"}]
    )
    (job,) = recorder.jobs
    assert (job.language, job.program) == ("cpp", CPP)
    call = load_problems("taco-sample")
    with pytest.raises(SampleError, match="sample 0: problem 'count-vowels' has call tests"):
        verifier.prepare(call, [{"task_id": "count-vowels", "completion": "", "language": "cpp"}])
    with pytest.raises(SampleError, match="field 'language'"):
        verifier.prepare(problems, [{"task_id": "echo", "completion": "", "language": 2}])


def test_a_program_that_does_not_compile_is_a_compile_error_of_the_model():
    compiler = (
        "/tmp/main.cpp: In function 'int main()':\n"
        "/tmp/main.cpp:1:21: error: 'missing' was not declared in this scope\n"
    )
    result = ExecutionResult(
        ExecStatus.COMPILE_ERROR,
        error="did not compile: /tmp/main.cpp:1:21: error: 'missing' was not declared",
        compile=CompileOutcome(ExecStatus.COMPILE_ERROR, "", compiler, 1, 0.2),
    )
    rewards = RewardConfig(weights={"test": 1.0, "format": 0.5, "syntax": 0.5})
    verifier = Verifier(CannedExecutor(result), reward_config=rewards)
    sample = {"task_id": "echo", "completion": "```cpp\nint main() { return missing; }\n```"}
    (verdict,) = verifier.verify({"echo": echo_problem(language="cpp")}, [sample])
    assert verdict.status.value == "compile_error" and not verdict.passed
    assert verdict.result.startswith("failed: did not compile: /tmp/main.cpp:1:21: error:")
    assert verdict.stderr == compiler
    # the test term fails (never excluded as a sandbox error would be); syntax is the compiler's
    assert verdict.reward_components == {"test": 0.0, "format": 1.0, "syntax": 0.0}
    assert verdict.reward == 0.5
    scores = pass_at_k([verdict], [1], exclude_sandbox_errors=True)
    assert (scores.scores, scores.excluded) == ({"pass@1": 0.0}, 0)


def test_format_and_syntax_terms_read_the_programs_language():
    assert format_reward(f"```cpp\n{CPP}```", language="cpp") == 1.0
    assert format_reward(f"```python\n{CPP}```", language="cpp") == 0.0
    assert format_reward(f"```cpp\n{CPP}```") == 0.0  # a Python problem asks for python
    passed = ExecutionResult(ExecStatus.COMPLETED, cases=())
    rewards = RewardConfig(weights={"test": 1.0, "syntax": 1.0, "forbidden": 1.0})
    sample = {
        "task_id": "echo",
        "completion": '```cpp\n#include <cstdlib>\nint main() { std::system("x"); }\n```',
    }
    (verdict,) = Verifier(CannedExecutor(passed), reward_config=rewards).verify(
        {"echo": echo_problem(language="cpp")}, [sample]
    )
    assert verdict.reward_components["syntax"] == 1.0  # not parsed as Python
    assert verdict.reward_components["forbidden"] == 0.0  # the forbidden names are Python's


def test_prompts_ask_for_a_cpp_program_in_a_cpp_block():
    problem = echo_problem(language="cpp", canonical_solution=CPP)
    message = user_message(problem)
    assert message.endswith("Answer with the complete C++ program in one ```cpp code block.")
    assert "Read from standard input" in message
    assert reference_answer(problem) == f"```cpp\n{CPP.strip()}\n```"
    assert user_message(echo_problem()).endswith("solution in one ```python code block.")


def test_the_schemas_read_cpp_references_and_languages():
    contests = load_problems("codecontests-sample")
    handshakes = contests["1000_A. Handshakes"]
    assert handshakes.language == "python" and "long long" in handshakes.references["cpp"]
    assert posed_in(contests, "cpp")["1000_A. Handshakes"].canonical_solution.startswith(
        "#include <cstdio>"
    )
    synthetic = load_problems("synthetic1-sample")["synthetic_code_4"]
    assert synthetic.language == "cpp"
    assert synthetic.canonical_solution.startswith("#include <bits/stdc++.h>")  # its cpp block


def test_a_cpp_checker_job_follows_testlibs_convention():
    checker = CheckerProgram(source="int main() {}", language="c++", files={"testlib.h": "//"})
    problem = echo_problem(language="cpp")
    case = problem.io[0]
    job = checker_job(checker, [(case, "é 3\n")], Limits(compile_time_s=3))
    assert job.language == "cpp" and job.limits.compile_time_s == 3
    assert job.program == TESTLIB_HARNESS + "int main() {}"
    assert '"input.txt", "output.txt", "answer.txt"' in TESTLIB_HARNESS  # argv 1, 2, 3
    # input, the program's output, the expected answer; sizes in bytes (é is two)
    assert job.stdin_cases == ("2\n3\n5\né 3\n2\n3\n",)
    assert dict(job.files) == {"testlib.h": b"//"}
    for bad, message in (("../x.h", "relative"), ("answer.txt", "a file the checker reads")):
        with pytest.raises(ValueError, match=message):
            CheckerProgram(source="", language="cpp", files={bad: ""})


@pytest.mark.parametrize(
    ("exit_code", "stderr", "language", "error"),
    [
        (0, "ok", "cpp", None),
        (
            1,
            "wrong answer 3 != 4\n",
            "cpp",
            "the checker rejected the output: wrong answer (wrong answer 3 != 4)",
        ),
        (2, "", "cpp", "the checker rejected the output: presentation error"),
        (
            3,
            "bad jury answer",
            "cpp",
            "the checker rejected the output: the checker failed (bad jury answer)",
        ),
        (5, "", "cpp", "the checker rejected the output (runtime_error)"),
        (-11, "", "cpp", "the checker rejected the output (runtime_error: killed by SIGSEGV)"),
        (
            1,
            "ValueError: x",
            "python",
            "the checker rejected the output (runtime_error: ValueError: x)",
        ),
    ],
)
def test_a_checkers_exit_status_is_read_as_testlibs(exit_code, stderr, language, error):
    status = ExecStatus.COMPLETED if exit_code == 0 else ExecStatus.RUNTIME_ERROR
    outcome = CaseOutcome(status, "", stderr, exit_code, 0.1)
    assert checker_error(outcome, language) == error


def test_compile_limits_reach_the_jobs(tmp_path, monkeypatch):
    assert ScoreConfig(compile_timeout_s=3).limits().compile_time_s == 3
    recorder = Recorder(ExecutionResult(ExecStatus.COMPLETED, cases=()))
    monkeypatch.setattr(verify_command, "Verifier", lambda **options: Verifier(recorder, **options))
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"task_id": "1000_A. Handshakes", "completion": CPP}) + "\n")
    options = ["--problems", "codecontests-sample", "--language", "cpp", "--compile-timeout", "2.5"]
    assert verify_command.main(["verify", str(samples), *options]) == 0
    (job,) = recorder.jobs
    assert (job.language, job.limits.compile_time_s) == ("cpp", 2.5)


def test_a_problem_set_mixes_sources_and_poses_them_in_a_language():
    mixed = load_problem_set(
        ProblemSet(source="taco-sample", more_sources=["cpp-sample", "kodcode-sample"], split="all")
    )
    forms = {problem.test_form for problem in mixed.values()}
    assert forms == {"io", "call", "pytest"}
    assert {p.language for p in mixed.values()} == {"python", "cpp"}
    with pytest.raises(ValueError, match="in an earlier source too"):
        load_problem_set(ProblemSet(source="cpp-sample", more_sources=["cpp-sample"], split="all"))
    cpp = load_problem_set(ProblemSet(source="codecontests-sample", split="all", language="cpp"))
    assert all(p.language == "cpp" and "#include" in p.canonical_solution for p in cpp.values())


# -- the real sandbox


@pytest.mark.docker
def test_cpp_through_codepost_verify(tmp_path):
    """Compile errors, a compile past --compile-timeout, time and memory limits and a fork bomb,
    each with its status and reason; then an honest program in the same run."""
    slow_compile = (  # 4e10 steps of constant evaluation: far past a 2 s compile
        "constexpr long spin() { long s = 0; for (long i = 0; i < 200000; i++)\n"
        "  for (long j = 0; j < 200000; j++) s += i ^ j; return s; }\n"
        "static_assert(spin() != 1);\nint main() {}\n"
    )
    fork_bomb = "#include <unistd.h>\nint main() { for (;;) fork(); }\n"
    hog = (
        "#include <bits/stdc++.h>\nint main() { std::vector<long> v(1L << 30, 1); return v[9]; }\n"
    )
    rows = [
        {
            "task_id": "1000_A. Handshakes",
            "language": "cpp",
            "completion": "int main() { return x; }\n",
        },
        {"task_id": "1000_A. Handshakes", "language": "cpp", "completion": slow_compile},
        {
            "task_id": "1000_A. Handshakes",
            "language": "cpp",
            "completion": "int main() { for (volatile int i = 0;; ) i = i + 1; }\n",
        },
        {"task_id": "1000_A. Handshakes", "language": "cpp", "completion": hog},
        {"task_id": "1000_A. Handshakes", "language": "cpp", "completion": fork_bomb},
        {
            "task_id": "1000_A. Handshakes",
            "language": "cpp",
            "completion": load_problems("codecontests-sample")["1000_A. Handshakes"].references[
                "cpp"
            ],
        },
    ]
    samples, output = tmp_path / "samples.jsonl", tmp_path / "out.jsonl"
    samples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code = verify_command.main(
        [
            "verify",
            str(samples),
            "--problems",
            "codecontests-sample",
            "--output",
            str(output),
            "--workers",
            "2",
            "--timeout",
            "2",
            "--compile-timeout",
            "2",
            "--memory-mb",
            "256",
        ]
    )
    assert code == 0
    got = [json.loads(line) for line in output.read_text().splitlines()]
    statuses = [(row["status"], row["result"][:60]) for row in got]
    assert [status for status, _ in statuses] == [
        "compile_error",
        "compile_error",
        "timeout",
        "memory_limit",
        "timeout",
        "passed",
    ], statuses
    assert "was not declared in this scope" in got[0]["stderr"]
    assert got[1]["result"] == "failed: did not compile: compile time over 2.0 s"
