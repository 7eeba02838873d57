"""Parsing Python source safely from several threads.

CPython before 3.12.4 / 3.11.10 keeps the AST converter's recursion depth per interpreter, not
per thread: two ``ast.parse`` calls at once can fail with ``SystemError: AST constructor
recursion depth mismatch`` (python/cpython#106905). Scoring fans out over threads, so every
parse in the verifier goes through one lock; a parse takes microseconds to milliseconds.
"""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import Sequence

_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, one thread at a time; raises what ``ast.parse`` raises."""
    with _LOCK:
        return ast.parse(source)


@functools.lru_cache(maxsize=64)
def parse_tests(source: str) -> ast.Module:
    """A problem's test source parsed once for all its samples (a caller's inline test module
    may be megabytes, and a request may hold many samples of it). The tree is shared: read it,
    never change it."""
    return parse_python(source)


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
