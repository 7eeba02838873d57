"""From a model's completion to the program that runs in the sandbox.

Two styles: a *continuation* is raw code that follows the prompt (HumanEval with a base
model); a *chat* answer wraps code in markdown fences among prose and ``<think>`` blocks.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Literal

from .problems import Problem

CompletionStyle = Literal["auto", "continuation", "chat"]
COMPLETION_STYLES: tuple[str, ...] = ("auto", "continuation", "chat")
PYTHON_LANGUAGES = frozenset({"", "python", "py", "python3", "py3"})

_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_FENCE = re.compile(r"^[ \t]{0,3}(`{3,})[ \t]*([^`\s]*)[^`]*$")


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


def find_code_blocks(text: str) -> list[CodeBlock]:
    """Markdown fenced blocks in order (CommonMark backtick fences)."""
    blocks: list[CodeBlock] = []
    fence: str | None = None
    language, lines = "", []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence, language, lines = match.group(1), match.group(2).lower(), []
        elif match and not match.group(2) and match.group(1).startswith(fence):
            blocks.append(CodeBlock(language, "\n".join(lines) + "\n", closed=True))
            fence = None
        else:
            lines.append(line)
    if fence is not None:
        blocks.append(CodeBlock(language, "\n".join(lines) + "\n" if lines else "", closed=False))
    return blocks


def parse(source: str) -> ast.Module | None:
    """The AST of untrusted code, or None when it does not parse (a parser stack overflow on
    deeply nested code is a MemoryError or RecursionError, not a SyntaxError)."""
    try:
        return ast.parse(source)
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


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of a chat answer.

    Among the fenced Python blocks outside ``<think>``: the last one that defines the entry
    point, else the longest (the last of equals). No Python block: any block; no block at
    all: the whole answer, as a model that skips the fences writes bare code.
    """
    text = strip_think(text)
    blocks = find_code_blocks(text)
    candidates = [block for block in blocks if block.is_python] or blocks
    if not candidates:
        return text
    if entry_point:
        defining = [block for block in candidates if defines(block.code, entry_point)]
        if defining:
            return defining[-1].code
    longest = max(len(block.code) for block in candidates)
    return next(block.code for block in reversed(candidates) if len(block.code) == longest)


def import_lines(source: str) -> str:
    """The top-level import statements of ``source``."""
    tree = parse(source)
    if tree is None:
        return "".join(
            line + "\n" for line in source.splitlines() if re.match(r"(?:import|from)\s+\w", line)
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


def build_program(problem: Problem, completion: str, style: CompletionStyle = "auto") -> Program:
    """The candidate program for a completion.

    continuation: prompt + completion when the prompt is code, else the completion.
    chat: the extracted code, after the prompt when the prompt is code and parses on its own
    (so the prompt's imports and helpers, e.g. HumanEval/38's ``encode_cyclic``, are there;
    the answer's definitions come later and win), else after the prompt's import lines.
    """
    resolved = resolve_style(completion, style)
    if resolved == "continuation":
        prefix = problem.prompt if problem.prompt_is_code else ""
        return Program(prefix + completion, completion, resolved, prefix.count("\n") + 1)
    code = extract_code(completion, problem.entry_point)
    prefix = ""
    if problem.prompt_is_code:
        parses = parse(problem.prompt) is not None
        prefix = problem.prompt if parses else import_lines(problem.prompt)
        prefix = prefix.rstrip("\n") + "\n\n\n" if prefix.strip() else ""
    return Program(prefix + code, code, resolved, prefix.count("\n") + 1)
