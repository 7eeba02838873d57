"""From a model's completion to the program that runs in the sandbox.

Two styles: a *continuation* is raw code that follows the prompt (HumanEval with a base
model); a *chat* answer wraps code in markdown fences among prose and ``<think>`` blocks. A chat
answer's code is the block in the problem's language (``languages``): Python's is read with its
AST (the block that defines the entry point; the prompt's imports go first), any other
language's block is taken whole.
"""

from __future__ import annotations

import ast
import io
import itertools
import re
from dataclasses import dataclass
from typing import Any, Literal

from .languages import PYTHON, source_language
from .problems import Problem
from .python_ast import is_docstring, parse_python

CompletionStyle = Literal["auto", "continuation", "chat"]
# Longer completions are failed unread: parsing code costs ~300 times its size in host memory
# (a 10 MB completion took 3.3 GB), and no honest answer comes near this.
MAX_COMPLETION_CHARS = 256 * 1024
COMPLETION_STYLES: tuple[str, ...] = ("auto", "continuation", "chat")
PYTHON_LANGUAGES = frozenset(source_language(PYTHON).fences)

_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_QUOTE_OR_COMMENT = re.compile(r"[#'\"]")


@dataclass(frozen=True)
class CodeBlock:
    language: str  # lower-cased info string ("" when none)
    code: str
    closed: bool  # False when the completion ended inside the block

    @property
    def is_python(self) -> bool:
        return self.language in PYTHON_LANGUAGES


def strip_think(text: str) -> str:
    """Drop ``<think>`` blocks, an unclosed one included, and a reasoning prefix whose
    ``<think>`` was in the prompt (the text ends it with a bare ``</think>``)."""
    head, closing, tail = text.partition("</think>")
    if closing and "<think>" not in head:
        text = tail
    return _THINK_BLOCK.sub("", text)


def fence(line: str) -> tuple[str, str] | None:
    """The backticks and lower-cased language of a CommonMark backtick fence line, else None.

    String operations, not a regex: a pattern with two overlapping runs is quadratic on one
    long line that starts with a fence, and this runs on the host on untrusted text.
    """
    rest = line.lstrip(" \t")
    if len(line) - len(rest) > 3:
        return None
    info = rest.lstrip("`")
    ticks = len(rest) - len(info)
    if ticks < 3 or "`" in info:
        return None
    words = info.split(maxsplit=1)
    return rest[:ticks], words[0].lower() if words else ""


def _unescaped(line: str, quote: str, start: int) -> int:
    """Where ``quote`` next ends a string in ``line`` (not after an odd run of backslashes)."""
    at = line.find(quote, start)
    while at >= 0:
        escape = at
        while escape > start and line[escape - 1] == "\\":
            escape -= 1
        if (at - escape) % 2 == 0:
            return at
        at = line.find(quote, at + 1)
    return -1


def open_triple_quote(line: str, quote: str | None) -> str | None:
    """The Python triple quote still open after ``line``, given the one open before it: a
    fence line inside a triple-quoted string is part of the code, not its end."""
    at = 0
    while True:
        if quote is not None:
            end = _unescaped(line, quote, at)
            if end < 0:
                return quote
            at, quote = end + 3, None
        match = _QUOTE_OR_COMMENT.search(line, at)
        if match is None or match.group() == "#":
            return None
        char, at = match.group(), match.start()
        if line.startswith(char * 3, at):
            quote, at = char * 3, at + 3
            continue
        end = _unescaped(line, char, at + 1)
        if end < 0:  # an unterminated one-line string: the line ends it (a syntax error)
            return None
        at = end + 1


def find_code_blocks(text: str) -> list[CodeBlock]:
    """Markdown fenced blocks in order (CommonMark backtick fences).

    In a Python block a closing fence inside a triple-quoted string is code. Should that
    leave the last block unclosed (the code's quotes do not balance), it ends at the first
    such fence after all.
    """
    blocks: list[CodeBlock] = []
    opening: tuple[str, str] | None = None
    lines: list[str] = []
    quote: str | None = None
    first_skipped: int | None = None  # lines of the block before a fence taken as code
    for line in text.splitlines():
        found = fence(line)
        if opening is None:
            if found:
                opening, lines, quote, first_skipped = found, [], None, None
            continue
        closes = found is not None and not found[1] and found[0].startswith(opening[0])
        if closes and quote is None:
            blocks.append(CodeBlock(opening[1], _joined(lines), closed=True))
            opening = None
            continue
        if closes and first_skipped is None:
            first_skipped = len(lines)
        lines.append(line)
        if opening[1] in PYTHON_LANGUAGES:
            quote = open_triple_quote(line, quote)
    if opening is not None:
        closed = first_skipped is not None
        code = lines[:first_skipped] if closed else lines
        blocks.append(CodeBlock(opening[1], _joined(code), closed=closed))
    return blocks


def _joined(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def parse(source: str) -> ast.Module | None:
    """The AST of untrusted code, or None when it does not parse (a parser stack overflow on
    deeply nested code is a MemoryError or RecursionError, not a SyntaxError)."""
    try:
        return parse_python(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def defines(code: str, name: str) -> bool:
    """Whether ``code`` binds ``name`` at top level (a regex fallback for broken code)."""
    tree = parse(code)
    if tree is None:
        return (
            re.search(rf"^(?:async\s+def|def|class)\s+{re.escape(name)}\b", code, re.M) is not None
        )
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def extract_code(text: str, entry_point: str | None = None, language: str = PYTHON) -> str:
    """The code of a chat answer in ``language``.

    Among the fenced blocks of that language outside ``<think>`` (``cpp``, ``c++``, ``cc`` or
    ``cxx`` for C++): for Python, the last one that defines the entry point, else the longest
    (the last of equals). No block of the language: any block; no block at all: the whole
    answer, as a model that skips the fences writes bare code.
    """
    text = strip_think(text)
    blocks = find_code_blocks(text)
    tags = source_language(language).fences
    candidates = [block for block in blocks if block.language in tags] or blocks
    if not candidates:
        return text
    if entry_point and language == PYTHON:
        defining = [block for block in candidates if defines(block.code, entry_point)]
        if defining:
            return defining[-1].code
    longest = max(len(block.code) for block in candidates)
    return next(block.code for block in reversed(candidates) if len(block.code) == longest)


def import_lines(source: str) -> str:
    """The top-level import statements of ``source``; for source that does not parse, its
    lines that are import statements on their own (so prose such as "from the list, ..." is
    not one)."""
    tree = parse(source)
    if tree is None:
        return "".join(
            line + "\n"
            for line in source.splitlines()
            if re.match(r"(?:import|from)\s+\w", line) and parse(line) is not None
        )
    return "".join(
        ast.unparse(node) + "\n"
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
    )


def completion_text(completion: Any) -> str:
    """A completion as text: a string, or a chat message list (TRL's conversational format),
    whose last assistant message is the answer."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role") == "assistant":
                content = message.get("content") or ""
                if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
                    content = "".join(str(part.get("text", "")) for part in content)
                return str(content)
    raise TypeError(
        "a completion must be a string or a list of chat messages with an assistant message, "
        f"got {type(completion).__name__}"
    )


def resolve_style(completion: str, style: CompletionStyle) -> Literal["continuation", "chat"]:
    if style not in COMPLETION_STYLES:
        raise ValueError(f"completion_style must be one of {COMPLETION_STYLES}, got {style!r}")
    if style != "auto":
        return style
    markers = ("```", "<think>", "</think>")
    return "chat" if any(marker in completion for marker in markers) else "continuation"


@dataclass(frozen=True)
class Program:
    source: str  # what the sandbox runs
    code: str  # the model's own code (rule rewards look at this, not at the trusted prompt)
    style: Literal["continuation", "chat"]
    code_line: int = 1  # the line of ``source`` where ``code`` starts
    language: str = PYTHON


def prompt_code(problem: Problem) -> str:
    """What of the prompt runs before other code: the prompt when it is code that parses on
    its own (its imports and helpers, e.g. HumanEval/38's ``encode_cyclic``), its import
    lines when it is code that does not, nothing when it is prose."""
    if not problem.prompt_is_code:
        return ""
    return problem.prompt if parse(problem.prompt) is not None else import_lines(problem.prompt)


def future_imports(code: str) -> tuple[str, str]:
    """``code`` split after its leading ``from __future__`` imports (and the docstring and
    comments before them), which must stay first when other code goes before the rest."""
    tree = parse(code)
    if tree is None:
        return "", code
    body = tree.body[1:] if tree.body and is_docstring(tree.body[0]) else tree.body
    futures = list(itertools.takewhile(_is_future_import, body))
    if not futures:
        return "", code
    end = futures[-1].end_lineno or futures[-1].lineno
    if any(node.lineno <= end for node in body[len(futures) :]):  # `...; import os`: keep all
        return "", code
    lines = io.StringIO(code, newline="").readlines()  # the line ends Python's parser knows
    return "".join(lines[:end]), "".join(lines[end:])


def _is_future_import(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def build_program(problem: Problem, completion: str, style: CompletionStyle = "auto") -> Program:
    """The candidate program for a completion.

    continuation: prompt + completion when the prompt is code, else the completion.
    chat: the extracted code; for Python, after ``prompt_code`` (the answer's definitions come
    later and win), its own ``from __future__`` imports first.
    """
    resolved = resolve_style(completion, style)
    language = problem.language
    if resolved == "continuation":
        prefix = problem.prompt if problem.prompt_is_code else ""
        start = prefix.count("\n") + 1
        return Program(prefix + completion, completion, resolved, start, language)
    code = extract_code(completion, problem.entry_point, language)
    if language != PYTHON:
        return Program(code, code, resolved, language=language)
    prefix = prompt_code(problem)
    prefix = prefix.rstrip("\n") + "\n\n\n" if prefix.strip() else ""
    if prefix:
        future, rest = future_imports(code)
        prefix = future + prefix
        return Program(prefix + rest, code, resolved, prefix.count("\n") + 1)
    return Program(code, code, resolved)
