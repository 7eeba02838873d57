"""Judge side: run the trusted tests against the candidate through plain-data RPC.

The judge runs as its own user in its own process, one per job: forked from a zygote that never
held a job (``zygote.py``), it runs one job's tests and dies with the job, so nothing the tests
do (a caller's inline test module may patch this module, leave a thread or a process) reaches
another job. The candidate cannot read its memory, patch its builtins or hand it objects:
every reply is decoded into exact builtin types or a ``RemoteRef``, which compares equal only
to itself. Test outcomes go to the supervisor over a pipe the candidate does not have.

Value tests (plain calls compared with plain values) run no test code, so they need no judge
process: the supervisor runs ``run_values`` over a ``Replay`` of the replies the candidate
gave to their script, and the same code here decides them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from .codec import builtin_exception, decode, encode, module_namespace
from .wire import MAX_FRAME_BYTES, ProtocolError, frames_in, read_frame, write_frame

if TYPE_CHECKING:
    from .wire import CallJob, JudgeSpec, ValueCase

LOAD_ERRORS = ("syntax_error", "runtime_error", "memory_limit")
_MUTABLE = (list, dict, set, bytearray, collections.deque)
BATCH_ITEMS = 4096  # the most items of a candidate iterator fetched in one round trip
# Exceptions that end an iteration: one escaping a candidate call must not end the test's own
# (``all(map(candidate, xs))``), so it arrives as a RuntimeError, as PEP 479 does for generators.
_ENDS_ITERATION = (StopIteration, StopAsyncIteration)


class CandidateError(Exception):
    """The candidate raised an exception that is not a builtin one (or could not be rebuilt)."""


class CandidateCrashed(Exception):
    """The candidate process died or broke the protocol; every later call fails too."""


class RemoteRef:
    """An object that lives in the candidate process. Only calls and lookups cross over, and
    the questions the program answers about its own objects: their ``str``, ``repr``, truth,
    length, hash, items, and whether two of them are equal. Compared with anything else (a
    test's expected value), it is equal only to itself."""

    __slots__ = ("_conn", "_ref")

    def __init__(self, conn: Connection, ref: int) -> None:
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_ref", ref)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.call(self._ref, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._conn.request("getattr", ref=self._ref, name=name)

    def __getitem__(self, key: Any) -> Any:
        return self._conn.request("getitem", ref=self._ref, key=self._conn.encode(key))

    def __len__(self) -> int:
        return self._conn.ask("len", self._ref, int)

    def __iter__(self) -> RemoteRef:
        return self._conn.ask("iter", self._ref, RemoteRef)

    def __next__(self) -> Any:
        return self._conn.next(self._ref)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RemoteRef) and other._conn is self._conn:
            return self._conn.ask("eq", self._ref, bool, other=other._ref)
        return False

    def __ne__(self, other: object) -> bool:
        return not self == other  # one answer from the program, never a second, contrary one

    def __hash__(self) -> int:
        return self._conn.ask("hash", self._ref, int)

    def __bool__(self) -> bool:
        return self._conn.ask("bool", self._ref, bool)

    def __str__(self) -> str:
        return self._conn.ask("str", self._ref, str)

    def __repr__(self) -> str:
        return self._conn.ask("repr", self._ref, str)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("candidate objects are read-only in the judge")


class _Iteration:
    """A candidate iterator's items fetched ahead, how it ended, and the next batch size (from
    one item, doubling: a test that takes a few items of a costly generator waits for few)."""

    __slots__ = ("batch", "end", "items")

    def __init__(self) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self.end: BaseException | None = None
        self.batch = 1


class Connection:
    def __init__(self, to_candidate: int, from_candidate: int) -> None:
        self.to_candidate = to_candidate
        self.from_candidate = from_candidate
        self.crashed: str | None = None
        self.iterations: dict[int, _Iteration] = {}
        # Classes rebuilt from the program's replies (namedtuples, its exceptions): kept for
        # this job's connection only, since the program chooses how many and how large.
        self.classes: dict[Any, type] = {}

    def encode(self, value: Any) -> Any:
        def ref_of(obj: Any) -> int:
            if isinstance(obj, RemoteRef) and obj._conn is self:
                return obj._ref
            raise TypeError(f"cannot pass a {type(obj).__name__} to the candidate")

        return encode(value, ref_of)

    def exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.crashed:
            raise CandidateCrashed(self.crashed)
        try:
            reply = self.transact(message)
            if type(reply) is not dict:
                raise ProtocolError("reply is not an object")
            return reply
        except (OSError, ProtocolError, MemoryError, RecursionError) as exc:
            self.crashed = f"the candidate process exited or broke the protocol ({exc})"
            raise CandidateCrashed(self.crashed) from None

    def transact(self, message: dict[str, Any]) -> Any:
        """The candidate's reply to ``message``: a round trip over the pipes."""
        write_frame(self.to_candidate, message)
        return read_frame(self.from_candidate, MAX_FRAME_BYTES)

    def decode(self, tokens: Any) -> Any:
        try:
            return decode(tokens, lambda ref: RemoteRef(self, ref), self.classes)
        except (ProtocolError, MemoryError, RecursionError) as exc:
            self.crashed = f"the candidate sent an invalid value ({exc})"
            raise CandidateCrashed(self.crashed) from None

    def result(self, reply: dict[str, Any]) -> Any:
        if "unsendable" in reply:
            raise CandidateError(
                f"the program's result cannot be sent: {reply['unsendable']}"[:2000]
            )
        if "ok" not in reply:
            raise self.rebuild_exception(reply.get("raise"))
        return self.decode(reply["ok"])

    def request(self, op: str, **fields: Any) -> Any:
        return self.result(self.exchange({"op": op, **fields}))

    def ask(self, op: str, ref: int, kind: type, **fields: Any) -> Any:
        """What the program answers about its object ``ref``, which must be a ``kind``."""
        value = self.request(op, ref=ref, **fields)
        if type(value) is not kind:
            raise CandidateError(f"{op}() of a candidate object is not a {kind.__name__}")
        return value

    def next(self, ref: int) -> Any:
        """The next item of the candidate iterator ``ref``, from items fetched ahead."""
        state = self.iterations.setdefault(ref, _Iteration())
        if not state.items and state.end is None:
            reply = self.exchange({"op": "next", "ref": ref, "count": state.batch})
            state.batch = min(2 * state.batch, BATCH_ITEMS)
            if "items" not in reply:
                reply.pop("ok", None)
                self.result(reply)  # raises: the iterator's failure, or unsendable items
            items = self.decode(reply["items"])
            if type(items) is not list or not (items or "raise" in reply or reply.get("stop")):
                self.crashed = "the candidate sent an invalid batch of items"
                raise CandidateCrashed(self.crashed)
            state.items.extend(items)
            if "raise" in reply:
                state.end = self.rebuild_exception(reply["raise"])
            elif reply.get("stop"):
                state.end = StopIteration()
        if state.items:
            return state.items.popleft()
        end, state.end = state.end, StopIteration()  # after raising, an iterator is exhausted
        assert end is not None  # a batch without items says how the iteration ended
        raise end

    def call(self, ref: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a candidate object; what it changed in the arguments changes here too."""
        reply = self.exchange(self.call_request(ref, args, kwargs))
        if "args_after" in reply:
            update_all(args, self.decode(reply["args_after"]))
        if "kwargs_after" in reply:
            after = self.decode(reply["kwargs_after"])
            if type(after) is dict and after.keys() == kwargs.keys():
                update_all(kwargs.values(), list(after.values()))
        return self.result(reply)

    def call_request(self, ref: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return {
            "op": "call",
            "ref": ref,
            "args": self.encode(list(args)),
            "kwargs": self.encode(kwargs),
        }

    def rebuild_exception(self, info: Any) -> BaseException:
        """The candidate's exception as one the tests can catch: a builtin one as itself, a
        custom one as a judge-side class of the same name and builtin bases."""
        if type(info) is not dict or type(info.get("bases")) is not list:
            return CandidateCrashed("the candidate sent an invalid reply")
        name, message = str(info.get("type", "Exception")), str(info.get("message", ""))
        bases = [cls for cls in map(builtin_exception, map(str, info["bases"])) if cls]
        if not bases or not name.isidentifier():
            return CandidateError(f"{name}: {message}")
        if any(issubclass(cls, _ENDS_ITERATION) for cls in bases):
            exc = RuntimeError(f"the program raised {name}: {message}")
            exc.from_candidate = True  # type: ignore[attr-defined]
            return exc
        try:
            args = decode(info.get("args"), lambda ref: RemoteRef(self, ref), self.classes)
        except (ProtocolError, MemoryError, RecursionError):
            args = None
        key = (name, tuple(bases))
        cls = self.classes.get(key) or self.classes.setdefault(key, _exception_class(*key))
        for attempt in (args if type(args) is list else [message], [message]):
            try:
                exc = cls(*attempt)
            except Exception:
                continue
            exc.from_candidate = True  # type: ignore[attr-defined]
            return exc
        return CandidateError(f"{name}: {message}")

    def get(self, name: str) -> Any:
        if type(name) is not str:
            raise TypeError("name must be a str")
        try:
            return self.request("get", name=name)
        except KeyError:
            raise NameError(f"the program does not define {name!r}") from None

    def names(self) -> list[str]:
        """The program's public top-level names: a JSON list of names, not an encoded value."""
        names = self.exchange({"op": "names"}).get("ok")
        if type(names) is not list or not all(type(n) is str and n.isidentifier() for n in names):
            raise CandidateCrashed("the candidate sent invalid names")
        return names


def _exception_class(name: str, builtin_bases: tuple[type[Exception], ...]) -> type[Exception]:
    """``name`` itself when it is the nearest builtin base, else a subclass of the bases that
    no other base already covers (``class E(KeyError, TypeError)``)."""
    if builtin_bases[0].__name__ == name:
        return builtin_bases[0]
    leaves = tuple(
        cls
        for cls in builtin_bases
        if not any(o is not cls and issubclass(o, cls) for o in builtin_bases)
    )
    try:
        return type(name, leaves, {})
    except TypeError:  # bases whose layouts conflict: the nearest one
        return type(name, (builtin_bases[0],), {})


def update_in_place(old: Any, new: Any) -> None:
    """Make the judge's mutable ``old`` equal the candidate's ``new`` without replacing it;
    lists of the same length keep their inner objects, which are updated the same way."""
    pending = [(old, new)]
    while pending:
        old, new = pending.pop()
        if type(old) is not type(new) or old is new:
            continue
        if type(old) is list and len(old) == len(new):
            for index, (inner_old, inner_new) in enumerate(zip(old, new, strict=True)):
                if type(inner_old) is type(inner_new) and isinstance(inner_old, _MUTABLE):
                    pending.append((inner_old, inner_new))
                else:
                    old[index] = inner_new
        elif isinstance(old, (list, bytearray)):
            old[:] = new
        elif isinstance(old, collections.deque):
            old.clear()
            old.extend(new)
        elif isinstance(old, (dict, set)):
            old.clear()
            old.update(new)


def update_all(olds: Iterable[Any], news: Any) -> None:
    if type(news) is list:
        for old, new in zip(olds, news, strict=False):
            update_in_place(old, new)


def _describe(exc: BaseException) -> str:
    """``Type: message``; a message that cannot be made (an int of 5,000 digits, a nesting
    too deep for ``repr``) is named, never the judge's own failure."""
    try:
        message = str(exc)
    except Exception as failure:
        message = f"<message not printable: {type(failure).__name__}>"
    return (f"{type(exc).__name__}: {message}" if message else type(exc).__name__)[:2000]


def is_candidate_failure(exc: BaseException) -> bool:
    return isinstance(exc, (CandidateError, CandidateCrashed)) or getattr(
        exc, "from_candidate", False
    )


Emit = Callable[[dict[str, Any]], None]  # where test outcomes go: the supervisor's pipe, a list


def load(conn: Connection, program: str, emit: Emit) -> bool:
    """Load the program in the candidate; when that fails, say how (``load_error``)."""
    try:
        loaded = conn.exchange({"op": "load", "program": program})
    except CandidateCrashed as exc:
        loaded = {"error": "runtime_error", "message": f"{exc}"}
    if "ok" in loaded:
        return True
    kind = loaded.get("error")  # the reply is the candidate's word: it may only pick a failure
    emit(
        {
            "event": "load_error",
            "kind": kind if kind in LOAD_ERRORS else "runtime_error",
            "message": str(loaded.get("message", ""))[:4000],
            "crashed": conn.crashed is not None,
        }
    )
    return False


def outcome_event(name: str, failure: BaseException | None, duration_s: float) -> dict[str, Any]:
    return {
        "event": "test",
        "name": name,
        "passed": failure is None,
        "error": None if failure is None else _describe(failure),
        "candidate_error": failure is not None and is_candidate_failure(failure),
        "memory_error": isinstance(failure, MemoryError) and is_candidate_failure(failure),
        "duration_s": duration_s,
    }


def labels(judge: JudgeSpec) -> list[str]:
    return judge.get("test_names") or [f"test_{i}" for i in range(len(judge["tests"]))]


def run(job: CallJob, conn: Connection, emit: Emit) -> None:
    judge = job["judge"]
    if not load(conn, job["program"], emit):
        return
    namespace = module_namespace("__judge__")  # a module, as the tests' own harness has
    namespace.update(__remote__=conn.get, __remote_names__=conn.names)
    setup_failure: BaseException | None = None
    try:
        exec(compile(judge["setup"], "<judge-setup>", "exec", dont_inherit=True), namespace)
    except BaseException as exc:
        setup_failure = exc
    for name, source in zip(labels(judge), judge["tests"], strict=True):
        started = time.perf_counter()
        failure = setup_failure
        if failure is None:
            try:
                exec(compile(source, f"<{name}>", "exec", dont_inherit=True), namespace)
            except BaseException as exc:
                failure = exc
        emit(outcome_event(name, failure, time.perf_counter() - started))
    emit({"event": "done", "crashed": conn.crashed is not None})


_ENDED = object()


class Replay(Connection):
    """The replies of a candidate that ran the value tests' script on its own
    (``CandidateServer.cases``), handed out in order as the live candidate would give them, so
    that the judge's own code decides value tests without a judge process. A question off the
    script (the ``str`` of a program's object, for an error message) has no answer here."""

    SCRIPT = frozenset({"load", "get", "call"})

    def __init__(self, replies: Replies) -> None:
        super().__init__(-1, -1)
        self.replies = iter(replies.frames)
        self.end = replies.end
        self.duration_s = 0.0  # the last call's time, as the program's process measured it

    def call_request(self, ref: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return {"op": "call"}  # made already, with the script's arguments these were decoded from

    def transact(self, message: dict[str, Any]) -> Any:
        if message["op"] not in self.SCRIPT:
            raise CandidateError(f"the program is not asked for {message['op']}() here")
        reply = next(self.replies, _ENDED)
        if reply is _ENDED:  # where the candidate's replies ended, or what broke them
            raise type(self.end)(*self.end.args)  # a new one: raising attaches a traceback
        duration = reply.get("duration_s") if type(reply) is dict else None
        self.duration_s = duration if type(duration) is float and 0 <= duration < 1e6 else 0.0
        return reply


class Replies(NamedTuple):
    """The frames a candidate's reply pipe carried, and what ended them (``PeerClosed`` where
    the bytes ended, or the ``ProtocolError`` of a broken frame)."""

    frames: list[Any]
    end: ProtocolError


def read_replies(data: bytes | bytearray) -> Replies:
    frames: list[Any] = []
    replies = frames_in(data)
    while True:
        try:
            frames.append(next(replies))
        except ProtocolError as end:  # kept without its traceback, which holds our callers
            return Replies(frames, type(end)(*end.args))


# What the supervisor (PID 1, as long-lived as its container) may rebuild from a program's
# replies itself: values whose decoding and comparison cost time and memory in proportion to
# their bytes and make nothing that outlives the job. Any other reply is decided by a process
# of its own that dies with the job (``decide_values``): classes the program names (a
# namedtuple, its exception), Fractions (a gcd of two large ints), Decimals, and hashed items
# past a budget (ints that collide in a set make its building quadratic; strings do not, their
# hashes are secret to this process).
_CHEAP_LEAVES = frozenset({"ref", "type", "int", "bytes", "bytearray", "complex"})
_SEQUENCES = frozenset({"list", "tuple"})
_HASHED = frozenset({"dict", "set", "frozenset"})
_CHEAP_TAGS = _CHEAP_LEAVES | _SEQUENCES | _HASHED | {""}  # "": malformed, refused at once
_SCALAR_TYPES = frozenset({type(None), bool, int, float, str})
HASHED_TOKENS = 1024  # tokens inside dicts and sets, all the replies of a job together


def cheap_to_decide(replies: Replies) -> bool:
    """Whether deciding ``replies`` is cheap and leaves nothing behind (see above)."""
    budget = [HASHED_TOKENS]
    for reply in replies.frames:
        if type(reply) is not dict:
            continue  # the replay's own refusal: nothing is rebuilt from it
        info = reply.get("raise")
        if info is not None:
            if type(info) is not dict or not _builtin_raise(info):
                return False
            if not _cheap_tokens(info.get("args"), budget):
                return False
        for field in ("ok", "args_after", "kwargs_after"):
            if field in reply and not _cheap_tokens(reply[field], budget):
                return False
    return True


def _builtin_raise(info: dict[str, Any]) -> bool:
    """The program raised a builtin exception itself (``rebuild_exception`` makes no class)."""
    name, bases = info.get("type"), info.get("bases")
    return (
        type(bases) is list
        and bool(bases)
        and bases[0] == name
        and (type(name) is str and builtin_exception(name) is not None)
    )


def _cheap_tokens(tokens: Any, budget: list[int]) -> bool:
    """A walk of one value's tokens, in their prefix order, that spends ``budget`` on each
    token inside a dict or set. Malformed tokens are cheap: decoding refuses them at once."""
    if type(tokens) is not list or not tokens:
        return True
    if _tag(tokens[0]) in _SEQUENCES and _SCALAR_TYPES.issuperset(
        map(type, itertools.islice(tokens, 1, None))
    ):
        return True  # a list of scalars (of any length), checked at C speed
    open_: list[list[int]] = []  # [children left, whether hashed] of each open container
    hashed = 0  # how many of them are dicts or sets
    for token in tokens:
        if hashed:
            budget[0] -= 1
            if budget[0] < 0:
                return False
        tag = _tag(token)
        if tag is not None:
            if tag not in _CHEAP_TAGS:
                return False
            size = token[1] if len(token) > 1 and type(token[1]) is int else 0
            if size > 0 and tag not in _CHEAP_LEAVES:
                open_.append([size, tag in _HASHED])
                hashed += tag in _HASHED
                continue
        while open_:  # a whole value: it fills its container's next place
            open_[-1][0] -= 1
            if open_[-1][0]:
                break
            hashed -= open_.pop()[1]
    return True


def _tag(token: Any) -> str | None:
    """A header's tag (``""`` for a malformed header); None for a scalar token."""
    if type(token) is not list:
        return None
    return token[0] if token and type(token[0]) is str else ""


def decide_values(job_fd: int, results: int) -> None:
    """A value decider's one job: the job's frame, then the candidate's replies as they came
    (until the end of ``job_fd``), decided as the supervisor decides cheap ones."""
    emit = functools.partial(write_frame, results)
    try:
        job = read_frame(job_fd)
        data = bytearray()
        while chunk := os.read(job_fd, 1 << 20):
            data += chunk
        run_values(job, Replay(read_replies(data)), emit)
    except Exception as exc:  # a bad job: report it
        with contextlib.suppress(OSError):
            emit({"event": "judge_error", "message": repr(exc)[:2000]})


def run_values(job: CallJob, conn: Replay, emit: Emit) -> None:
    """Value tests (``JudgeSpec.values``), decided as ``run`` decides the code they stand for:
    ``assert target(*args) == expected, message`` (or ``is``, or ``abs(... - expected) <
    tolerance``), or ``assert expected, message`` where a case has no ``args``. The setup does
    not run.

    No failure outlives the ``except`` that caught it: its traceback holds its frames, each
    frame its caller, up to this one, so a failure kept here would be a cycle holding the
    program's replies (``conn``) in the supervisor until a full collection."""
    judge, values = job["judge"], job["judge"]["values"]
    assert values is not None, "a job with value tests"
    if not load(conn, job["program"], emit):
        return
    target, lookup_failed = _look_up(conn, values["target"])
    for name, case in zip(labels(judge), values["cases"], strict=True):
        conn.duration_s = 0.0
        if lookup_failed is not None:
            emit({**lookup_failed, "name": name})
        else:
            emit(_value_test(name, case, target, conn))
    emit({"event": "done", "crashed": conn.crashed is not None})


def _look_up(conn: Connection, name: str) -> tuple[Any, dict[str, Any] | None]:
    """The program's ``name``, or the outcome of every test when it cannot be had."""
    try:
        return conn.get(name), None
    except BaseException as exc:
        return None, outcome_event("", exc, 0.0)


def _value_test(name: str, case: ValueCase, target: Any, conn: Replay) -> dict[str, Any]:
    try:
        asserted = decode(case["expected"], _no_refs)
        if case["args"] is not None:
            result = target(*decode(case["args"], _no_refs))
            asserted = _compare(case, result, asserted)
        if not asserted:
            message = case["message"]
            raise AssertionError() if message is None else AssertionError(message)
    except BaseException as exc:
        return outcome_event(name, exc, conn.duration_s)
    return outcome_event(name, None, conn.duration_s)


def _compare(case: ValueCase, result: Any, expected: Any) -> Any:
    """What the case's assert tests, computed as its code computes it."""
    if case["compare"] == "is":
        return result is expected
    if case["compare"] == "close":
        return abs(result - expected) < case["tolerance"]
    return result == expected


def _no_refs(ref: int) -> Any:
    raise ProtocolError("a value test holds a reference")


def run_job(job_fd: int, to_candidate: int, from_candidate: int, results: int) -> None:
    """The judge process's one job: its frame on ``job_fd``, then its tests."""
    try:
        run(
            read_frame(job_fd),
            Connection(to_candidate, from_candidate),
            functools.partial(write_frame, results),
        )
    except Exception as exc:  # a bad job, a broken pipe after a time-out: report it
        with contextlib.suppress(OSError):
            write_frame(results, {"event": "judge_error", "message": repr(exc)[:2000]})
