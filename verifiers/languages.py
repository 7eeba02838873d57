"""What the verifier knows of the languages programs are written in, read from the sandbox's
language registry (``sandbox/runner/languages/``, one module each): how a prompt names one,
which markdown fence tags hold its code, and whether a checker may be written in it. A name no
language claims stands for itself (the sandbox refuses it when a job is made, naming the ones
it runs).

Python is the only language whose code the verifier reads on the host (its AST: which block
defines the entry point, the prompt's imports, ``from __future__`` lines, the syntax and
forbidden-code reward terms); the code of every other language is taken whole from its block
and judged by its compiler or interpreter in the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sandbox.runner import languages

PYTHON = "python"


@dataclass(frozen=True)
class SourceLanguage:
    name: str  # the sandbox's name (``Job.language``)
    title: str  # how a prompt names it
    fences: tuple[str, ...]  # the fence tags that hold its code; the first is the one asked for
    checker: bool = False  # a problem's checker program may be written in it


def _known() -> list[SourceLanguage]:
    return [
        SourceLanguage(
            language.name,
            language.title or language.name,
            language.fences or (language.name,),
            language.checker,
        )
        for language in map(languages.get, languages.names())
    ]


def source_language(name: str) -> SourceLanguage:
    """The language named ``name`` or by one of its fence tags (``c++`` is ``cpp``,
    ``python3`` is ``python``, ``js`` is ``javascript``); a name no language claims stands for
    itself."""
    key = name.strip().lower()
    for language in _known():
        if key == language.name or (key and key in language.fences):
            return language
    return SourceLanguage(key, name, (key,))


def canonical_language(name: str) -> str:
    """The sandbox's name for a language as data sets write it (``C++``, ``python3``)."""
    return source_language(name).name


def checker_languages() -> tuple[str, ...]:
    """The languages a problem's checker program may be written in."""
    return tuple(language.name for language in _known() if language.checker)
