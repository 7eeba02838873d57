"""Parsing Python source safely from several threads.

CPython before 3.12.4 / 3.11.10 keeps the AST converter's recursion depth per interpreter, not
per thread: two ``ast.parse`` calls at once can fail with ``SystemError: AST constructor
recursion depth mismatch`` (python/cpython#106905). Scoring fans out over threads, so every
parse in the verifier goes through one lock; a parse takes microseconds to milliseconds.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, one thread at a time; raises what ``ast.parse`` raises."""
    with _LOCK:
        return ast.parse(source)


def is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )
