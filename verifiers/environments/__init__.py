"""Environments: a problem as an episode of turns, the model answering and the environment
replying, each one module that registers itself.

An environment keeps a problem's tests apart (``Problem.public_view``): what it says between
turns comes from the tests a model may see, run in the sandbox, and an episode's outcome from
all of them on its final answer, scored as a single answer is. The trainer's episode loop
(``pipeline``) and the environment server (``codepost env-server``, OpenEnv's shape) are its
two callers: both advance many episodes a turn at a time, so :meth:`Environment.feedback`
and :meth:`Environment.score` take a batch, which the sandbox pool runs at once.

Every environment is built the same way, so that its callers name it only by its registered
name: ``environments()[name](executor, limits=..., reward_config=..., config=...)``. The built-in
environments are this package's modules (``execution_feedback``); another module that calls
:func:`register` adds one, and no other code names it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from ...settings.registry import Registry

if TYPE_CHECKING:
    from ...sandbox import Limits
    from ..extraction import CompletionStyle
    from ..problems import Problem
    from ..rewards import RewardConfig
    from ..verifier import Executor

# Loaded by name (the registry imports every module here on the first look-up): a stage that
# runs episodes runs them all, so its resume key holds them all (pipeline/code_version.py).
__modules_loaded_by_name__ = True


@dataclass
class Episode:
    """One problem's episode so far: created by :meth:`Environment.reset`, advanced by
    :meth:`Environment.feedback`. ``observation`` is what the model reads next (the first
    user turn, then each reply); ``answers`` every answer given."""

    problem: Problem
    observation: str
    answers: list[str] = field(default_factory=list)
    done: bool = False
    state: dict[str, Any] = field(default_factory=dict)  # the environment's own bookkeeping


@dataclass(frozen=True)
class Reply:
    """What the environment says to one answer: the next user turn (None when the episode is
    done), whether it is done, and what it saw. ``info["end"]`` says why an episode ended:
    ``passed`` (its public tests), ``turns``, ``no_public_tests``, or ``sandbox_error`` (its
    answer could not be run, no fault of the model's)."""

    observation: str | None
    done: bool
    info: dict[str, Any]


class EnvironmentConfig(BaseModel):
    """Settings every environment takes; an environment with more subclasses it."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Environment(ABC):
    """How episodes of one kind run: on ``executor`` (a sandbox pool), under ``limits``, with
    ``reward_config``'s rewards, answers read in ``completion_style`` (what a sample's
    ``completion`` is to the verifier), and the environment's own ``config``."""

    name: ClassVar[str]
    config_model: ClassVar[type[EnvironmentConfig]] = EnvironmentConfig

    def __init__(
        self,
        executor: Executor,
        *,
        limits: Limits,
        reward_config: RewardConfig,
        config: EnvironmentConfig | None = None,
        completion_style: CompletionStyle = "auto",
    ) -> None:
        self.executor, self.limits, self.reward_config = executor, limits, reward_config
        self.config = config or self.config_model()
        if not isinstance(self.config, self.config_model):
            raise TypeError(
                f"environment {self.name!r} takes its config as {self.config_model.__name__}, "
                f"not {type(self.config).__name__}"
            )
        self.completion_style = completion_style

    @abstractmethod
    def reset(self, problem: Problem) -> Episode:
        """A new episode of ``problem``: its first observation, nothing answered yet."""

    @abstractmethod
    def feedback(self, episodes: Sequence[Episode], answers: Sequence[str]) -> list[Reply]:
        """Each episode's reply to its answer (appended to ``episode.answers``; ``done`` set):
        built from what the environment ran, never from the program's own claims."""

    @abstractmethod
    def score(self, episodes: Sequence[Episode]) -> list[float | None]:
        """Each episode's outcome: its final answer against every test, rewarded as a single
        answer is (None: a sandbox error, which the reward config may exclude)."""


_ENVIRONMENTS: Registry[type[Environment]] = Registry("environment", __name__)


def register(environment: type[Environment]) -> type[Environment]:
    return _ENVIRONMENTS.register(environment.name, environment)


def environments() -> dict[str, type[Environment]]:
    """Every registered environment class by name (the built-in ones are this package's
    modules)."""
    return _ENVIRONMENTS.all()
