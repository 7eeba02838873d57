"""``execution-feedback``: RLEF's environment (Gehring et al. 2024). Each answer runs against
the problem's public tests in the sandbox, and the reply says what a person running them would
see; the episode ends when they pass, and its outcome is every test on the final answer.

Every sentence of a reply is built from the verdict of the public tests' run: the status, which
test failed and why, the failing test as its public source shows it (an assert line; an io
case's input and expected output). The program's own words (its output, its error output) are
quoted as its output, fenced and labelled, never read for a pass or fail. The public view holds
no hidden test, and only it runs: a program that prints all it can reach prints none of them.
A reply is at most ``max_observation_chars`` characters, each quoted piece at most
``excerpt_chars``, and it always ends with the answer format.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..chat import answer_format, user_message
from ..rewards import RewardConfig
from ..verdicts import Verdict, VerdictStatus
from ..verifier import Verifier
from . import Environment, EnvironmentConfig, Episode, Reply, register

if TYPE_CHECKING:
    from ..problems import Problem

PUBLIC = "public"  # Episode.state: the problem's public view (None: it has no public test)
ERROR_LINES = 12  # of the program's error output: the last ones, or a compiler's first
LEFT_OUT = "[The rest of this report is left out: a reply is bounded in length.]"
# A test's error that names an exception other than a failed assertion (the judge writes an
# exception as its class name first): the test raised before it could check a result.
RAISED = re.compile(r"(?!AssertionError\b)[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
# What a status says of the program, where no single test's error does.
WHAT_HAPPENED = {
    VerdictStatus.FAILED: "it gave a wrong result",
    VerdictStatus.SYNTAX_ERROR: "it is not valid code (a syntax error)",
    VerdictStatus.COMPILE_ERROR: "it did not compile",
    VerdictStatus.RUNTIME_ERROR: "it raised an error",
    VerdictStatus.TIMEOUT: "it ran out of time",
    VerdictStatus.MEMORY_LIMIT: "it ran out of memory",
    VerdictStatus.OUTPUT_LIMIT: "it wrote more output than allowed",
}


class ExecutionFeedbackConfig(EnvironmentConfig):
    max_turns: int | None = Field(
        None,
        ge=1,
        description="answers per episode, after which it ends (info end: turns); None: the "
        "caller stops it (the pipeline's episodes.max_turns)",
    )
    max_observation_chars: int = Field(
        4000, ge=500, le=100_000, description="a reply's length at most, in characters"
    )
    excerpt_chars: int = Field(
        800,
        ge=80,
        le=100_000,
        description="each piece a reply quotes at most: a test, an input, an expected or "
        "actual output, error lines",
    )


@register
class ExecutionFeedback(Environment):
    name = "execution-feedback"
    config_model = ExecutionFeedbackConfig
    config: ExecutionFeedbackConfig

    @functools.cached_property
    def public_verifier(self) -> Verifier:
        """Runs every public test, so that a reply can say how many passed."""
        return self._verifier(RewardConfig(test_reward="pass_fraction"))

    @functools.cached_property
    def scoring_verifier(self) -> Verifier:
        return self._verifier(self.reward_config)

    def _verifier(self, rewards: RewardConfig) -> Verifier:
        return Verifier(
            self.executor,
            limits=self.limits,
            reward_config=rewards,
            completion_style=self.completion_style,
        )

    def reset(self, problem: Problem) -> Episode:
        return Episode(problem, user_message(problem), state={PUBLIC: problem.public_view()})

    def feedback(self, episodes: Sequence[Episode], answers: Sequence[str]) -> list[Reply]:
        if len(episodes) != len(answers):
            raise ValueError(f"{len(episodes)} episodes but {len(answers)} answers")
        for episode in episodes:
            if episode.done:
                raise ValueError(
                    f"the episode of {episode.problem.task_id!r} is done "
                    f"({len(episode.answers)} answers): start another"
                )
        for episode, answer in zip(episodes, answers, strict=True):
            episode.answers.append(answer)
        running = [i for i, episode in enumerate(episodes) if episode.state[PUBLIC] is not None]
        verdicts = run(
            self.public_verifier,
            [episodes[i].state[PUBLIC] for i in running],
            [answers[i] for i in running],
        )
        by_episode = dict(zip(running, verdicts, strict=True))
        return [self._reply(episode, by_episode.get(i)) for i, episode in enumerate(episodes)]

    def score(self, episodes: Sequence[Episode]) -> list[float | None]:
        for episode in episodes:
            if not episode.answers:
                raise ValueError(f"the episode of {episode.problem.task_id!r} has no answer yet")
        problems = [episode.problem for episode in episodes]
        finals = [episode.answers[-1] for episode in episodes]
        return [verdict.reward for verdict in run(self.scoring_verifier, problems, finals)]

    def _reply(self, episode: Episode, verdict: Verdict | None) -> Reply:
        if verdict is None:
            return _ended(episode, "no_public_tests", {})
        info: dict[str, Any] = {
            "public_status": verdict.status.value,
            "public_passed": sum(test.passed for test in verdict.tests),
            "public_tests": episode.state[PUBLIC].tests.count(),
        }
        if verdict.passed:
            return _ended(episode, "passed", info)
        if verdict.status is VerdictStatus.SANDBOX_ERROR:
            return _ended(episode, "sandbox_error", info)
        if self.config.max_turns is not None and len(episode.answers) >= self.config.max_turns:
            return _ended(episode, "turns", info)
        episode.observation = feedback_text(
            episode.state[PUBLIC],
            verdict,
            max_chars=self.config.max_observation_chars,
            excerpt_chars=self.config.excerpt_chars,
        )
        return Reply(episode.observation, False, info)


def run(verifier: Verifier, problems: list[Problem], answers: list[str]) -> list[Verdict]:
    """Each answer's verdict against its problem, on the pool at once (problems known by
    their place: two episodes of one task id may pose different views of it)."""
    if not answers:
        return []
    samples = [{"task_id": str(i), "completion": answer} for i, answer in enumerate(answers)]
    return verifier.verify({str(i): p for i, p in enumerate(problems)}, samples)


def _ended(episode: Episode, end: str, info: dict[str, Any]) -> Reply:
    episode.done = True
    return Reply(None, True, {**info, "end": end})


def feedback_text(public: Problem, verdict: Verdict, *, max_chars: int, excerpt_chars: int) -> str:
    """What a person who ran ``public`` (a problem's public view) would tell the model of the
    run ``verdict`` describes: built from the verdict alone, at most ``max_chars``."""
    what = WHAT_HAPPENED.get(verdict.status, verdict.status.value)
    failing = next((i for i, test in enumerate(verdict.tests) if not test.passed), None)
    if failing is None:
        parts = [f"Your program did not pass the public tests: {what}."]
    else:  # the most telling first: a reply that runs out of room drops the last parts
        passed = sum(test.passed for test in verdict.tests)
        error = (verdict.tests[failing].error or what).strip().split("\n", 1)[0]
        if verdict.status is VerdictStatus.FAILED and RAISED.match(error):
            what = WHAT_HAPPENED[VerdictStatus.RUNTIME_ERROR]  # a test that raised, not asserted
        parts = [
            f"Your program passed {passed} of {public.tests.count()} public tests. "
            f"Public test {failing + 1} failed: {what}.",
            *(quoted(label, text, excerpt_chars) for label, text in public.tests.shown(failing)),
            f"Error: {excerpt(error, excerpt_chars)}",
            quoted("Your program's output", verdict.stdout, excerpt_chars)
            if verdict.stdout.strip()
            else "Your program's output: (nothing)",
        ]
    if verdict.stderr.strip():
        lines = verdict.stderr.strip("\n").split("\n")
        if verdict.status is VerdictStatus.COMPILE_ERROR:
            parts.append(
                quoted("The compiler's first errors", "\n".join(lines[:ERROR_LINES]), excerpt_chars)
            )
        else:
            label = "Your program's error output, its last lines"
            parts.append(quoted(label, "\n".join(lines[-ERROR_LINES:]), excerpt_chars, tail=True))
    closing = f"Fix the program. {answer_format(public)}"
    return within(parts, max_chars - len(closing) - 2) + "\n\n" + closing


def within(parts: list[str], limit: int) -> str:
    """``parts`` joined by blank lines, as many whole ones as fit in ``limit`` characters
    (the first cut if it alone does not), saying so when some are left out."""
    kept: list[str] = []
    for part in parts:
        note = [LEFT_OUT] if len(kept) + 1 < len(parts) else []  # room to say the rest is out
        if len("\n\n".join([*kept, part, *note])) > limit:
            break
        kept.append(part)
    if len(kept) == len(parts):
        return "\n\n".join(kept)
    if not kept:
        return excerpt(parts[0], limit)
    return "\n\n".join([*kept, LEFT_OUT])


def quoted(label: str, text: str, limit: int, *, tail: bool = False) -> str:
    """``text`` under its label in a fenced block that nothing in it can close: its first
    ``limit`` characters (its last, with ``tail``), the label saying how much is shown."""
    text = text.strip("\n")
    shown = text
    if len(text) > limit:
        shown = text[-limit:] if tail else text[:limit]
        label += f" ({'last' if tail else 'first'} {limit} of {len(text)} characters)"
    longest = max((len(run) for run in re.findall(r"`+", shown)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{label}:\n{fence}\n{shown}\n{fence}"


def excerpt(text: str, limit: int) -> str:
    """``text``, or its start and how long it is, in ``limit`` characters."""
    if len(text) <= limit:
        return text
    marker = f"... [{len(text)} characters in all]"
    return text[: max(0, limit - len(marker))] + marker
