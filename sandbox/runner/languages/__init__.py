"""The languages the sandbox runs programs in: one module each in this package.

A language declares all that codepost needs of it: how a prompt names it and the fence tags
that hold its code (the verifier), the Debian packages of its toolchain (the image), how a
program becomes something to run and how that starts (the supervisor and the candidate
process), and whether a problem's checker may be written in it. Python runs in the runner's
own interpreter (a process forked from the zygote, nothing to prepare); C++ is compiled once
per job, in the sandbox, and its binary executed for each case; JavaScript's source is run by
Node.js. Java, Go or Rust is one more module here (a ``Language`` passed to ``register``):
nothing else names a language.

Standard library only: the package is imported inside the container and by the host, which
validates a job's language against it.
"""

from __future__ import annotations

import importlib
import os
from typing import NamedTuple

# Where the compile phase puts the program's source and its compiler's output (both in the
# sandbox user's /tmp, emptied after the compile), and where the supervisor keeps the output
# for the job's runs: a directory of root's that no program can write.
SOURCE_DIR = "/tmp"
OUTPUT_DIR = "/tmp/build"
BUILDS_DIR = "/build"


class Language(NamedTuple):
    """How the sandbox prepares and starts a program in one language.

    Commands are argument lists whose ``{source}`` (the program's file), ``{output}`` (the
    directory the compiler writes into, and at run time the directory holding what it wrote)
    and ``{memory_mb}`` (the process's memory limit, for a runtime that sizes its own heap)
    are filled in by the runner. A compile runs in ``/work``, where the job's files are.

    A named tuple, not a dataclass: the zygotes import this package, and ``dataclasses`` (with
    ``inspect``) would add to the memory of every process they fork.
    """

    name: str
    source_file: str  # the program's file name, for its compiler or interpreter
    title: str = ""  # how a prompt names it (default: its name)
    # The markdown fence tags that hold its code; the first is the one a prompt asks for
    # (default: its name).
    fences: tuple[str, ...] = ()
    compile: tuple[str, ...] = ()  # () when nothing is prepared
    run: tuple[str, ...] = ()  # () runs the program in the runner's own Python interpreter
    # Text at the end of a program's (or its compiler's) stderr when it ran out of memory.
    memory_errors: tuple[str, ...] = ()
    # Address space its runtime reserves and never uses (V8's code range and heap
    # reservations), allowed beyond the memory limit; the run command holds the heap to the
    # limit ({memory_mb}), and the container's memory limit binds what is really used.
    reserved_mb: int = 0
    # A problem's checker may be written in it (the verifier's io form hands the checker its
    # files: Python's as arguments, testlib's convention for C++).
    checker: bool = False
    # Debian packages of its toolchain, and commands run once as root after they are
    # installed, when the image is built (a precompiled header, ...).
    packages: tuple[str, ...] = ()
    image_setup: tuple[tuple[str, ...], ...] = ()

    @property
    def compiled(self) -> bool:
        return bool(self.compile)

    @property
    def in_runner(self) -> bool:
        """Whether the program runs inside the runner's interpreter: the only kind a judge can
        call into (call mode) and the only kind loaded without a new process image."""
        return not self.run

    def source_path(self) -> str:
        return f"{SOURCE_DIR}/{self.source_file}"

    def compile_command(self, memory_mb: int) -> list[str]:
        return self._fill(self.compile, OUTPUT_DIR, memory_mb)

    def run_command(self, output: str, memory_mb: int) -> list[str]:
        return self._fill(self.run, output, memory_mb)

    def _fill(self, command: tuple[str, ...], output: str, memory_mb: int) -> list[str]:
        source = self.source_path()
        return [arg.format(source=source, output=output, memory_mb=memory_mb) for arg in command]

    def ran_out_of_memory(self, stderr: bytes | bytearray) -> bool:
        # 4 KiB: V8 writes its native stack (about 2 KiB) after its message
        tail = bytes(stderr[-4096:])
        return any(marker.encode() in tail for marker in self.memory_errors)


_REGISTRY: dict[str, Language] = {}


def register(language: Language) -> Language:
    if language.name in _REGISTRY:
        raise ValueError(f"language {language.name!r} is registered twice")
    _REGISTRY[language.name] = language
    return language


def get(name: str) -> Language:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown language {name!r}: the sandbox runs {', '.join(sorted(_REGISTRY))}"
        ) from None


def names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def prepare_image() -> None:
    """Install every language's packages, then run its set-up commands, as root while the
    image is built (``Dockerfile.sandbox`` calls this)."""
    import subprocess  # not at the top: the zygote imports this package, and forks stay small

    packages = sorted({package for language in _REGISTRY.values() for package in language.packages})
    if packages:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=True, env=env)
        install = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
        subprocess.run(install, check=True, env=env)
        lists = "/var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/*"
        subprocess.run(["sh", "-c", f"rm -rf {lists}"], check=True)
    for language in _REGISTRY.values():
        for command in language.image_setup:
            subprocess.run(command, check=True)


# Loaded by name (below): the host reads them too (a prompt's fence, the tags answers are
# extracted from), so a stage that reaches this package holds all of them in its resume key
# (pipeline/code_version.py), the stages that never run a program included.
__modules_loaded_by_name__ = True

# Each module of this folder, found without pkgutil, whose module search imports ``inspect`` (and
# with it ``ast``, ``dis`` and ``tokenize``) into the zygotes.
for _file in sorted(os.listdir(os.path.dirname(__file__))):
    if _file.endswith(".py") and not _file.startswith("_"):
        importlib.import_module(f"{__name__}.{_file.removesuffix('.py')}")
