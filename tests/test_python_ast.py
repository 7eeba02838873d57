"""No two ``ast.parse`` calls of the verifier run at once (CPython 3.11's AST converter keeps
its recursion depth per interpreter: concurrent parses in scoring threads failed a run with
``SystemError: AST constructor recursion depth mismatch``); a statement's own text, moved to
column 0, stands for it exactly."""

from __future__ import annotations

import ast
import contextlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from codepost.verifiers import load_problems
from codepost.verifiers.extraction import parse
from codepost.verifiers.python_ast import parse_python, statement_source
from codepost.verifiers.rewards import syntax_reward


def test_parses_from_many_threads_never_overlap(monkeypatch):
    inside, most = 0, 0
    count = threading.Lock()
    real_parse = ast.parse

    def slow_parse(source, *args, **kwargs):
        nonlocal inside, most
        with count:
            inside += 1
            most = max(most, inside)
        time.sleep(0.002)  # a thread switch in the middle, every time
        try:
            return real_parse(source, *args, **kwargs)
        finally:
            with count:
                inside -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    calls = [
        lambda: parse("def f(x):\n    return x\n"),
        lambda: syntax_reward("def f(x) return x\n"),
        lambda: parse_python("x = 1\n"),
        lambda: load_problems("mbpp-sanitized"),  # validates every assert line by parsing it
    ]
    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(calls[i % len(calls)]) for i in range(8)]:
            future.result()
    assert most == 1


def test_a_statement_keeps_its_text_unless_moving_it_would_change_it():
    body = (
        "def check(candidate):\n"
        "    assert candidate([1,2,\n"
        "                      3]) == 'é'  # kept\n"
        "    for x in range(2):\n"
        "        assert candidate(x)\n"
        '    assert candidate("""a\n'
        '    b""")\n'
        "    y = 1; assert y\n"
    )
    statements = ast.parse(body).body[0].body
    moved = [statement_source(body.split("\n"), statement) for statement in statements]
    assert moved[:2] == [
        "assert candidate([1,2,\n                  3]) == 'é'",
        "for x in range(2):\n    assert candidate(x)",
    ]
    # A string over two lines keeps its four spaces; a statement after another on its line
    # has no column of its own: both are rendered from the tree.
    assert moved[2:] == [ast.unparse(statement) for statement in statements[2:]]
    assert "a\\n    b" in moved[2]
    for statement, text in zip(statements, moved, strict=True):
        assert ast.dump(ast.parse(text).body[0]) == ast.dump(statement, include_attributes=False)


def test_a_parse_outside_the_lock_in_another_thread_does_not_fail_ours():
    """A library's own ``ast.parse`` in another thread, let in by a finalizer that the garbage
    collector runs mid-parse, reset the converter's shared depth: the run's problems failed to
    load with ``SystemError`` (CPython 3.11.7, CI)."""
    source = "\n".join(
        f"def f{i}(x):\n    return [x + {i} for _ in x] or {{'a': ({i},)}}" for i in range(300)
    )

    class Cycle:
        def __del__(self):
            time.sleep(0)  # the interpreter lock may pass to the other thread here

    def library_parses():
        for _ in range(80):
            ring = [Cycle() for _ in range(100)]
            for node, after in zip(ring, ring[1:] + ring[:1], strict=True):
                node.after = after
            del ring  # garbage for the collector, whose finalizers run inside the next parse
            with contextlib.suppress(SystemError):  # its own collisions are not ours to fix
                ast.parse(source)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        library = threading.Thread(target=library_parses)
        library.start()
        trees = []
        while library.is_alive():
            trees.append(parse_python(source))
        library.join()
    finally:
        sys.setswitchinterval(interval)
    assert trees and all(len(tree.body) == 300 for tree in trees)
