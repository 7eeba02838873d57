"""``io``: stdin/stdout cases (APPS, CodeContests, LiveCodeBench, SYNTHETIC-1), each output
judged by the problem's checker.

* ``exact`` (the default): the lines as they are, trailing whitespace and trailing blank lines
  aside.
* ``tokens``: the output's whitespace-separated tokens against the expected ones, numbers
  equal as decimals (``2.50`` is ``2.5``) or within ``abs_tol`` / ``rel_tol`` of the expected
  value (testlib's ``doubleCompare``: either bound suffices). ``by_line`` also asks for the
  same lines, each compared so: LiveCodeBench's ``grade_stdio`` (stripped lines, as many as
  expected, each equal as text or as a list of ``Decimal``), which rllm applies to TACO, APPS,
  CodeContests and SYNTHETIC-1 as well.
* ``program``: a checker program in a job of its own, after the program's, in the sandbox and
  under the problem's limits, once per case the program completed. In Python it runs as
  ``python3 checker.py input.txt expected.txt output.txt`` (the order of open-r1's Codeforces
  and IOI graders: input, correct output, contestant output) and accepts with exit status 0;
  when its first line of output is a number, as CMS and open-r1's checkers print a score,
  that number must be 1. In C++ it is a testlib checker (testlib.h: ``check.exe <Input_File>
  <Output_File> <Answer_File>``, the contestant's output before the jury's answer), compiled
  once per checker job, and its exit status is testlib's: 0 accepts; 1 wrong answer, 2
  presentation error, 3 the checker failed, anything else rejects too. ``files`` are written
  beside it (``testlib.h`` for a Codeforces checker: the sandbox image has none).

Expected outputs never enter the program's job; a checker sees them in its own.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from ...sandbox import LANGUAGES, CaseOutcome, ExecStatus, ExecutionResult, Job, Limits
from ...sandbox.api import check_path
from ..judges import longest_first
from ..languages import PYTHON, canonical_language, checker_languages
from ..verdicts import Assessment, VerdictStatus, assess_cases, case_error, clip, conclude
from . import Form, FormTests, register, without_none

if TYPE_CHECKING:
    from ..problems import Problem

# An io job's output budget grows by this many bytes per byte its cases expect (trailing
# spaces and CRLF line ends cost bytes), so a problem with several large expected outputs
# does not fail its later cases on a budget the earlier ones used up.
OUTPUT_PER_EXPECTED_BYTE = 2
CHECKER_FILES = ("input.txt", "expected.txt", "output.txt")  # a Python checker's argv
TESTLIB_FILES = ("input.txt", "output.txt", "answer.txt")  # a C++ checker's: testlib's order
# testlib.h's exit codes (OK_EXIT_CODE 0, WA 1, PE 2, FAIL 3, DIRT 4, POINTS 7, UNEXPECTED_EOF 8)
TESTLIB_RESULTS = {
    1: "wrong answer",
    2: "presentation error",
    3: "the checker failed",
    4: "wrong output format",
    7: "partial points",
    8: "unexpected end of file",
}
# Decimal arithmetic for tolerances: no rounding that matters, no trap on a huge exponent.
_CONTEXT = decimal.Context(
    prec=100, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[], flags=[]
)


class IOCase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str
    output: str


class ExactOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["exact"] = "exact"


class TokenOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tokens"] = "tokens"
    abs_tol: float = Field(0.0, ge=0)
    rel_tol: float = Field(0.0, ge=0)
    by_line: bool = False  # the lines must match too (LiveCodeBench)


class CheckerProgram(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["program"] = "program"
    source: str
    # python: argv input, expected and actual output files; cpp: testlib's input, actual
    # output, expected answer. Exit 0 accepts. One of checker_languages().
    language: str = PYTHON
    files: dict[str, str] = Field(default_factory=dict)  # beside it: testlib.h, a helper module

    @field_validator("language", mode="before")
    @classmethod
    def _language_name(cls, name: Any) -> Any:
        if not isinstance(name, str):
            return name
        language = canonical_language(name)
        if language not in checker_languages():
            raise ValueError(
                f"a checker in {name!r} is not run here: checkers are written in "
                f"{', '.join(checker_languages())}"
            )
        return language

    @field_validator("files")
    @classmethod
    def _file_names(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            check_path(path)
            if path in CHECKER_FILES + TESTLIB_FILES:
                raise ValueError(f"files: {path!r} is the name of a file the checker reads")
        return files

    @model_validator(mode="after")
    def _compiles(self) -> CheckerProgram:
        """A Python checker must compile here; a C++ one compiles in the sandbox (one that
        does not fails every sample: ``codepost verify --reference`` shows it)."""
        if self.language == PYTHON:
            try:
                compile(self.source, "checker.py", "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                raise ValueError(f"the checker is not valid Python: {exc}") from None
        return self


Checker = Annotated[ExactOutput | TokenOutput | CheckerProgram, Field(discriminator="kind")]


class IOTests(FormTests):
    form: Literal["io"] = "io"
    io: tuple[IOCase, ...]
    checker: Checker = Field(default_factory=ExactOutput)
    # The cases a model may see, where the data set ships them (CodeContests' public_tests,
    # LiveCodeBench's public_test_cases); () when it ships none; None: the first case is.
    public_io: tuple[IOCase, ...] | None = None

    @model_validator(mode="after")
    def _has_cases(self) -> IOTests:
        if not self.io:
            raise ValueError("io has no cases")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_split(self, write: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_none(write(self), "public_io")

    def count(self) -> int:
        return len(self.io)

    def capped(self, max_tests: int) -> IOTests:
        return self.model_copy(
            update={"io": longest_first(self.io, max_tests, lambda case: len(case.input))}
        )

    def public(self) -> IOTests | None:
        cases = self.io[:1] if self.public_io is None else self.public_io
        return self.model_copy(update={"io": cases, "public_io": None}) if cases else None

    def shown(self, index: int) -> tuple[tuple[str, str], ...]:
        case = self.io[index]
        return (("Input", case.input), ("Expected output", case.output))


class IOForm(Form):
    tests_model = IOTests
    marker = "io"
    languages = LANGUAGES  # every language the sandbox runs reads stdin and writes stdout
    per_case_limits = True

    def instructions(self, problem: Problem) -> list[str]:
        """The first public case as the example (never one the data set keeps hidden)."""
        public = problem.tests.public()
        if public is None:
            return ["Read from standard input and write to standard output."]
        example = public.io[0]  # type: ignore[attr-defined]
        return [
            "Read from standard input and write to standard output.\n"
            f"Example input:\n{example.input.rstrip()}\n"
            f"Example output:\n{example.output.rstrip()}"
        ]

    def build_job(self, problem: Problem, program: str, limits: Limits, *, all_cases: bool) -> Job:
        cases = problem.io
        expected = sum(len(case.output.encode()) for case in cases)
        budget = limits.output_bytes + OUTPUT_PER_EXPECTED_BYTE * expected
        return Job(
            program=program,
            stdin_cases=tuple(case.input for case in cases),
            limits=dataclasses.replace(limits, output_bytes=budget),
            stop_at_failure=not all_cases,
            language=problem.language,
        )

    def next_job(
        self, problem: Problem, jobs: Sequence[Job], results: Sequence[ExecutionResult]
    ) -> Job | None:
        """The checker program's job: one case per case the program completed."""
        checker = problem.checker
        if not isinstance(checker, CheckerProgram) or len(results) != 1:
            return None
        checked = _completed(problem, results[0])
        if not checked:
            return None
        return checker_job(checker, checked, jobs[0].limits)

    def assess(
        self, problem: Problem, jobs: Sequence[Job], results: Sequence[ExecutionResult]
    ) -> Assessment:
        run, expected = results[0], len(problem.io)
        checker = problem.checker
        checked = results[1] if len(results) > 1 else None
        if checked is not None and checked.status is ExecStatus.SANDBOX_ERROR:
            return conclude(checked, [], expected, VerdictStatus.FAILED, None, "", "")
        verdicts = iter(checked.cases if checked is not None else ())
        judged = []
        for index, (case, outcome) in enumerate(zip(problem.io, run.cases, strict=False)):
            if outcome.status is not ExecStatus.COMPLETED:
                error: str | None = case_error(outcome)
            elif isinstance(checker, CheckerProgram):
                if checked is not None and checked.status is ExecStatus.COMPILE_ERROR:
                    error = f"the checker {checked.error or 'did not compile'}"
                else:
                    error = checker_error(next(verdicts, None), checker.language)
            elif outputs_match(outcome.stdout, case.output, checker):
                error = None
            else:
                error = (
                    f"wrong output: expected {clip(case.output)!r}, got {clip(outcome.stdout)!r}"
                )
            judged.append((f"case {index}", outcome, error))
        return assess_cases(run, expected, judged)


register(IOForm())


def _completed(problem: Problem, run: ExecutionResult) -> list[tuple[IOCase, str]]:
    return [
        (case, outcome.stdout)
        for case, outcome in zip(problem.io, run.cases, strict=False)
        if outcome.status is ExecStatus.COMPLETED
    ]


# -- comparisons


def normalize_output(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped (CRLF-safe)."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def outputs_match(
    actual: str, expected: str, checker: ExactOutput | TokenOutput | None = None
) -> bool:
    """Whether an io case's output is right by ``checker`` (None: exact)."""
    if checker is None or isinstance(checker, ExactOutput):
        return normalize_output(actual) == normalize_output(expected)
    if not checker.by_line:
        return tokens_match(actual.split(), expected.split(), checker)
    # LiveCodeBench's get_stripped_lines: the whole text stripped, then each line
    actual_lines = [line.strip() for line in actual.strip().split("\n")]
    expected_lines = [line.strip() for line in expected.strip().split("\n")]
    return len(actual_lines) == len(expected_lines) and all(
        a == e or tokens_match(a.split(), e.split(), checker)
        for a, e in zip(actual_lines, expected_lines, strict=True)
    )


def tokens_match(actual: list[str], expected: list[str], checker: TokenOutput) -> bool:
    return len(actual) == len(expected) and all(
        a == e or _numbers_match(a, e, checker) for a, e in zip(actual, expected, strict=True)
    )


def _numbers_match(actual: str, expected: str, checker: TokenOutput) -> bool:
    try:
        a, e = Decimal(actual), Decimal(expected)
    except decimal.InvalidOperation:
        return False
    if not (a.is_finite() and e.is_finite()):
        return False
    if a == e:
        return True
    error = _CONTEXT.abs(_CONTEXT.subtract(a, e))
    return error <= Decimal(repr(checker.abs_tol)) or error <= _CONTEXT.multiply(
        Decimal(repr(checker.rel_tol)), _CONTEXT.abs(e)
    )


# -- checker programs


def checker_job(checker: CheckerProgram, checked: list[tuple[IOCase, str]], limits: Limits) -> Job:
    """The checker's job: one case per ``(case, the program's output)``, each writing the
    checker's three files from its stdin, then running the checker on them."""
    if checker.language == PYTHON:
        program = checker_program(checker.source)
        stdin = [
            json.dumps(dict(zip(CHECKER_FILES, (case.input, case.output, actual), strict=True)))
            for case, actual in checked
        ]
    else:
        program = TESTLIB_HARNESS + checker.source
        stdin = [
            "".join(f"{len(text.encode())}\n{text}" for text in (case.input, actual, case.output))
            for case, actual in checked
        ]
    return Job(
        program=program,
        stdin_cases=tuple(stdin),
        limits=limits,
        files={path: text.encode() for path, text in checker.files.items()},
        language=checker.language,
    )


def checker_program(source: str) -> str:
    """The program a Python checker job runs for each case: the case's files written from its
    stdin, then the checker as ``checker.py`` with its own ``__future__`` flags and namespace."""
    return (
        "import json, sys\n"
        "case = json.loads(sys.stdin.read())\n"
        f"for name in {CHECKER_FILES!r}:\n"
        "    with open(name, 'w', encoding='utf-8') as stream:\n"
        "        stream.write(case[name])\n"
        f"sys.argv = ['checker.py', *{CHECKER_FILES!r}]\n"
        "sys.stdin = open('input.txt', encoding='utf-8')\n"
        "del case, name, stream\n"
        f"exec(compile({source!r}, 'checker.py', 'exec', dont_inherit=True),"
        " {'__name__': '__main__', '__builtins__': __builtins__})\n"
    )


# Put before a C++ checker: before main (and before the checker's own globals), it writes the
# three files from stdin (each "<bytes>\n<text>"), makes the input its stdin, and runs the
# binary again as testlib runs a checker: ``checker input.txt output.txt answer.txt``. The
# checker's source follows unchanged (``#line``: its errors name its own lines), and
# ``<bits/stdc++.h>`` first keeps the image's precompiled header in use.
TESTLIB_HARNESS = (
    """#include <bits/stdc++.h>
#include <fcntl.h>
#include <unistd.h>
namespace codepost_checker {
static std::string read_part() {
    unsigned long size = 0;
    if (std::scanf("%lu", &size) != 1 || std::getchar() != '\\n') std::_Exit(3);
    std::string text(size, '\\0');
    if (size && std::fread(&text[0], 1, size, stdin) != size) std::_Exit(3);
    return text;
}
static void write_file(const char* name, const std::string& text) {
    std::FILE* file = std::fopen(name, "wb");
    if (!file || std::fwrite(text.data(), 1, text.size(), file) != text.size()) std::_Exit(3);
    if (std::fclose(file) != 0) std::_Exit(3);
}
__attribute__((constructor(101))) static void run_as_testlib(int argc, char** argv) {
    if (argc > 1) return;
    static char names[][12] = {"""
    + ", ".join(f'"{name}"' for name in TESTLIB_FILES)
    + """};
    for (char* name : names) write_file(name, read_part());
    int input = open(names[0], O_RDONLY);
    if (input < 0 || dup2(input, 0) < 0) std::_Exit(3);
    close(input);
    char* args[] = {argv[0], names[0], names[1], names[2], nullptr};
    execv("/proc/self/exe", args);
    std::_Exit(3);
}
}  // namespace codepost_checker
#line 1 "checker.cpp"
"""
)


def checker_error(outcome: CaseOutcome | None, language: str = PYTHON) -> str | None:
    """None when the checker accepted the output, else why not (a C++ checker's exit status
    read as testlib's)."""
    if outcome is None:
        return "the checker did not run"
    if outcome.status is not ExecStatus.COMPLETED:
        result = TESTLIB_RESULTS.get(outcome.exit_code or 0) if language != PYTHON else None
        if result is None or outcome.status is not ExecStatus.RUNTIME_ERROR:
            return f"the checker rejected the output ({case_error(outcome)})"
        detail = outcome.stderr.strip().splitlines()
        return f"the checker rejected the output: {result}" + (
            f" ({clip(detail[-1].strip())})" if detail else ""
        )
    first = outcome.stdout.strip().split("\n", 1)[0].strip()
    try:
        score = float(first)
    except ValueError:
        return None
    return None if score == 1 else f"the checker scored the output {first}"
