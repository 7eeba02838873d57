"""What a server of the sandbox pool is configured with (``verify-server``, ``env-server``)."""

from __future__ import annotations

from pydantic import (
    ConfigDict,
    Field,
)

from ..serving import (
    HTTPLimits,
)


class PoolServerConfig(HTTPLimits):
    """What a server of the sandbox pool listens on, how many containers it runs, the limits
    of its jobs, and the problems it accepts inline (``verify-server``, ``env-server``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="address to bind; only this machine by default")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (SandboxFusion's is 8080)")
    workers: int = Field(4, ge=1, description="sandbox containers: jobs running at once")
    max_timeout_s: float = Field(
        60.0, gt=0, description="cap on a request's run time-out and a problem's own time limit"
    )
    max_job_s: float = Field(
        120.0,
        gt=0,
        description="cap on one job's whole time: a program's compile and all its tests or "
        "cases together (a /run_code compile and run)",
    )
    max_memory_mb: int = Field(1024, ge=16, description="cap on a program's memory")
    max_problem_bytes: int = Field(
        1 << 20, ge=1024, description="largest inline problem (its JSON record)"
    )
    max_problem_tests: int = Field(
        1024, ge=1, description="most tests (asserts, cases, test functions) per inline problem"
    )
    max_problem_code_chars: int = Field(
        32 << 10,
        ge=1024,
        description="longest piece of Python code in an inline problem (its test module or "
        "test file, one assert, its setup code, a prompt that is code): parsing it holds the "
        "server's interpreter about 4 us a character, whatever else it serves",
    )
    max_request_code_chars: int = Field(
        1 << 20,
        ge=1024,
        description="Python code parsed to read all the inline problems of one request "
        "together (HumanEval's 164 problems inline: about 250,000 characters); the server "
        "parses one request's at a time, at about 4 us a character",
    )
    shutdown_timeout_s: int = Field(
        120,
        ge=1,
        description="after SIGTERM, how long accepted requests may take to finish before the "
        "server stops anyway (a body being sent slowly would otherwise keep it up)",
    )


class ServerConfig(PoolServerConfig):
    """``verify-server``'s: its pool, and the work it holds at once."""

    max_pending: int = Field(
        256,
        ge=1,
        description="jobs accepted and not answered yet (running or queued); past it, 429 at "
        "once. Keep a trainer's own concurrency (verl's max_concurrent) within it",
    )
    max_code_bytes: int = Field(1 << 20, ge=1, description="largest program of /run_code")
