"""Candidate side: load the untrusted program and answer the judge's requests.

Runs as the unprivileged sandbox user in a process forked from the zygote, which never held
any test or expected output, so nothing secret is in this address space to be read.
Nothing here is trusted by anyone: the judge decodes every reply as plain data.
"""

from __future__ import annotations

import _io
import atexit
import base64
import contextlib
import gc
import os
import resource
import stat
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from . import languages
from .codec import builtin_exception, decode, encode, module_namespace
from .wire import MAX_FRAME_BYTES, PeerClosed, Unsendable, read_frame, write_frame

_TRACEBACK_CHARS = 4000
_MESSAGE_CHARS = 1000
_NO_KWARGS = encode({}, lambda obj: 0)  # a call's keyword arguments in value tests: none
_BATCH_S = 0.02  # how long one ``next`` request may spend fetching items ahead
# What the judge may ask of an object: the builtin that answers it.
_BUILTINS: dict[str, Callable[[Any], Any]] = {
    "len": len,
    "iter": iter,
    "str": str,
    "repr": repr,
    "bool": bool,
    "hash": hash,
}


def _exception_info(exc: BaseException, make_ref: Callable[[Any], int]) -> dict[str, Any]:
    """What the judge needs to raise it again: the builtin exception classes it is (a custom
    ``class MyErr(ValueError)`` is a ValueError there too), its arguments and its message."""
    cls = type(exc)
    builtins_in_mro = [c.__name__ for c in cls.__mro__ if builtin_exception(c.__name__) is c]
    info: dict[str, Any] = {"type": cls.__name__, "bases": builtins_in_mro}
    try:
        info["message"] = str(exc)[:_MESSAGE_CHARS]
        info["args"] = encode(list(exc.args), make_ref)
    except Exception:  # an unprintable or unencodable exception still says what it is
        info.setdefault("message", "")
    return info


def _format_traceback(exc: BaseException) -> str:
    import traceback  # only on errors: keep the zygote's heap (and so each fork) small

    if isinstance(exc, SyntaxError):  # as Python prints it: the runner's frames say nothing
        text = "".join(traceback.format_exception_only(type(exc), exc))
    else:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-_TRACEBACK_CHARS:]


def _flush() -> None:
    # Whatever the program made of them: it may have replaced or closed any.
    streams: tuple[Any, ...] = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()


def _flush_open_files() -> None:
    """Flush every file object the program left open (``out = open(1, "w")`` written to and
    never flushed), text files before the binary ones under them, as the interpreter does when
    it finalizes them at shutdown: after the standard streams."""
    try:  # by exact type: a program's object may answer for its own __class__
        files = [obj for obj in gc.get_objects() if issubclass(type(obj), _io._IOBase)]
    except MemoryError:  # a program at its memory limit: what it had flushed is what it wrote
        return
    files.sort(key=lambda stream: not issubclass(type(stream), _io._TextIOBase))
    for stream in files:
        with contextlib.suppress(Exception):
            if not stream.closed:
                stream.flush()


def _compile(program: str) -> types.CodeType:
    """The program's code with its own ``__future__`` flags, not those of this module."""
    return compile(program, "<candidate>", "exec", dont_inherit=True)


def _exit(status: int) -> NoReturn:
    """End as the interpreter ends a program (its threads joined, its ``atexit`` hooks run,
    its streams flushed), without the teardown of the zygote the process was forked from."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    _flush()
    _flush_open_files()
    os._exit(status & 0xFF)


class CandidateServer:
    """Holds the program's namespace and the objects handed out to the judge as references."""

    def __init__(self) -> None:
        self.namespace = module_namespace("__candidate__")  # as if imported
        self.objects: dict[int, Any] = {}
        self.refs: dict[int, int] = {}  # id(object) -> its reference: one object, one reference

    def make_ref(self, obj: Any) -> int:
        ref = self.refs.get(id(obj))
        if ref is None:
            ref = self.refs[id(obj)] = len(self.objects) + 1
            self.objects[ref] = obj
        return ref

    def resolve(self, ref: int) -> Any:
        return self.objects[ref]

    def send(self, value: Any) -> dict[str, Any]:
        """The reply carrying ``value``, or the reason it cannot travel (never the program's
        own exception: it raised nothing)."""
        try:
            return {"ok": encode(value, self.make_ref)}
        except Unsendable as exc:
            return {"unsendable": f"{type(value).__name__} value: {exc}"}

    def load(self, program: str) -> dict[str, Any]:
        try:
            code = _compile(program)
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes
            return {"error": "syntax_error", "message": _format_traceback(exc)}
        try:
            exec(code, self.namespace)
        except BaseException as exc:
            kind = "memory_limit" if isinstance(exc, MemoryError) else "runtime_error"
            return {"error": kind, "message": _format_traceback(exc)}
        return {"ok": None}

    def public_names(self) -> list[str]:
        return [
            name
            for name, value in self.namespace.items()
            if not name.startswith("_") and not isinstance(value, types.ModuleType)
        ]

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """Call a program object; arguments it changed in place go back with the reply, so the
        judge's own objects change as they would in one process (``xs.sort()``)."""
        target = self.resolve(request["ref"])
        args = decode(request["args"], self.resolve)
        kwargs = decode(request["kwargs"], self.resolve)
        try:
            reply = self.send(target(*args, **kwargs))
        except BaseException as exc:
            reply = {"raise": _exception_info(exc, self.make_ref)}
        for name, value in (("args", args), ("kwargs", kwargs)):
            after = encode(value, self.make_ref)
            if after != request[name]:
                reply[f"{name}_after"] = after
        return reply

    def next_items(self, iterator: Any, count: int) -> dict[str, Any]:
        """Up to ``count`` items of an iterator (at least one, fetched for at most
        ``_BATCH_S``), and how it ended if it did: an infinite generator is read lazily, a
        long one without a round trip per item."""
        items: list[Any] = []
        ended: dict[str, Any] = {}
        deadline = time.monotonic() + _BATCH_S
        try:
            while len(items) < count:
                items.append(next(iterator))
                if time.monotonic() > deadline:
                    break
        except StopIteration:
            ended = {"stop": True}
        except BaseException as exc:
            ended = {"raise": _exception_info(exc, self.make_ref)}
        sent = self.send(items)
        return {"items": sent.pop("ok"), **ended} if "ok" in sent else sent

    def cases(self, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The value tests' script, run on its own (the supervisor reads the replies back with
        ``judge.Replay``): the target's ``get``, then, if it went as a reference, a call of it
        with each case's arguments; each reply as a judge asking would have had it, and how
        long the call took."""
        target = self.namespace.get(request["name"])
        yield self.handle({"op": "get", "name": request["name"]})
        ref = self.refs.get(id(target))
        if ref is None:  # plain data or missing: the judge's side cannot call it
            return
        for args in request["calls"]:
            started = time.perf_counter()
            reply = self.handle({"op": "call", "ref": ref, "args": args, "kwargs": _NO_KWARGS})
            reply["duration_s"] = time.perf_counter() - started
            yield reply

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "load":
            return self.load(request["program"])
        if op == "names":
            return {"ok": self.public_names()}
        try:
            if op == "call":
                return self.call(request)
            if op == "get":
                return self.send(self.namespace[request["name"]])
            target = self.resolve(request["ref"])
            if op == "next":
                return self.next_items(target, max(1, int(request["count"])))
            if op == "getattr":
                value = getattr(target, request["name"])
            elif op == "getitem":
                value = target[decode(request["key"], self.resolve)]
            elif op == "eq":
                value = bool(target == self.resolve(request["other"]))
            elif op in _BUILTINS:
                value = _BUILTINS[op](target)
            else:
                return {"raise": {"type": "ValueError", "bases": ["ValueError"]}}
            return self.send(value)
        except BaseException as exc:
            return {"raise": _exception_info(exc, self.make_ref)}
        finally:
            _flush()


def serve(rpc_in: int, rpc_out: int) -> None:
    """Answer requests until the judge (or the supervisor, for value tests) hangs up."""
    server = CandidateServer()
    while True:
        try:
            request = read_frame(rpc_in)
        except PeerClosed:
            _flush()
            os._exit(0)
        replies = server.cases(request) if request["op"] == "cases" else (server.handle(request),)
        for reply in replies:
            try:
                write_frame(rpc_out, reply, MAX_FRAME_BYTES)
            except Unsendable as exc:  # the judge would refuse it: say why instead
                write_frame(rpc_out, {"unsendable": f"the reply: {exc}"})


def _write_files(files: dict[str, str]) -> None:
    """The job's input files (base64) into the working directory, made by this user so that
    the program may change them; paths were checked on the host (relative, no ``..``)."""
    for path, data in files.items():
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "xb") as stream:
            stream.write(base64.b64decode(data))


def _exec(command: list[str], rpc_out: int) -> NoReturn:
    """Say the set-up worked, then become ``command`` (a compiler, a compiled program, an
    interpreter): from here on the process is that program's, under the same limits."""
    write_frame(rpc_out, {"ok": None})
    os.close(rpc_out)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        os.write(2, f"[sandbox] cannot start {command[0]}: {exc}\n".encode())
    os._exit(127)


def _prepare(job: dict[str, Any], rpc_out: int, *, source: bool, output: bool = False) -> None:
    """The job's input files; with ``source``, the program where its language reads it; with
    ``output``, the folder its compiler writes into. A failure is reported on ``rpc_out`` and
    ends the process."""
    try:
        _write_files(job.get("files", {}))
        if source:
            path = languages.get(job["language"]).source_path()
            with open(path, "x", encoding="utf-8") as stream:
                stream.write(job["program"])
        if output:
            os.mkdir(languages.OUTPUT_DIR)
    except (OSError, ValueError) as exc:
        write_frame(rpc_out, {"error": "runtime_error", "message": f"input files: {exc!r}\n"})
        os._exit(1)


def compile_program(rpc_in: int, rpc_out: int) -> None:
    """The compile phase: the job's files in the working directory (a program may include
    them), its source where the compiler reads it, then the compiler in place of this process."""
    job = read_frame(rpc_in)
    os.close(rpc_in)
    _prepare(job, rpc_out, source=True, output=True)
    _exec(languages.get(job["language"]).compile_command(job["memory_mb"]), rpc_out)


def run_main(rpc_in: int, rpc_out: int) -> None:
    """io mode: run the program with the process's stdin. A Python program runs here as
    ``__main__``, like ``python prog.py``; any other starts as its language says (the compiled
    binary in ``job["output"]``)."""
    job = read_frame(rpc_in)
    os.close(rpc_in)
    language = languages.get(job["language"])
    _prepare(job, rpc_out, source=not (language.in_runner or language.compiled))
    if not language.in_runner:
        # The main thread's stack may grow until the address-space limit stops it (deep
        # recursion is common in contest solutions); threads keep glibc's default stacks.
        _, hard = resource.getrlimit(resource.RLIMIT_STACK)
        resource.setrlimit(resource.RLIMIT_STACK, (hard, hard))
        _exec(language.run_command(job["output"], job["memory_mb"]), rpc_out)
    try:
        code = _compile(job["program"])
    except (SyntaxError, ValueError) as exc:
        write_frame(rpc_out, {"error": "syntax_error", "message": _format_traceback(exc)})
        os._exit(1)
    write_frame(rpc_out, {"ok": None})
    os.close(rpc_out)
    status = 0
    try:
        exec(code, module_namespace("__main__"))
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException as exc:
        sys.stderr.write(_format_traceback(exc))
        status = 1
    _exit(status)


def fetch_files(rpc_in: int, rpc_out: int) -> None:
    """After an io program: the files the job asked for, read by a fresh process of the sandbox
    user in its working directory (never by root, so a link the program left reaches nothing it
    could not read itself). A path that is missing or not a regular file is left out (a FIFO
    cannot block this); those that are there but not regular files are named in
    ``irregular``, and files past ``budget`` bytes in all in ``over``."""
    request = read_frame(rpc_in)
    budget, files, over, irregular = request["budget"], {}, [], []
    for path in request["paths"]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            continue
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a directory (open() refuses it)
            os.close(fd)
            irregular.append(path)
            continue
        with open(fd, "rb") as stream:
            data = stream.read(budget + 1)
        if len(data) > budget:
            over.append(path)
            continue
        budget -= len(data)
        files[path] = base64.b64encode(data).decode()
    write_frame(rpc_out, {"files": files, "over": over, "irregular": irregular})
