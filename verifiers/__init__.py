"""Problems + candidate code -> verdicts and rewards, run in the sandbox; the ``verify`` CLI."""

from .chat import user_message
from .extraction import CompletionStyle, Program, build_program, extract_code
from .forms.io import IOCase
from .pass_at_k import PassAtK, estimate_pass_at_k, exact_pass_at_k, pass_at_k
from .problems import Problem, ProblemFormatError, load_problems
from .rewards import RewardConfig
from .trl_rewards import make_trl_reward_funcs
from .verdicts import TestResult, Verdict, VerdictStatus
from .verifier import Executor, SampleError, Verifier

__all__ = [
    "CompletionStyle",
    "Executor",
    "IOCase",
    "PassAtK",
    "Problem",
    "ProblemFormatError",
    "Program",
    "RewardConfig",
    "SampleError",
    "TestResult",
    "Verdict",
    "VerdictStatus",
    "Verifier",
    "build_program",
    "estimate_pass_at_k",
    "exact_pass_at_k",
    "extract_code",
    "load_problems",
    "make_trl_reward_funcs",
    "pass_at_k",
    "user_message",
]
