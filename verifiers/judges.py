"""Problems -> sandbox jobs: each problem's test form builds its job and judge (``forms``).

All test code and expected values stay trusted: they run in the judge, never in the candidate
program's process, and expected output never enters the sandbox with the program.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from ..sandbox import ValueCase
from .forms import form_of
from .python_ast import parse_python

if TYPE_CHECKING:
    from ..sandbox import Job, Limits
    from .problems import Problem

_NAME_CHARS = 100
T = TypeVar("T")
# Arithmetic folded in literals, as Python computes it (``3 * 19``, ``0 ** 0``, ``2.0 / 3.0``),
# on numbers whose results stay small: a test's own ``10 ** 10 ** 9`` is the judge's to time out.
_ARITHMETIC: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FOLDED_BITS = 10_000  # the largest int folded (the codec's limit for decimal ints)
_FOLDED_CHARS = 100_000  # the longest string folded from literals joined with +


def build_job(problem: Problem, program: str, limits: Limits, *, all_cases: bool = True) -> Job:
    """The sandbox job of a problem; ``all_cases=False`` (a binary reward) lets it stop at
    the first case that crashed or hit a limit."""
    return form_of(problem).build_job(problem, program, limits, all_cases=all_cases)


def short_name(source: str) -> str:
    """A test's name in a verdict: its first line, clipped."""
    first = source.strip().splitlines()[0]
    return first if len(first) <= _NAME_CHARS else first[: _NAME_CHARS - 3] + "..."


def longest_first(items: Sequence[T], count: int, size: Callable[[T], int]) -> tuple[T, ...]:
    """The ``count`` items of largest ``size`` (ties: the earlier), in their own order: a cap
    on the tests of a training reward that keeps the ones most likely to fail (rllm's
    ``check_correctness`` keeps the longest inputs)."""
    chosen = sorted(range(len(items)), key=lambda i: (-size(items[i]), i))[:count]
    return tuple(items[i] for i in sorted(chosen))


def value_case(source: str, callee: str) -> ValueCase | None:
    """A test, one statement, as plain data (``JudgeSpec.values``) when it is one:
    ``assert callee(<literals>) == <literal>``, ``... is True`` (False, None),
    ``assert abs(callee(<literals>) - <literal>) < <literal>`` or ``assert <literal>``, its
    message a string literal if it has one. Literals may hold arithmetic on numbers and
    strings joined with ``+`` (folded: ``_literal``). None for any other test, which runs in the
    judge."""
    body = parse_python(source).body
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return None
    test, message = body[0].test, body[0].msg
    if message is not None and not (
        isinstance(message, ast.Constant) and isinstance(message.value, str)
    ):
        return None
    if any(isinstance(node, ast.Constant) and node.value is ... for node in ast.walk(test)):
        return None  # a literal the codec does not carry
    text = None if message is None else str(message.value)
    try:
        if not isinstance(test, ast.Compare):
            return ValueCase(None, _literal(test), text)
        if len(test.ops) != 1:
            return None
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if isinstance(op, ast.Eq) and _is_call(left, callee):
            return ValueCase(_arguments(left), _literal(right), text)
        if (
            isinstance(op, ast.Is)
            and _is_call(left, callee)
            and isinstance(right, ast.Constant)
            and any(right.value is v for v in (True, False, None))
        ):
            return ValueCase(_arguments(left), right.value, text, compare="is")
        if (
            isinstance(op, ast.Lt)
            and _is_call(left, "abs")
            and len(left.args) == 1
            and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)
        ):
            difference = left.args[0]
            expected, tolerance = _literal(difference.right), _literal(right)
            if _is_call(difference.left, callee) and _is_number(expected) and _is_number(tolerance):
                return ValueCase(_arguments(difference.left), expected, text, "close", tolerance)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass  # not literals (``{[1]}``, ``x + 1``): the judge evaluates them
    return None


# Names through which code reaches any binding, builtins included, without naming it.
_INDIRECT = frozenset(
    {"builtins", "__builtins__", "__builtin__", "globals", "locals", "vars", "exec", "eval",
     "compile", "getattr", "setattr", "delattr", "__import__", "importlib", "sys", "gc",
     "inspect", "ctypes"}
)  # fmt: skip
# Attributes that reach a namespace besides a dunder one (``f.__globals__``): a frame's.
_FRAME_ATTRIBUTES = frozenset(
    {"f_globals", "f_locals", "f_builtins", "f_back", "tb_frame", "gi_frame", "cr_frame",
     "ag_frame"}
)  # fmt: skip


def may_rebind(code: str, names: Collection[str]) -> bool:
    """Whether running ``code`` may change what ``names`` mean at its top level (value tests
    assume a problem's setup, which they skip, leaves them as they were): any binding of one
    of them anywhere in it (assignment and unpacking, ``del``, imports, definitions at any
    depth, ``global``, ``:=``, loop, ``with`` and ``except`` targets, match captures,
    parameters), a star import, or a way to bind without naming (``builtins``, ``globals()``,
    ``exec``, ``getattr``, ``sys.modules``, ``gc``, ``inspect``, any dunder attribute such as a
    function's ``__globals__``, a frame's ``f_globals``). Code that does not parse may."""
    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            bound = node.id in _INDIRECT or (
                node.id in names and not isinstance(node.ctx, ast.Load)
            )
        elif isinstance(node, ast.alias):
            imported = (node.asname or node.name).split(".")[0]
            bound = node.name == "*" or imported in names or node.name.split(".")[0] in _INDIRECT
        elif isinstance(node, ast.Attribute):
            attr = node.attr
            bound = (attr.startswith("__") and attr.endswith("__")) or attr in _FRAME_ATTRIBUTES
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound = any(name in names for name in node.names)
        else:
            bound = _bound_name(node) in names
        if bound:
            return True
    return False


def _bound_name(node: ast.AST) -> str | None:
    """The name a definition, handler, parameter or match capture binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
        return node.name
    if isinstance(node, ast.arg):
        return node.arg
    if isinstance(node, ast.MatchMapping):
        return node.rest
    return None


def _is_call(node: ast.expr, callee: str) -> TypeGuard[ast.Call]:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == callee
        and not node.keywords
    )


def _arguments(call: ast.Call) -> tuple[Any, ...]:
    return tuple(_literal(argument) for argument in call.args)


def _literal(node: ast.expr) -> Any:
    """``ast.literal_eval`` of ``node``, with its arithmetic folded first (``_ARITHMETIC``);
    ValueError where it is not a literal or its arithmetic is not folded."""
    return ast.literal_eval(_Folder().visit(node))


class _Folder(ast.NodeTransformer):
    """Arithmetic on number literals, and string literals joined with ``+``, replaced by its
    value, computed as Python computes it, wherever the result stays small."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        folded = ast.BinOp(self.visit(node.left), node.op, self.visit(node.right))
        left, right = folded.left, folded.right
        if not (isinstance(left, ast.Constant) and isinstance(right, ast.Constant)):
            return folded
        a, b, compute = left.value, right.value, _ARITHMETIC.get(type(node.op))
        if type(a) is str and type(b) is str and isinstance(node.op, ast.Add):
            if len(a) + len(b) <= _FOLDED_CHARS:
                return ast.Constant(a + b)
        elif compute and _is_number(a) and _is_number(b) and _small(node.op, a, b):
            try:
                return ast.Constant(compute(a, b))
            except ArithmeticError:  # 1 / 0: the test itself raises, in the judge
                pass
        return folded

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        return ast.UnaryOp(node.op, self.visit(node.operand))


def _is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float, not a bool (``True + 1`` is the judge's to compute)."""
    return type(value) in (int, float)


def _small(op: ast.operator, a: int | float, b: int | float) -> bool:
    """Whether ``a op b`` is an int of at most ``_FOLDED_BITS`` bits (or a float)."""
    bits = [abs(x).bit_length() for x in (a, b) if type(x) is int]
    if isinstance(op, ast.Pow):
        return (
            type(b) is int
            and abs(b) <= 1024
            and (type(a) is float or bits[0] * abs(b) <= _FOLDED_BITS)
        )
    if isinstance(op, ast.Mult):
        return sum(bits) <= _FOLDED_BITS
    return max(bits, default=0) <= _FOLDED_BITS


def value_cases(sources: Iterable[str], callee: str) -> tuple[ValueCase, ...] | None:
    """Every test as plain data (``value_case``), or None when any one is not: a job's tests
    go to the judge together or not at all."""
    cases = []
    for source in sources:
        case = value_case(source, callee)
        if case is None:
            return None
        cases.append(case)
    return tuple(cases)
