"""What the verifier knows of the languages programs are written in: how a prompt names one and
which markdown fence tags hold its code. The sandbox decides which languages run
(``sandbox.LANGUAGES``); a language it runs that is not listed here is named and fenced by its
sandbox name.

Python is the only language whose code the verifier reads on the host (its AST: which block
defines the entry point, the prompt's imports, ``from __future__`` lines, the syntax and
forbidden-code reward terms); the code of every other language is taken whole from its block
and judged by its compiler in the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

PYTHON = "python"


@dataclass(frozen=True)
class SourceLanguage:
    name: str  # the sandbox's name (``Job.language``)
    title: str  # how a prompt names it
    fences: tuple[str, ...]  # the fence tags that hold its code; the first is the one asked for


_KNOWN = {
    language.name: language
    for language in (
        # "" too: an untagged block is Python's, as models most often leave it untagged
        SourceLanguage(PYTHON, "Python", ("python", "py", "python3", "py3", "")),
        SourceLanguage("cpp", "C++", ("cpp", "c++", "cc", "cxx")),
    )
}


def source_language(name: str) -> SourceLanguage:
    """The language named ``name`` or by one of its fence tags (``c++`` is ``cpp``,
    ``python3`` is ``python``); a name no language claims stands for itself."""
    key = name.strip().lower()
    for language in _KNOWN.values():
        if key == language.name or (key and key in language.fences):
            return language
    return SourceLanguage(key, name, (key,))


def canonical_language(name: str) -> str:
    """The sandbox's name for a language as data sets write it (``C++``, ``python3``)."""
    return source_language(name).name
