"""``call``: a function called with JSON arguments, its return value compared with the expected
one (APPS/TACO and SYNTHETIC-1 ``fn_name`` problems, LiveCodeBench's functional ones, LeetCode
``class Solution`` methods).

The judge calls the program's ``fn_name``, or ``Solution().fn_name`` when the program defines a
``Solution`` class (as APPS' ``testing_util.run_test`` and LiveCodeBench's ``compile_code``
do; here a fresh ``Solution`` per test, as LeetCode's own judge runs each case), and compares
in the judge, on plain data only, as the data set's reference harness does:

* ``value`` (LiveCodeBench's ``grade_call_based``): a returned tuple becomes a list, then
  ``==`` with the expected value;
* ``apps`` (APPS' ``testing_util.run_test``, which TACO and SYNTHETIC-1 use): the same, and
  also accepted when the expected value is a non-empty list whose first element equals the
  result (outputs are stored as ``[value]``), or a list of tuples that equals it as lists;
  JSON's string keys of a dict (the first argument, or the result) are read as ints where
  they all are.

The program runs after the imports LiveCodeBench's harness gives it (``typing``,
``collections``, ``heapq``, ``math``...), as far as it uses their names, so ``List[int]`` in a
LeetCode signature resolves.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import string
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from ...sandbox import Job, JudgeSpec, Limits
from ..extraction import future_imports, parse
from ..judges import longest_first, short_name
from . import FormTests, JudgedForm, register, without_none

if TYPE_CHECKING:
    from ..problems import Problem

# The names LiveCodeBench's grade_call_based gives a program (its import_string): ``from m
# import *`` of each, then of builtins and typing, then ``import m`` of each; the later wins.
PRELUDE_MODULES = (
    *("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random"),
    *("statistics", "itertools", "functools", "operator", "io", "sys", "json"),
)
# The judge's side: each test calls the function and compares on plain data. ``__cases`` holds
# ``[arguments, expected]`` pairs; the program's objects are references that equal nothing.
JUDGE_SETUP = string.Template("""
import json

__cases = json.loads($cases)


def __target():
    if "Solution" in __remote_names__():
        return getattr(__remote__("Solution")(), $fn_name)
    return __remote__($fn_name)


def __matches(output, expected):
    if isinstance(output, tuple):  # ground truth sequences are lists
        output = list(output)
    if output == expected:
        return True
    if $compare != "apps":
        return False
    if isinstance(expected, list) and expected and output == expected[0]:
        return True
    try:
        return (
            isinstance(output, list)
            and isinstance(output[0], tuple)
            and [list(x) for x in output] == expected[0]
        )
    except (IndexError, KeyError, TypeError):
        return False


def __int_keys(mapping):
    try:
        return {int(key): value for key, value in mapping.items()}
    except (TypeError, ValueError):
        return mapping


def __apps_case(arguments, expected):
    # APPS: "JSON forces dictionaries to have string keys"; an expected dict goes in a list
    if arguments and isinstance(arguments[0], dict):
        arguments = [__int_keys(arguments[0]), *arguments[1:]]
    if isinstance(expected, dict):
        expected = [__int_keys(expected)]
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        expected = [__int_keys(expected[0])]
    return arguments, expected


def __clip(value):
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def __call_case(index):
    arguments, expected = __cases[index]
    if $compare == "apps":
        arguments, expected = __apps_case(arguments, expected)
    output = __target()(*arguments)
    if not __matches(output, expected):
        raise AssertionError(f"returned {__clip(output)}, expected {__clip(expected)}")
""")


@functools.cache
def _prelude_names() -> dict[str, str | None]:
    """Each name the prelude binds -> the module it comes from (None: the module itself;
    ``builtins``: the builtin, which needs no import)."""
    names: dict[str, str | None] = {}
    for module in (*PRELUDE_MODULES, "builtins", "typing"):
        imported = importlib.import_module(module)
        public = getattr(imported, "__all__", None) or dir(imported)
        names.update((name, module) for name in public if not name.startswith("_"))
    names.update(dict.fromkeys(PRELUDE_MODULES))
    return names


def prelude(program: str) -> str:
    """The part of LiveCodeBench's imports the program uses, as its own lines: importing all of
    them costs a fresh process about 0.25 s; a name resolves to what it would there."""
    tree = parse(program)
    if tree is None:  # it will not load anyway
        return ""
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    lines = []
    for name, module in sorted(_prelude_names().items()):
        if name not in used or module == "builtins":
            continue
        lines.append(f"import {name}\n" if module is None else f"from {module} import {name}\n")
    return "".join(lines) + "import sys as __sys\n__sys.setrecursionlimit(50000)\ndel __sys\n\n"


class CallCase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    args: tuple[Any, ...]  # the positional arguments, JSON values
    expected: Any  # the JSON value the call must return


class CallTests(FormTests):
    form: Literal["call"] = "call"
    fn_name: str
    call: tuple[CallCase, ...]
    compare: Literal["value", "apps"] = "value"
    starter_code: str = ""  # shown in the prompt (a signature, a ``class Solution``)
    # The cases a model may see, where the data set ships them (LiveCodeBench's
    # public_test_cases); () when it ships none; None: the first case is.
    public_call: tuple[CallCase, ...] | None = None

    @field_validator("fn_name")
    @classmethod
    def _a_name(cls, name: str) -> str:
        if not name.isidentifier() or name.startswith("__"):
            raise ValueError(f"not a function name: {name!r}")
        return name

    @model_validator(mode="after")
    def _has_cases(self) -> CallTests:
        if not self.call:
            raise ValueError("call has no cases")
        cases = (*self.call, *(self.public_call or ()))
        json.dumps([(case.args, case.expected) for case in cases])  # JSON values only
        return self

    @model_serializer(mode="wrap")
    def _without_unset_split(self, write: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_none(write(self), "public_call")

    def count(self) -> int:
        return len(self.call)

    def capped(self, max_tests: int) -> CallTests:
        kept = longest_first(self.call, max_tests, lambda case: len(json.dumps(case.args)))
        return self.model_copy(update={"call": kept})

    def public(self) -> CallTests | None:
        cases = self.call[:1] if self.public_call is None else self.public_call
        return self.model_copy(update={"call": cases, "public_call": None}) if cases else None

    def shown(self, index: int) -> tuple[tuple[str, str], ...]:
        case = self.call[index]
        return (("Call", call_text(self.fn_name, case)), ("Expected", json.dumps(case.expected)))


class CallForm(JudgedForm):
    tests_model = CallTests
    marker = "call"

    def instructions(self, problem: Problem) -> list[str]:
        tests: CallTests = problem.tests  # type: ignore[assignment]
        if tests.starter_code.strip():
            return [
                f"Use the following starter code:\n```python\n{tests.starter_code.rstrip()}\n```"
            ]
        return [
            f"Write a Python function `{tests.fn_name}`: the tests call it with their "
            "arguments and compare what it returns."
        ]

    def build_job(self, problem: Problem, program: str, limits: Limits, *, all_cases: bool) -> Job:
        tests: CallTests = problem.tests  # type: ignore[assignment]
        future, rest = future_imports(program)
        cases = [[list(case.args), case.expected] for case in tests.call]
        setup = JUDGE_SETUP.substitute(
            cases=repr(json.dumps(cases)), fn_name=repr(tests.fn_name), compare=repr(tests.compare)
        )
        names = tuple(short_name(call_text(tests.fn_name, case)) for case in tests.call)
        return Job(
            program=future + prelude(rest) + rest,
            judge=JudgeSpec(
                setup=setup,
                tests=tuple(f"__call_case({index})\n" for index in range(len(names))),
                test_names=names,
            ),
            limits=limits,
        )


register(CallForm())


def call_text(fn_name: str, case: CallCase) -> str:
    """A case as the call it makes: ``f(1, [2, 3])``."""
    return f"{fn_name}({json.dumps(list(case.args))[1:-1]})"
