"""``POST /run_code``: SandboxFusion's schema, for its clients unchanged."""

from __future__ import annotations

import base64
import binascii
import signal
from typing import Any

from fastapi import HTTPException
from pydantic import (
    BaseModel,
    Field,
)

from ...sandbox import (
    LANGUAGES,
    MAX_PATHS,
    CaseOutcome,
    CompileOutcome,
    ExecStatus,
    ExecutionResult,
    Job,
    Limits,
)
from ..languages import canonical_language
from .config import ServerConfig


class RunCodeRequest(BaseModel):
    """SandboxFusion's request; fields it has for other languages (``args``) are ignored."""

    code: str
    language: str
    # The compile's own wall-clock limit (C++; Python compiles as it starts, in run_timeout),
    # held to max_timeout_s on both endpoints: verl sends its one time-out as both limits.
    compile_timeout: float = Field(10, gt=0)
    run_timeout: float = Field(10, gt=0)
    memory_limit_MB: int = -1  # -1: the server's maximum
    stdin: str | None = None
    # path -> base64; None entries are skipped, as there. Any values: a wrong one is named in a
    # 400 by run_code_job, never one validation error per item.
    files: dict[str, Any] = Field({}, max_length=MAX_PATHS)
    fetch_files: list[str] = Field([], max_length=MAX_PATHS)


def run_code_job(request: RunCodeRequest, config: ServerConfig) -> Job:
    """The io job for a request, within the server's caps; 4xx naming what is wrong. A
    language by any of its names (SandboxFusion's ``nodejs`` is ``javascript``)."""
    language = canonical_language(request.language)
    if language not in LANGUAGES:
        raise HTTPException(
            400,
            f"language {request.language!r} is not supported: this server runs "
            f"{', '.join(LANGUAGES)} only",
        )
    size = len(request.code.encode(errors="surrogatepass"))  # Job names what cannot travel
    if size > config.max_code_bytes:
        raise HTTPException(
            413, f"code is {size} bytes, over the server's limit of {config.max_code_bytes}"
        )
    files = {}
    for path, data in request.files.items():
        if data is None:
            continue
        if not isinstance(data, str):
            raise HTTPException(400, f"files[{path!r}]: expected base64 text or null")
        try:
            files[path] = base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise HTTPException(400, f"files[{path!r}]: not base64 ({exc})") from None
    memory = request.memory_limit_MB
    seconds = min(request.run_timeout, config.max_timeout_s)
    limits = Limits(
        wall_time_s=seconds,
        cpu_time_s=seconds,
        memory_mb=config.max_memory_mb if memory <= 0 else min(memory, config.max_memory_mb),
        compile_time_s=min(request.compile_timeout, config.max_timeout_s),
        job_time_s=config.max_job_s,
    )
    try:
        return Job(
            program=request.code,
            stdin_cases=(request.stdin or "",),
            limits=limits,
            files=files,
            fetch_files=tuple(request.fetch_files),
            language=language,
        )
    except ValueError as exc:  # a file path outside the working directory
        raise HTTPException(400, str(exc)) from None


def run_code_response(result: ExecutionResult, output_bytes: int) -> dict[str, Any]:
    """SandboxFusion's answer: Success (it compiled and exited 0), Failed (it did not compile,
    or a non-zero exit or a time limit), or SandboxError (the sandbox itself failed; never the
    program's doing). ``compile_result`` is the compiler's run (compiled languages only);
    ``run_result`` is absent when the program did not compile, as there."""
    compile_result = (
        None if result.compile is None else _command_result(result.compile, output_bytes)
    )
    if result.status is ExecStatus.COMPILE_ERROR:
        return {
            "status": "Failed",
            "message": "",
            "compile_result": compile_result,
            "run_result": None,
            "executor_pod_name": None,
            "files": {},
        }
    if not result.cases:
        message = result.error or "the sandbox returned no result"
        return {
            "status": "SandboxError",
            "message": message,
            "compile_result": compile_result,
            "run_result": {"status": "Error", "stdout": "", "stderr": message},
            "executor_pod_name": None,
            "files": {},
        }
    case = result.cases[0]
    run_result = _command_result(case, output_bytes)
    failed = run_result["status"] == "TimeLimitExceeded" or run_result["return_code"] != 0
    return {
        "status": "Failed" if failed else "Success",
        "message": "",
        "compile_result": compile_result,
        "run_result": run_result,
        "executor_pod_name": None,
        "files": {path: base64.b64encode(data).decode() for path, data in case.files.items()},
    }


def _command_result(outcome: CaseOutcome | CompileOutcome, output_bytes: int) -> dict[str, Any]:
    """SandboxFusion's ``CommandRunResult`` for a run or a compile: Finished with its return
    code (a process stopped for its output: -9, and stderr says why), or TimeLimitExceeded
    without one."""
    stderr, return_code = outcome.stderr, outcome.exit_code
    if outcome.status is ExecStatus.OUTPUT_LIMIT:
        stderr += f"\n[sandbox] output over {output_bytes} bytes: the program was killed\n"
        return_code = -signal.SIGKILL
    elif return_code is None:  # it did not compile (or its files did not fit): Python exits 1
        return_code = 1
    timed_out = outcome.status is ExecStatus.TIMEOUT
    return {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": outcome.duration_s,
        "return_code": None if timed_out else return_code,
        "stdout": outcome.stdout,
        "stderr": stderr,
    }
