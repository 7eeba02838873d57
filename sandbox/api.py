"""The sandbox's public data types: what a caller sends and what comes back.

The sandbox runs untrusted programs; it knows nothing about problems, rewards or models.
Two kinds of job:

* **call**: the untrusted ``program`` is loaded in one process; a trusted ``judge``
  (``JudgeSpec``) runs in another process, under another user, and reaches the program's
  top-level names only through plain-data RPC. The program never sees the judge's code
  or data, and only plain data ever reaches the judge's comparisons: builtin values (None,
  bool, int of any size, float, complex, str, bytes, bytearray, range, list, tuple, dict,
  set, frozenset, dict views) and standard-library value types (Fraction, Decimal,
  OrderedDict, Counter, defaultdict, deque, namedtuples, datetime's types), each rebuilt by
  the judge from its data, at any depth. Any other object comes back as an opaque
  ``RemoteRef``: the program answers for its ``str``, ``repr``, truth, length, hash and
  items (an iterator is read lazily) and for whether it equals another of its objects, but
  it equals no value of the test's own. Exceptions the program raises are raised in the
  test as their builtin classes (a ``class MyErr(ValueError)`` as a ``ValueError`` subclass
  of that name), and arguments the program changes in place change in the test. The
  program is loaded as an imported module would be (registered in ``sys.modules``, its own
  ``__future__`` flags). Tests that are plain data (``JudgeSpec.values``: a call with
  literal arguments compared with a literal) need no judge process: the program runs the
  calls on its own and the supervisor compares the replies, through the judge's own code.
* **io**: the program runs once per stdin case as ``__main__``, as ``python3 program.py``
  runs it (``exit`` and ``quit``, its threads joined, ``atexit`` hooks run and its streams
  flushed before it ends); its stdout comes back to the
  caller, which compares it with the expected output outside the sandbox. A case's output
  is what the program's processes write until its stdout and stderr close, at most 1 s
  after its main process exits; processes still holding them then are killed, and the case's
  stderr says so. Each case starts with the job's ``files`` in its working directory, and the
  ``fetch_files`` it leaves there come back with it (regular files only, at most
  ``output_bytes`` in all; what is left out is named in the case's stderr).

A job names its program's ``language`` (``runner/languages/``: ``python`` by default, ``cpp``).
A compiled language's program is compiled once per job, before its first case, in the sandbox
under the ``compile_*`` limits; a program that does not compile ends the job as
``compile_error`` with the compiler's message in ``ExecutionResult.compile``. Call mode runs
Python only: the judge calls into the runner's own interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from .runner import languages


class SandboxUnavailable(RuntimeError):
    """The Docker engine or the sandbox image cannot be used at all."""


class ExecStatus(str, Enum):
    """How an execution (or one io case) ended, as seen from outside the program."""

    COMPLETED = "completed"  # ran to the end; look at the test outcomes / stdout
    SYNTAX_ERROR = "syntax_error"
    COMPILE_ERROR = "compile_error"  # a compiled language's program did not compile
    RUNTIME_ERROR = "runtime_error"  # uncaught exception, non-zero exit, or death by signal
    TIMEOUT = "timeout"  # wall or CPU time limit
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    SANDBOX_ERROR = "sandbox_error"  # infrastructure failure: never the program's fault


@dataclass(frozen=True)
class Limits:
    """Per-execution limits, enforced from outside the program under test."""

    wall_time_s: float = 10.0  # whole job (call) or each case (io)
    cpu_time_s: float = 10.0
    memory_mb: int = 512  # address space of each program process
    output_bytes: int = 1 << 20  # stdout + stderr together, all cases of an io job together
    processes: int = 32  # threads and processes the program may have at once
    disk_mb: int = 64  # largest file the program (or its compiler) may write; work dirs are small
    # The compile phase of a compiled language (once per job): wall and CPU time, and the
    # address space of each compiler process (g++ needs ~300 MB for <bits/stdc++.h>).
    compile_time_s: float = 10.0
    compile_memory_mb: int = 1024
    # The most real time the whole job may take, its compile and every io case together (a
    # case cut short by it is a timeout, and no case runs after it); None: each case's own.
    job_time_s: float | None = None

    def __post_init__(self) -> None:
        for name, value in vars(self).items():  # inf or nan would break the supervisor
            if value is None and name == "job_time_s":
                continue
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Limits.{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class ValueCase:
    """A test as plain data: ``assert target(*args) == expected, message``, or, with ``args``
    None, ``assert expected, message`` (``message`` None: no message). ``args`` and
    ``expected`` hold only values the judge's codec carries (builtin values, and the
    standard-library value types listed above). ``compare`` is the assert's comparison:
    ``"=="``, ``"is"`` (``expected`` True, False or None) or ``"close"``:
    ``assert abs(target(*args) - expected) < tolerance``."""

    args: tuple[Any, ...] | None
    expected: Any
    message: str | None = None
    compare: Literal["==", "is", "close"] = "=="
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        if self.compare != "==" and self.args is None:
            raise ValueError(f"a {self.compare!r} ValueCase compares a call's result: no args")
        if self.compare == "is" and not any(self.expected is v for v in (True, False, None)):
            raise ValueError(f"'is' compares with True, False or None, not {self.expected!r}")
        if self.compare == "close" and not (
            type(self.tolerance) in (int, float) and math.isfinite(self.tolerance)
        ):
            raise ValueError(f"a 'close' ValueCase needs a finite tolerance: {self.tolerance!r}")


@dataclass(frozen=True)
class JudgeSpec:
    """Trusted test code, run in the judge process.

    ``setup`` runs first in a fresh namespace that holds two helpers:
    ``__remote__(name)`` (the program's top-level ``name``: plain data or a ``RemoteRef``;
    raises NameError if the program has no such name) and ``__remote_names__()`` (the
    program's public top-level names). Then each entry of ``tests`` runs, in order, in the same
    namespace: a test passes when it raises nothing. ``test_names`` label them.

    ``pytest``: the tests run pytest (``runner.pytest_judge``), so the judge is forked from a
    zygote that has it imported; any judge may import it, at the cost of the import per job.

    ``values``: the same tests as data, one ``ValueCase`` per test, where each is a call of the
    program's ``target`` with plain values compared with a plain value (HumanEval's
    ``assert candidate(1, 2) == 3``; ``ValueCase.compare``). They are decided without a judge
    process, so a job costs one process instead of two: the program runs the calls on its own,
    and the supervisor compares its replies, read through the judge's own code. The outcomes
    are those of the tests' code, except that ``setup`` does not run (nor can it fail), and the
    names the code binds are not asked of the program beyond ``target``. Replies past 1 MiB in
    all go to the judge, which runs the job again.
    """

    setup: str
    tests: tuple[str, ...]
    test_names: tuple[str, ...] = ()
    pytest: bool = False
    target: str = ""  # the program's name that ``values`` call
    values: tuple[ValueCase, ...] | None = None

    def __post_init__(self) -> None:
        if self.values is None:
            return
        if not self.target.isidentifier():
            raise ValueError(f"JudgeSpec.target must name the program's function: {self.target!r}")
        if len(self.values) != len(self.tests) or self.pytest:
            raise ValueError("JudgeSpec.values stand for the tests: one each, and no pytest")


@dataclass(frozen=True)
class Job:
    program: str
    judge: JudgeSpec | None = None  # call mode
    stdin_cases: tuple[str, ...] | None = None  # io mode
    limits: Limits = field(default_factory=Limits)
    files: Mapping[str, bytes] = field(default_factory=dict)  # io mode: path -> content
    fetch_files: tuple[str, ...] = ()  # io mode: paths read back after each case
    # io: no case runs after one that did not complete (crashed, timed out, hit a limit), for a
    # caller that needs to know only whether all passed: not every case to its time limit.
    stop_at_failure: bool = False
    language: str = "python"  # a name of runner/languages/

    def __post_init__(self) -> None:
        if (self.judge is None) == (self.stdin_cases is None):
            raise ValueError(
                "a Job needs exactly one of judge (call mode) or stdin_cases (io mode)"
            )
        language = languages.get(self.language)  # ValueError naming the known ones
        if self.judge is not None and not language.in_runner:
            raise ValueError(
                "a judge calls into programs run by the sandbox's own interpreter (Python); "
                f"{self.language} programs run in io mode (stdin_cases)"
            )
        if (self.files or self.fetch_files) and self.judge is not None:
            raise ValueError("files and fetch_files are for io mode (stdin_cases)")
        for name, paths in (("files", self.files), ("fetch_files", self.fetch_files)):
            if len(paths) > MAX_PATHS:
                raise ValueError(f"{name}: {len(paths)} paths, over the limit of {MAX_PATHS}")
            for path in paths:
                check_path(path)
        for path in self.files:
            parent = next((path[:end] for end in _separators(path) if path[:end] in self.files), "")
            if parent:
                raise ValueError(f"file {path!r} is inside file {parent!r}")
        for name, text in self._texts():
            check_text(name, text)

    def _texts(self) -> Iterator[tuple[str, str]]:
        """Every text of the job that goes to the container, named as a field of the job."""
        yield "program", self.program
        for index, stdin in enumerate(self.stdin_cases or ()):
            yield f"stdin_cases[{index}]", stdin
        if self.judge is not None:
            yield "judge.setup", self.judge.setup
            for index, test in enumerate((*self.judge.tests, *self.judge.test_names)):
                yield f"judge.tests[{index}]", test


MAX_PATHS = 1024  # files, and fetch_files, per job: a tmpfs holds a few thousand inodes
MAX_PATH_BYTES = 4096  # Linux's PATH_MAX
MAX_PATH_PARTS = 64  # directories deep
MAX_NAME_BYTES = 255  # each part: Linux's NAME_MAX


def check_path(path: str) -> None:
    """A file path of a job: relative to the program's working directory, inside it, and no
    longer or deeper than a file system takes (each check linear in the path's length)."""
    check_text(f"file path {path[:100]!r}", path)
    size = len(path.encode())
    if size > MAX_PATH_BYTES:
        raise ValueError(f"file path {path[:100]!r}...: {size} bytes, over {MAX_PATH_BYTES}")
    parts = path.split("/", MAX_PATH_PARTS)
    if len(parts) > MAX_PATH_PARTS:
        raise ValueError(f"file path {path[:100]!r}...: over {MAX_PATH_PARTS} parts deep")
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"file path {path!r}: must be relative, without '.', '..' or '//'")
    if "\0" in path:
        raise ValueError(f"file path {path!r}: holds a NUL character")
    if any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        raise ValueError(f"file path {path[:100]!r}: a part over {MAX_NAME_BYTES} bytes")


def _separators(path: str) -> Iterator[int]:
    """The positions of the '/' in ``path``: its parents are ``path[:end]``."""
    end = path.find("/")
    while end != -1:
        yield end
        end = path.find("/", end + 1)


def check_text(name: str, text: str) -> None:
    """ValueError naming ``name`` when ``text`` cannot travel as UTF-8 (a lone surrogate from
    a JSON ``"\\ud800"``): it must never reach a container, which could not encode it either."""
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name}: text that cannot be encoded as UTF-8 ({text[exc.start]!r} at character "
            f"{exc.start})"
        ) from None


@dataclass(frozen=True)
class TestOutcome:
    name: str
    passed: bool
    error: str | None = None  # "AssertionError: ...", "candidate raised ValueError: ..."
    candidate_error: bool = False  # the failure came from an exception in the program
    duration_s: float = 0.0


@dataclass(frozen=True)
class CaseOutcome:
    """One io case: what the program printed and how it ended."""

    status: ExecStatus
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    files: dict[str, bytes] = field(default_factory=dict)  # the job's fetch_files found


@dataclass(frozen=True)
class CompileOutcome:
    """The compile phase of a job: how the compiler ended and what it said."""

    status: ExecStatus  # completed, compile_error (it refused), or a limit: timeout, ...
    stdout: str
    stderr: str  # the compiler's messages, the first 4 KiB
    exit_code: int | None
    duration_s: float


@dataclass(frozen=True)
class ExecutionResult:
    status: ExecStatus
    tests: tuple[TestOutcome, ...] = ()  # call mode; tests not reached are absent
    cases: tuple[CaseOutcome, ...] = ()  # io mode; cases not reached are absent
    stdout: str = ""  # excerpt (call mode)
    stderr: str = ""  # excerpt (call mode), tracebacks of load errors included
    error: str | None = None  # human-readable reason for a non-completed status
    duration_s: float = 0.0
    attempts: int = 1  # > 1 when infrastructure failures were retried
    compile: CompileOutcome | None = None  # compiled languages
