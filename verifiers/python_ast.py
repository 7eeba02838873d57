"""Parsing Python source safely from several threads, and a problem's own code within bounds.

CPython before 3.12.4 / 3.11.10 keeps the AST converter's recursion depth per interpreter, not
per thread: two ``ast.parse`` calls at once can fail with ``SystemError: AST constructor
recursion depth mismatch`` (python/cpython#106905). Scoring fans out over threads, so every
parse in codepost goes through one lock; a parse takes microseconds to milliseconds. A library
parsing in another thread is outside that lock (a collision failed a CI run while problems were
read): the parse is pure and the error comes after the whole tree is built, so it is parsed again.

No tree is cached: a tree is about 700 times its source's size, and what the verifier keeps of
a problem's code is what it derived from the tree (``forms.kept_with_tests``), for as long as
the problem lives.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Sequence

from .bounds import reading_bounds

_LOCK = threading.Lock()
_COLLISION = "AST constructor recursion depth mismatch"
_TRIES = 5


def parse_python(source: str | bytes) -> ast.Module:
    """``ast.parse(source)``, one thread at a time; raises what ``ast.parse`` raises."""
    with _LOCK:
        for _ in range(_TRIES - 1):
            try:
                return ast.parse(source)
            except SystemError as error:
                if _COLLISION not in str(error):
                    raise
        return ast.parse(source)


def parse_problem_code(source: str, what: str) -> ast.Module:
    """A problem's own code (``what``: its field) parsed, within the bound on a piece of code
    of the problems being read (:mod:`.bounds`): ValueError naming it past that bound."""
    check_code_length(source, what)
    return parse_python(source)


def check_code_length(source: str, what: str) -> None:
    """ValueError naming ``what`` when a problem's code is longer than the problems being read
    may have: one ``ast.parse`` of it would hold the interpreter lock that much longer."""
    bounds = reading_bounds()
    limit = bounds.code_chars
    if limit is not None and len(source) > limit:
        raise ValueError(
            f"{what} is {len(source)} characters of Python, over the {limit} a piece of a "
            "problem's code may have here"
        )
    if bounds.budget is not None:
        bounds.budget.spend("code_chars", len(source), what)


def is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def statement_source(lines: Sequence[str], statement: ast.stmt) -> str:
    """``statement`` as written (its layout and comments) in the source split into ``lines`` at
    each newline, moved to column 0. Where its lines cannot be moved as they are (a string
    literal over several lines, whose text would change; a line indented less than the
    statement; a statement after another on its line), ``ast.unparse``'s rendering instead,
    which is a hundred times slower: HumanEval's 164 test modules hold 1,196 statements."""
    first, last = statement.lineno - 1, (statement.end_lineno or statement.lineno) - 1
    start = lines[first].encode()  # the offsets count UTF-8 bytes
    indent = start[: statement.col_offset].decode()
    if indent.strip():
        return ast.unparse(statement)
    if first == last:
        return start[statement.col_offset : statement.end_col_offset].decode()
    if any(
        isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno != node.lineno
        for node in ast.walk(statement)
    ):
        return ast.unparse(statement)
    inner = [*lines[first + 1 : last], lines[last].encode()[: statement.end_col_offset].decode()]
    if any(line and not line.startswith(indent) for line in inner):
        return ast.unparse(statement)
    return "\n".join(
        [start[statement.col_offset :].decode()] + [line[len(indent) :] for line in inner]
    )
