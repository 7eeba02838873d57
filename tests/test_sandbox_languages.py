"""The sandbox's languages without Docker: the registry, what a Job accepts, the host's deadline
and SandboxFusion's answer for a compiled program (the real runs are in test_sandbox_cpp.py)."""

from __future__ import annotations

import dataclasses

import pytest

from codepost.sandbox import (
    LANGUAGES,
    CaseOutcome,
    CompileOutcome,
    ExecStatus,
    ExecutionResult,
    Job,
    JudgeSpec,
    Limits,
    PoolConfig,
)
from codepost.sandbox import pool as pool_module
from codepost.sandbox.runner import languages
from codepost.verifiers.server.run_code import run_code_response


def test_every_module_of_the_package_registers_its_language():
    assert LANGUAGES == ("cpp", "javascript", "python")
    cpp, python = languages.get("cpp"), languages.get("python")
    assert cpp.compiled and not cpp.in_runner
    assert python.in_runner and not python.compiled
    command = cpp.compile_command(1024)
    assert command[0] == "g++" and "/tmp/main.cpp" in command
    assert f"{languages.OUTPUT_DIR}/main" in command
    assert cpp.run_command("/build/abc", 256) == ["/build/abc/main"]


def test_an_unknown_language_is_refused_naming_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown language 'java': the sandbox runs cpp, javascript, python"
    ):
        Job(program="class Main {}", stdin_cases=("",), language="java")
    with pytest.raises(ValueError, match="registered twice"):
        languages.register(languages.Language(name="cpp", source_file="x.cpp"))


def test_a_judge_calls_into_python_programs_only():
    judge = JudgeSpec(setup="f = __remote__('f')", tests=("assert f() == 1",))
    with pytest.raises(ValueError, match="cpp programs run in io mode"):
        Job(program="int f() { return 1; }", judge=judge, language="cpp")
    assert Job(program="def f():\n    return 1\n", judge=judge).language == "python"


def test_compile_limits_are_validated_like_the_others():
    with pytest.raises(ValueError, match="compile_time_s"):
        Limits(compile_time_s=0)
    with pytest.raises(ValueError, match="compile_memory_mb"):
        Limits(compile_memory_mb=-1)


def test_the_host_waits_for_the_compile_too():
    limits = Limits(wall_time_s=2.0, compile_time_s=5.0)
    config = PoolConfig(wall_stretch=3.0, grace_s=10.0)
    cases = ("1\n", "2\n")
    python = pool_module._job_payload(Job(program="", stdin_cases=cases, limits=limits), config)
    cpp = pool_module._job_payload(
        Job(program="", stdin_cases=cases, limits=limits, language="cpp"), config
    )
    assert pool_module._host_deadline(python, config.grace_s) == 2 * 6.0 + 10.0
    assert pool_module._host_deadline(cpp, config.grace_s) == 15.0 + 2 * 6.0 + 10.0


def test_a_compile_outcome_crosses_from_the_supervisor():
    reply = {
        "status": "compile_error",
        "error": "did not compile: main.cpp:1:1: error: x",
        "cases": [],
        "compile": {
            "status": "compile_error",
            "stdout": "",
            "stderr": "main.cpp:1:1: error: x\n",
            "exit_code": 1,
            "duration_s": 0.5,
        },
    }
    result = pool_module._to_result(reply, attempts=1)
    assert result.status is ExecStatus.COMPILE_ERROR
    assert result.compile == CompileOutcome(
        ExecStatus.COMPILE_ERROR, "", "main.cpp:1:1: error: x\n", 1, 0.5
    )


COMPILED = CompileOutcome(ExecStatus.COMPLETED, "", "main.cpp:3: warning: w\n", 0, 0.8)


@pytest.mark.parametrize(
    ("result", "status", "compile_result", "run_result"),
    [
        (  # compiled, ran, exit 0
            ExecutionResult(
                ExecStatus.COMPLETED,
                cases=(CaseOutcome(ExecStatus.COMPLETED, "49\n", "", 0, 0.01),),
                compile=COMPILED,
            ),
            "Success",
            {"status": "Finished", "return_code": 0, "stderr": "main.cpp:3: warning: w\n"},
            {"status": "Finished", "return_code": 0, "stdout": "49\n"},
        ),
        (  # the compiler refused it: no run_result, as SandboxFusion answers
            ExecutionResult(
                ExecStatus.COMPILE_ERROR,
                compile=CompileOutcome(ExecStatus.COMPILE_ERROR, "", "error: x\n", 1, 0.2),
            ),
            "Failed",
            {"status": "Finished", "return_code": 1, "stderr": "error: x\n"},
            None,
        ),
        (  # the compile ran out of time
            ExecutionResult(
                ExecStatus.COMPILE_ERROR,
                compile=CompileOutcome(ExecStatus.TIMEOUT, "", "", None, 3.0),
            ),
            "Failed",
            {"status": "TimeLimitExceeded", "return_code": None},
            None,
        ),
        (  # compiled, then the run ran out of time
            ExecutionResult(
                ExecStatus.COMPLETED,
                cases=(CaseOutcome(ExecStatus.TIMEOUT, "", "", None, 2.0),),
                compile=COMPILED,
            ),
            "Failed",
            {"status": "Finished", "return_code": 0},
            {"status": "TimeLimitExceeded", "return_code": None},
        ),
        (  # Python: no compile_result
            ExecutionResult(
                ExecStatus.COMPLETED, cases=(CaseOutcome(ExecStatus.COMPLETED, "1\n", "", 0, 0.01),)
            ),
            "Success",
            None,
            {"status": "Finished", "return_code": 0, "stdout": "1\n"},
        ),
    ],
)
def test_run_code_answers_as_sandbox_fusion_does(result, status, compile_result, run_result):
    answer = run_code_response(result, output_bytes=1 << 20)
    assert answer["status"] == status
    assert set(answer) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
    }
    for got, expected in (
        (answer["compile_result"], compile_result),
        (answer["run_result"], run_result),
    ):
        if expected is None:
            assert got is None
            continue
        # SandboxFusion's CommandRunResult: these five fields
        assert set(got) == {"status", "execution_time", "return_code", "stdout", "stderr"}
        assert {k: got[k] for k in expected} == expected


def test_the_output_limit_of_a_compile_reads_as_a_killed_process():
    outcome = CompileOutcome(ExecStatus.OUTPUT_LIMIT, "", "error: x\n" * 10, None, 1.0)
    answer = run_code_response(
        dataclasses.replace(ExecutionResult(ExecStatus.COMPILE_ERROR), compile=outcome), 4096
    )
    assert answer["compile_result"]["return_code"] == -9
    assert "output over 4096 bytes" in answer["compile_result"]["stderr"]
