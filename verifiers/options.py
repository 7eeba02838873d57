"""How samples are verified, written once: ``codepost verify``'s flags, the fields of
``verify-server``'s ``/verify`` request and the HTTP client's arguments all come from
:class:`VerifyOptions`, so an option added here reaches all three."""

from __future__ import annotations

from pydantic import Field

from ..sandbox import Limits
from ..settings.config import Settings
from .extraction import CompletionStyle
from .rewards import RewardConfig

TOKEN_ENV = "CODEPOST_SERVER_TOKEN"  # verify-server's bearer token


class VerifyOptions(Settings):
    """What a verification of samples may be asked for, wherever it runs."""

    completion_style: CompletionStyle = Field(
        "auto",
        description="continuation: prompt + completion; chat: code from markdown fences; auto: "
        "chat when the completion has fences or <think>",
    )
    timeout: float = Field(
        Limits.wall_time_s,
        gt=0,
        allow_inf_nan=False,
        description="wall and CPU seconds per program",
    )
    compile_timeout: float = Field(
        Limits.compile_time_s,
        gt=0,
        allow_inf_nan=False,
        description="seconds a compiled language's program (C++) may take to compile, once per "
        "job (a server holds it to its max_timeout_s)",
    )
    memory_mb: int = Field(Limits.memory_mb, gt=0, description="memory per program in MB")
    max_tests: int | None = Field(
        None,
        ge=1,
        description="run at most N tests per problem, the longest inputs, as rllm caps "
        "training rewards (null: all)",
    )
    language: str | None = Field(
        None,
        description="pose every problem in this language (cpp: CodeContests' C++ solutions are "
        "the references; null: each problem's own). A sample's own 'language' field wins",
    )
    exclude_sandbox_errors: bool = Field(
        False,
        description="leave samples that hit a sandbox error out of pass@k and give them no "
        "reward (false: they count as failures); the summary says how many were left out",
    )

    def limits(self, job_time_s: float | None = None) -> Limits:
        return Limits(
            wall_time_s=self.timeout,
            cpu_time_s=self.timeout,
            memory_mb=self.memory_mb,
            compile_time_s=self.compile_timeout,
            job_time_s=job_time_s,
        )

    def reward_config(self) -> RewardConfig:
        return RewardConfig(sandbox_errors="exclude" if self.exclude_sandbox_errors else "fail")
