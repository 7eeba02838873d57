"""Problems + samples -> verdicts, every job in flight at once.

The verifier depends only on the ``Executor`` protocol (``submit(job) -> Future``): a
``SandboxPool`` in real use, a fake one in unit tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..sandbox import ExecutionResult, Job, Limits, SandboxUnavailable
from .extraction import (
    MAX_COMPLETION_CHARS,
    CompletionStyle,
    Program,
    build_program,
    completion_text,
    resolve_style,
)
from .forms import form_of
from .problems import Problem
from .rewards import RewardConfig, combine, rule_components, verdict_test_reward
from .verdicts import Assessment, Verdict, VerdictStatus

if TYPE_CHECKING:
    from ..sandbox.pool import SandboxPool

Progress = Callable[[Verdict], None]


class Executor(Protocol):
    def submit(self, job: Job) -> Future[ExecutionResult]: ...


class SampleError(ValueError):
    """A sample that cannot be verified (no such task, no completion); names the sample."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"sample {index}: {reason}")
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class PreparedSample:
    index: int
    sample: Mapping[str, Any]
    problem: Problem
    completion: str
    program: Program | None  # None when ``refused``
    job: Job | None  # the first job; the problem's form may call for more (``finish``)
    length: int  # for the length penalty, in the length term's unit
    refused: str = ""  # why it fails without running (a completion over the size limit)


class Verifier:
    def __init__(
        self,
        executor: Executor | None = None,
        *,
        limits: Limits | None = None,
        reward_config: RewardConfig | None = None,
        completion_style: CompletionStyle = "auto",
        workers: int = 4,
        max_completion_chars: int = MAX_COMPLETION_CHARS,
    ) -> None:
        resolve_style("", completion_style)  # fail here on a bad style, not per sample
        self.limits = limits or Limits()
        self.reward_config = reward_config or RewardConfig()
        self.completion_style = completion_style
        self.workers = workers
        self.max_completion_chars = max_completion_chars
        self._executor = executor
        self._owned_pool: SandboxPool | None = None
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None

    # -- the executor: a sandbox pool made on first use unless one was given

    @property
    def executor(self) -> Executor:
        with self._lock:
            if self._executor is None:
                from ..sandbox.pool import PoolConfig, SandboxPool  # Docker's client: 0.2 s

                pool = SandboxPool(PoolConfig(size=self.workers))
                pool.start()  # raises SandboxUnavailable now rather than per job
                self._executor = self._owned_pool = pool
            return self._executor

    def start_soon(self) -> None:
        """Start the default pool in the background, so its containers warm up while the caller
        loads and prepares samples; a pool that cannot start says so when it is first used."""
        if self._executor is None and self._starting is None:
            self._starting = threading.Thread(target=self._start_quietly, daemon=True)
            self._starting.start()

    def _start_quietly(self) -> None:
        with contextlib.suppress(SandboxUnavailable):
            _ = self.executor  # the property starts the pool

    def close(self, abort: bool = False) -> None:
        """Stops the pool this verifier made (one passed in belongs to the caller); with
        ``abort``, the jobs it is running end now (``SandboxPool.close``)."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        with self._lock:
            if self._owned_pool is not None:
                self._owned_pool.close(abort=abort)
                self._owned_pool = self._executor = None

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- verifying

    def prepare(
        self, problems: Mapping[str, Problem], samples: Iterable[Mapping[str, Any]]
    ) -> list[PreparedSample]:
        """Programs and jobs for every sample; raises ``SampleError`` before anything runs."""
        return [self._prepare(index, problems, sample) for index, sample in enumerate(samples)]

    def check(self, problems: Mapping[str, Problem], samples: Iterable[Mapping[str, Any]]) -> None:
        """``SampleError`` for the first sample that cannot be verified, as ``prepare`` raises it,
        without building anything (``codepost verify --server`` checks what its server runs)."""
        for index, sample in enumerate(samples):
            self._checked(index, problems, sample)

    def _prepare(
        self, index: int, problems: Mapping[str, Problem], sample: Mapping[str, Any]
    ) -> PreparedSample:
        problem, completion, length = self._checked(index, problems, sample)
        if len(completion) > self.max_completion_chars:
            reason = (
                f"the completion is {len(completion)} characters, over the verifier's limit "
                f"of {self.max_completion_chars}"
            )
            return PreparedSample(index, sample, problem, completion, None, None, length, reason)
        program = build_program(problem, completion, self.completion_style)
        all_cases = self.reward_config.test_reward == "pass_fraction"
        form = form_of(problem)
        limits = form.limits(problem, self.limits)
        try:
            job = form.build_job(problem, program.source, limits, all_cases=all_cases)
        except ValueError as exc:  # text no sandbox can take (a lone surrogate): this one fails
            return PreparedSample(
                index, sample, problem, completion, program, None, length, str(exc)
            )
        return PreparedSample(index, sample, problem, completion, program, job, length)

    def _checked(
        self, index: int, problems: Mapping[str, Problem], sample: Mapping[str, Any]
    ) -> tuple[Problem, str, int]:
        """The sample's problem, completion text and length (for the length penalty)."""
        if not isinstance(sample, Mapping):
            raise SampleError(index, f"expected an object, got {type(sample).__name__}")
        for key in ("task_id", "completion"):
            if key not in sample:
                raise SampleError(index, f"missing field {key!r}")
        task_id = str(sample["task_id"])
        problem = problems.get(task_id)
        if problem is None:
            raise SampleError(index, f"unknown task_id {task_id!r}")
        language = sample.get("language", problem.language)  # a sample may answer in another
        if not isinstance(language, str):
            raise SampleError(index, f"field 'language': expected a name, got {language!r}")
        try:
            problem = problem.in_language(language)
        except ValueError as exc:
            raise SampleError(index, str(exc)) from None
        languages = form_of(problem).languages
        if problem.language not in languages:
            raise SampleError(
                index,
                f"problem {task_id!r} is in {problem.language!r}; its tests "
                f"({problem.test_form}) run {', '.join(languages)} here",
            )
        try:
            completion = completion_text(sample["completion"])
        except TypeError as exc:
            raise SampleError(index, f"field 'completion': {exc}") from None
        return problem, completion, self._length(index, sample, completion)

    def _length(self, index: int, sample: Mapping[str, Any], completion: str) -> int:
        if self.reward_config.term_params("length").unit == "chars":
            return len(completion)
        ids = sample.get("completion_ids")
        if ids is None:
            raise SampleError(
                index, "the length term's unit 'tokens' needs the sample's completion_ids"
            )
        return len(ids)

    def finish(self, prepared: PreparedSample, *results: ExecutionResult) -> Verdict:
        """The verdict for one executed sample, rewards included, from the results of its jobs
        (the first, then any its form called for: ``run``)."""
        if prepared.job is None:
            return self.refuse(prepared)
        form, jobs = form_of(prepared.problem), [prepared.job]
        for done in range(1, len(results)):
            follow_up = form.next_job(prepared.problem, jobs, results[:done])
            assert follow_up is not None, "more results than the problem's form asked for"
            jobs.append(follow_up)
        assessment = form.assess(prepared.problem, jobs, results)
        return self._verdict(prepared, assessment, sum(r.duration_s for r in results))

    def run(self, executor: Executor, prepared: PreparedSample) -> Future[list[ExecutionResult]]:
        """The results of a sample's jobs: its first, then each its form calls for on seeing
        the results so far (an output checker's), submitted as the one before completes."""
        assert prepared.job is not None
        form, problem = form_of(prepared.problem), prepared.problem
        done: Future[list[ExecutionResult]] = Future()
        jobs, results = [prepared.job], []

        def step(future: Future[ExecutionResult]) -> None:
            try:
                results.append(future.result())
                follow_up = form.next_job(problem, jobs, results)
                if follow_up is None:
                    done.set_result(results)
                    return
                jobs.append(follow_up)
                executor.submit(follow_up).add_done_callback(step)
            except BaseException as exc:
                done.set_exception(exc)

        executor.submit(prepared.job).add_done_callback(step)
        return done

    def refuse(self, prepared: PreparedSample) -> Verdict:
        """The verdict for a sample refused without running: failed, and the floor of every
        rule component."""
        assessment = Assessment(VerdictStatus.FAILED, [], 0.0, prepared.refused, "", "")
        return self._verdict(prepared, assessment, 0.0)

    def _verdict(
        self, prepared: PreparedSample, assessment: Assessment, duration_s: float
    ) -> Verdict:
        config = self.reward_config
        components: dict[str, float | None] = {
            "test": verdict_test_reward(
                config,
                assessment.status is VerdictStatus.PASSED,
                assessment.pass_fraction,
                assessment.status is VerdictStatus.SANDBOX_ERROR,
            ),
            **rule_components(config, prepared.completion, prepared.program, prepared.length),
        }
        if "syntax" in components and assessment.status is VerdictStatus.COMPILE_ERROR:
            components["syntax"] = 0.0  # a compiled language's syntax is its compiler's to judge
        return Verdict(
            sample=dict(prepared.sample),
            task_id=prepared.problem.task_id,
            passed=assessment.status is VerdictStatus.PASSED,
            result=assessment.result,
            status=assessment.status,
            pass_fraction=assessment.pass_fraction,
            tests=assessment.tests,
            stdout=assessment.stdout,
            stderr=assessment.stderr,
            reward=combine(config, components),
            reward_components=components,
            completion_style=resolve_style(prepared.completion, self.completion_style),
            duration_s=duration_s,
        )

    def iter_verify(
        self, problems: Mapping[str, Problem], samples: Iterable[Mapping[str, Any]]
    ) -> Iterator[tuple[int, Verdict]]:
        """``(sample index, verdict)`` as each completes.

        Every sample is checked now (``SampleError``); the executor starts, and the jobs go in
        flight, on the first ``next()``.
        """
        return self._run(self.prepare(problems, samples))

    def _run(self, prepared: list[PreparedSample]) -> Iterator[tuple[int, Verdict]]:
        executor = self.executor
        futures = {self.run(executor, item): item for item in prepared if item.job is not None}
        for item in prepared:
            if item.job is None:
                yield item.index, self.refuse(item)
        for future in concurrent.futures.as_completed(futures):
            item = futures.pop(future)  # keep no whole outputs: the verdict holds excerpts
            yield item.index, self.finish(item, *future.result())

    def verify(
        self,
        problems: Mapping[str, Problem],
        samples: Iterable[Mapping[str, Any]],
        progress: Progress | None = None,
    ) -> list[Verdict]:
        """Verdicts in sample order."""
        verdicts: dict[int, Verdict] = {}
        for index, verdict in self.iter_verify(problems, samples):
            verdicts[index] = verdict
            if progress is not None:
                progress(verdict)
        return [verdicts[index] for index in range(len(verdicts))]

    async def averify(
        self,
        problems: Mapping[str, Problem],
        samples: Iterable[Mapping[str, Any]],
        progress: Progress | None = None,
        prepare_in: ThreadPoolExecutor | None = None,
    ) -> list[Verdict]:
        """``verify`` on an event loop; ``prepare_in``: the executor that parses and builds the
        jobs (a large inline test module takes a while), by default the loop's own."""
        prepared = await asyncio.get_running_loop().run_in_executor(
            prepare_in, self.prepare, problems, samples
        )
        executor = await asyncio.to_thread(lambda: self.executor)

        async def one(item: PreparedSample) -> Verdict:
            if item.job is None:
                verdict = self.refuse(item)
            else:
                verdict = self.finish(item, *await asyncio.wrap_future(self.run(executor, item)))
            if progress is not None:
                progress(verdict)
            return verdict

        return list(await asyncio.gather(*(one(item) for item in prepared)))
