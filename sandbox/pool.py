"""A warm pool of sandbox containers, each fed over a socket of its own.

Starting a container per execution costs ~0.4 s and ``docker exec`` ~0.1 s, so each container
runs one long-lived supervisor (``runner/supervisor.py``) that takes length-prefixed JSON jobs
and answers them: over a Unix socket it listens on until the host connects (reached through
``/proc/<pid>/root``: a local engine, and this process root), or else over the container's
attached stdin and stdout, which dockerd and containerd's shim copy on their way (0.5 ms of
CPU per job). One worker thread owns each container; jobs wait in a shared
queue, so any number can be in flight. A container that breaks the protocol, dies, misses
its hard deadline, or falls silent while it runs a job (paused or frozen: the supervisor
sends a heartbeat every second) is destroyed and replaced, and the job is retried; only when
every attempt fails does the caller get ``sandbox_error``. A Docker engine that cannot be
reached at all raises ``SandboxUnavailable`` instead, naming the host.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import docker
import docker.errors
import psutil
import requests.exceptions

from .api import (
    CaseOutcome,
    CompileOutcome,
    ExecStatus,
    ExecutionResult,
    Job,
    JudgeSpec,
    SandboxUnavailable,
    TestOutcome,
)
from .owner_guard import guard_containers
from .runner import languages, source_version
from .runner.codec import encode
from .runner.wire import HEADER, MAX_FRAME_BYTES, ProtocolError, frame, split_frame

if TYPE_CHECKING:
    from .runner import wire

log = logging.getLogger(__name__)

# scripts/setup.sh builds the image under the same variable's name.
DEFAULT_IMAGE = os.environ.get("CODEPOST_SANDBOX_IMAGE", "codepost-sandbox:latest")
_DOCKER_HEADER = struct.Struct(">BxxxI")
_PEER_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


class _ContainerFault(Exception):
    """One container failed (died, broke the protocol, missed its deadline)."""


class _TooLarge(ValueError):
    """A job whose message is over the supervisor's frame limit: no container can take it."""


@dataclass(frozen=True)
class PoolConfig:
    """How many containers, on which hosts, and what each may use.

    Neighbours cannot make an honest program time out: the CPU limit is what bounds compute,
    and the wall limit does not count the time the program (and, in call mode, its judge)
    waited for a CPU while others used it, up to ``wall_stretch`` times the limit in all. So a
    program within its limits passes on a busy host as it does alone (up to that stretch),
    and a sleeping or blocked one still ends at its wall limit.
    """

    size: int = 4  # containers, i.e. executions in flight at once
    image: str = DEFAULT_IMAGE
    docker_hosts: tuple[str, ...] = ()  # DOCKER_HOST-style URLs; () = the environment's engine
    container_memory_mb: int = 2048  # whole container: runner, program, judge and tmpfs
    container_pids: int = 256
    tmpfs_mb: int = 64  # each of /work, /tmp, /dev/shm and /build (a job's compiled program)
    # Files, directories and links each of them may hold: this bounds the clean-up after a job.
    tmpfs_inodes: int = 4096
    cpus: float = 1.0  # per container
    wall_stretch: float = 3.0  # the most real time a job may take, as a multiple of its wall limit
    grace_s: float = 10.0  # how long past a job's own wall limit the host waits
    silence_s: float = 10.0  # how long a container running a job may send nothing at all
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"PoolConfig.size must be >= 1, got {self.size}")
        if self.max_attempts < 1:
            raise ValueError(f"PoolConfig.max_attempts must be >= 1, got {self.max_attempts}")


def _connect(host: str | None) -> docker.DockerClient:
    where = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxUnavailable(
            f"cannot reach the Docker engine at {where}: {exc}. Is dockerd running? "
            "(scripts/setup.sh installs and starts it)"
        ) from exc
    client.codepost_address = where  # type: ignore[attr-defined]
    return client


def engine_address(client: docker.DockerClient) -> str:
    """The engine's address as it was given (a Unix socket's client calls every one of them
    ``http+docker://localhost``)."""
    return getattr(client, "codepost_address", client.api.base_url)


def connect_hosts(config: PoolConfig) -> list[docker.DockerClient]:
    """A client for each Docker host of ``config``, each reachable and holding the sandbox
    image; :class:`SandboxUnavailable` names the host and what is missing."""
    clients = [_connect(host) for host in config.docker_hosts or (None,)]
    for client in clients:
        try:
            client.images.get(config.image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(
                f"the sandbox image {config.image!r} is not on the Docker host "
                f"{engine_address(client)}: build it with scripts/setup.sh"
            ) from exc
    return clients


OWNER_LABEL = "codepost.owner"


def _owner() -> str:
    """This process's label value (called when used: a forked child is an owner of its own)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _remove_orphans(client: docker.DockerClient) -> None:
    """Remove the containers, running or stopped, of pools whose process died on this host
    (killed, crashed): a container keeps running after its owner is gone. Other hosts' and
    live pools' are kept, stopped ones too (their pool removes them)."""
    # ignore_removed: another pool may remove a container between the listing and its inspection
    for container in client.containers.list(
        all=True, filters={"label": OWNER_LABEL}, ignore_removed=True
    ):
        host, _, pid = container.labels.get(OWNER_LABEL, "").rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid)):
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)


def _is_local(client: docker.DockerClient) -> bool:
    """Whether the engine is on this machine (its Unix socket), where its containers'
    processes are this machine's too."""
    return client.api.base_url == "http+docker://localhost"


class _Container:
    """One warm container and the stream to its supervisor: a Unix socket, or the attached
    stdin and stdout (``demux``: each chunk behind a header of Docker's)."""

    def __init__(self, client: docker.DockerClient, config: PoolConfig) -> None:
        uid = 200_000 + 2 * secrets.randbelow(50_000_000)  # own uids: RLIMIT_NPROC is per uid
        tmpfs = f"rw,nosuid,nodev,size={config.tmpfs_mb}m,nr_inodes={config.tmpfs_inodes}"
        try:
            self.container = client.containers.run(
                config.image,
                detach=True,
                stdin_open=True,
                environment={
                    "CODEPOST_CANDIDATE_UID": str(uid),
                    "CODEPOST_JUDGE_UID": str(uid + 1),
                },
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                cap_add=["SETUID", "SETGID", "KILL"],
                security_opt=["no-new-privileges"],
                pids_limit=config.container_pids,
                mem_limit=f"{config.container_memory_mb}m",
                memswap_limit=f"{config.container_memory_mb}m",
                nano_cpus=int(config.cpus * 1e9),
                # Root's, like /tmp: a program cannot leave a mode, an ACL or an extended
                # attribute on the directory itself for the next one.
                tmpfs={
                    **{path: f"{tmpfs},mode=1777" for path in ("/work", "/tmp", "/dev/shm")},
                    # A job's compiled program: root's, so no program can change it; the only
                    # one of them a program may execute from (Docker's default is noexec).
                    languages.BUILDS_DIR: f"{tmpfs},exec,mode=0711",
                },
                sysctls={
                    "kernel.shm_rmid_forced": "1",
                    "kernel.msgmni": "0",
                    "kernel.sem": "0 0 0 0",
                    "fs.mqueue.queues_max": "0",
                },
                labels={"codepost.sandbox": "1", OWNER_LABEL: _owner()},
                # No log: every reply would go to it too (dockerd's JSON logging of the replies
                # cost 0.7 ms of CPU per job), and a pool that runs for a whole training run
                # would fill the disk. The host logs what a supervisor reports as an error.
                log_config=docker.types.LogConfig(type="none"),
            )
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(
                f"the sandbox image {config.image!r} is not on the Docker host: build it with "
                "scripts/setup.sh (or `docker build -f Dockerfile.sandbox -t "
                f"{config.image} .`)"
            ) from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxUnavailable(
                f"cannot start a sandbox container on {engine_address(client)}: {exc}"
            ) from exc
        self.payload = bytearray()  # the stream's bytes not yet parsed into frames
        self.next_id = 0
        self.demux = True
        try:  # a container that never becomes healthy is removed, not left running
            stream = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
            # a local Docker socket's stream is a socket.SocketIO over this socket
            self.sock: socket.socket = stream._sock  # type: ignore[union-attr]
            pong = self.request({"op": "ping"}, timeout=30.0)
            if pong.get("socket") and _is_local(client):
                self._connect(pong["socket"])
            runner = pong.get("runner")
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            self.remove()
            raise _ContainerFault(f"could not attach to a sandbox container: {exc}") from exc
        except BaseException:
            self.remove()
            raise
        if runner != source_version():
            self.destroy()
            raise SandboxUnavailable(
                f"the sandbox image {config.image!r} runs other runner code (version {runner}) "
                f"than this codepost ({source_version()}): rebuild it with scripts/setup.sh"
            )

    def _connect(self, path: str) -> None:
        """The supervisor's socket in place of the attached stream, when this process can
        reach it through ``/proc/<pid>/root`` (root, in the engine's PID namespace); else the
        next frame goes on the attached stream, which tells the supervisor to stay on it."""
        self.container.reload()
        pid = self.container.attrs["State"]["Pid"]
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(f"/proc/{pid}/root{path}")
        except OSError:
            connection.close()
            return
        peer = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size)
        if _PEER_CREDENTIALS.unpack(peer)[0] != pid:  # only the supervisor listens before jobs
            connection.close()
            raise _ContainerFault("the sandbox's socket is not its supervisor's")
        self.sock.close()
        self.sock, self.demux = connection, False

    @overload
    def request(
        self, message: wire.Ping, timeout: float, silence: float | None = None
    ) -> wire.Pong: ...
    @overload
    def request(
        self, message: wire.Run, timeout: float, silence: float | None = None
    ) -> wire.Result: ...
    def request(
        self, message: wire.Request, timeout: float, silence: float | None = None
    ) -> wire.Pong | wire.Result:
        """The reply to ``message`` within ``timeout`` s; heartbeats are skipped, and more than
        ``silence`` s without any data is a fault (a paused or frozen container)."""
        self.next_id += 1
        data = frame({**message, "id": self.next_id})
        if len(data) - HEADER.size > MAX_FRAME_BYTES:
            raise _TooLarge(
                f"the job is {len(data) - HEADER.size} bytes (program and stdin), over the "
                f"sandbox's limit of {MAX_FRAME_BYTES}"
            )
        deadline = time.monotonic() + timeout
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(data)
            reply = self._read_frame(deadline, silence or timeout)
            while "heartbeat" in reply:
                reply = self._read_frame(deadline, silence or timeout)
        except (OSError, ValueError, ProtocolError) as exc:  # socket.timeout is an OSError
            raise _ContainerFault(f"no reply from the sandbox supervisor: {exc!r}") from exc
        if reply.get("id") != self.next_id:
            raise _ContainerFault("reply out of order")
        if "internal_error" in reply:
            raise _ContainerFault(f"supervisor error: {reply['internal_error']}")
        return reply

    def _read_frame(self, deadline: float, silence: float) -> Any:
        """The supervisor's next frame, of any size (it is trusted, and each job's limits bound
        its reply)."""
        while (found := split_frame(self.payload, max_bytes=None)) is None:
            self.payload += self._next_chunk(deadline, silence)
        message, end = found
        del self.payload[:end]
        return message

    def _next_chunk(self, deadline: float, silence: float) -> bytes:
        """The next bytes of the supervisor's stdout: as they come from its socket, or from the
        attached stream, past Docker's headers and without its stderr."""
        if not self.demux:
            return self._recv(1 << 20, deadline, silence)
        while True:
            header = self._recv_exact(_DOCKER_HEADER.size, deadline, silence)
            stream, size = _DOCKER_HEADER.unpack(header)
            chunk = self._recv_exact(size, deadline, silence)
            if stream == 1:
                return chunk

    def _recv_exact(self, n: int, deadline: float, silence: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            buf += self._recv(n - len(buf), deadline, silence)
        return bytes(buf)

    def _recv(self, most: int, deadline: float, silence: float) -> bytes:
        """Up to ``most`` bytes, at least one."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("past the host deadline")
        self.sock.settimeout(min(left, silence))
        try:
            chunk = self.sock.recv(most)
        except TimeoutError:
            if time.monotonic() < deadline:
                raise TimeoutError(f"nothing for {silence} s: paused or frozen") from None
            raise
        if not chunk:
            raise ValueError("the sandbox container closed its stream")
        return chunk

    def remove(self) -> None:
        """Remove the container (running, paused or already gone); callable from any thread."""
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            log.warning("could not remove sandbox container %s: %s", self.container.short_id, exc)

    def destroy(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self.remove()


_STOP = object()
# A job that broke this many containers in a row, every one after the first started for it,
# broke them itself.
REPEATED_FAULTS = 2


class SandboxPool:
    """Warm containers behind a blocking, a future-based and an asyncio API."""

    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self._jobs: queue.Queue = queue.Queue()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._clients: list[docker.DockerClient] = []
        self._closed = False
        self._live: set[_Container] = set()  # for close(abort=True), from another thread
        self._live_lock = threading.Lock()  # not _lock: start() holds that while workers start
        self._aborted = False

    # -- lifecycle

    def start(self) -> SandboxPool:
        with self._lock:
            if self._workers:
                return self
            if self._closed:
                raise RuntimeError("the pool is closed")
            self._clients = connect_hosts(self.config)
            for client in self._clients:
                _remove_orphans(client)
            for host in self.config.docker_hosts or (None,):  # removed when this process dies
                guard_containers(host, OWNER_LABEL, _owner())
            ready: queue.Queue = queue.Queue()
            for index in range(self.config.size):
                client = self._clients[index % len(self._clients)]
                worker = threading.Thread(
                    target=self._work,
                    args=(client, ready),
                    name=f"sandbox-{index}",
                    daemon=True,
                )
                worker.start()
                self._workers.append(worker)
            # Jobs start on the first container that is up; the others join as they come.
            first = ready.get()
            if first is not None:  # the engine or the image cannot be used: say so now
                self._stop_workers()
                raise first
        return self

    def close(self, abort: bool = False) -> None:
        """Cancel the jobs still queued and remove the containers. The jobs running finish
        first or, with ``abort`` (an interrupted run: SIGTERM, Ctrl-C), end now as sandbox
        errors, their containers removed at once."""
        if abort:
            with self._live_lock:
                self._aborted = True
                live = list(self._live)
            for container in live:
                container.remove()  # the worker waiting on its reply sees the stream close
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[1].cancel()
            self._stop_workers()

    def _stop_workers(self) -> None:
        for _ in self._workers:
            self._jobs.put(_STOP)
        for worker in self._workers:
            worker.join(timeout=60)
        self._workers = []

    def __enter__(self) -> SandboxPool:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- submitting

    def submit(self, job: Job) -> Future[ExecutionResult]:
        if not self._workers:
            self.start()
        future: Future[ExecutionResult] = Future()
        self._jobs.put((job, future))
        return future

    def run(self, job: Job) -> ExecutionResult:
        return self.submit(job).result()

    async def arun(self, job: Job) -> ExecutionResult:
        return await asyncio.wrap_future(self.submit(job))

    def map(self, jobs: Iterable[Job]) -> Iterator[ExecutionResult]:
        """Results in job order, all jobs in flight at once."""
        futures = [self.submit(job) for job in jobs]
        return (future.result() for future in futures)

    # -- the worker that owns one container

    def _start_container(self, client: docker.DockerClient) -> _Container:
        container = _Container(client, self.config)
        with self._live_lock:
            if not self._aborted:
                self._live.add(container)
                return container
        container.destroy()
        raise _ContainerFault("the pool was closed")

    def _discard(self, container: _Container) -> None:
        with self._live_lock:
            self._live.discard(container)
        container.destroy()

    def _work(self, client: docker.DockerClient, ready: queue.Queue) -> None:
        try:
            container: _Container | None = self._start_container(client)
            ready.put(None)
        except (SandboxUnavailable, _ContainerFault) as exc:
            log.warning("a sandbox container did not start: %s", exc)
            ready.put(exc if isinstance(exc, SandboxUnavailable) else SandboxUnavailable(str(exc)))
            return
        while True:
            item = self._jobs.get()
            if item is _STOP:
                break
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result, container = self._execute(client, container, job)
                future.set_result(result)
            except SandboxUnavailable as exc:
                future.set_exception(exc)
                container = None
            except Exception as exc:  # never let a worker die with a future unresolved
                log.exception("sandbox worker error")
                future.set_exception(exc)
        if container is not None:
            self._discard(container)

    def _execute(
        self, client: docker.DockerClient, container: _Container | None, job: Job
    ) -> tuple[ExecutionResult, _Container | None]:
        payload = _job_payload(job, self.config)
        deadline = _host_deadline(payload, self.config.grace_s)
        error, attempt, faults = "no attempt made", 0, 0
        for attempt in range(1, self.config.max_attempts + 1):
            if self._aborted:
                error = "the pool was closed"
                break
            if container is None:
                try:
                    container = self._start_container(client)
                except _ContainerFault as exc:
                    error = str(exc)
                    continue
            try:
                reply = container.request(
                    {"op": "run", "job": payload}, timeout=deadline, silence=self.config.silence_s
                )
            except _TooLarge as exc:  # at once: retrying cannot help
                return ExecutionResult(ExecStatus.SANDBOX_ERROR, error=str(exc)), container
            except _ContainerFault as exc:
                error, faults = str(exc), faults + 1
                if not self._aborted:
                    log.warning("sandbox container failed (attempt %d): %s", attempt, exc)
                self._discard(container)
                container = None
                if faults == REPEATED_FAULTS and not self._aborted:
                    return _broke_its_containers(faults, error), container
                continue
            if reply.get("leftover_processes"):
                log.warning(
                    "sandbox container kept %d processes after a sweep; replacing it",
                    reply["leftover_processes"],
                )
                self._discard(container)
                container = None
            return _to_result(reply, attempt), container
        return ExecutionResult(
            status=ExecStatus.SANDBOX_ERROR, error=error, attempts=attempt
        ), container


def _broke_its_containers(faults: int, error: str) -> ExecutionResult:
    """The verdict of a job that broke a container started for it after breaking another: the
    program's doing, not the infrastructure's, so never a ``sandbox_error`` (which a training
    run leaves out of its rewards)."""
    return ExecutionResult(
        status=ExecStatus.RUNTIME_ERROR,
        error=f"the program broke {faults} sandbox containers, the last one started for it: "
        f"{error}",
        attempts=faults,
    )


def run_in_fresh_container(job: Job, config: PoolConfig | None = None) -> ExecutionResult:
    """One execution in a container started for it and removed after: what the pool avoids.

    Same image, isolation and verdicts as the pool; for baselines and one-off debugging.
    """
    config = config or PoolConfig()
    container = _Container(
        _connect(config.docker_hosts[0] if config.docker_hosts else None), config
    )
    try:
        payload = _job_payload(job, config)
        reply = container.request(
            {"op": "run", "job": payload},
            timeout=_host_deadline(payload, config.grace_s),
            silence=config.silence_s,
        )
        return _to_result(reply, attempts=1)
    finally:
        container.destroy()


def _host_deadline(payload: wire.Job, grace_s: float) -> float:
    """How long the host waits for a job's reply: its compile and every case at their
    stretched wall limits, then the grace. Value tests may run twice, each time with the job's
    time: replies too large to read in the supervisor send the job to a judge, and replies
    costly to decide go to a decider."""
    limits = payload["limits"]
    if "judge" in payload:
        cases, runs = 1, 1 if payload["judge"]["values"] is None else 2
    else:
        cases, runs = len(payload["stdin_cases"]) or 1, 1
    compile_s = limits["compile_cap_s"] if languages.get(payload["language"]).compiled else 0.0
    longest = compile_s + limits["wall_cap_s"] * cases * runs
    if limits["job_time_s"] is not None:
        longest = min(longest, limits["job_time_s"] * runs)
    return longest + grace_s


def _job_payload(job: Job, config: PoolConfig) -> wire.Job:
    stretch = max(1.0, config.wall_stretch)
    limits: wire.Limits = {
        "wall_time_s": job.limits.wall_time_s,
        "cpu_time_s": job.limits.cpu_time_s,
        "memory_mb": job.limits.memory_mb,
        "output_bytes": job.limits.output_bytes,
        "processes": job.limits.processes,
        "disk_mb": job.limits.disk_mb,
        "compile_time_s": job.limits.compile_time_s,
        "compile_memory_mb": job.limits.compile_memory_mb,
        "job_time_s": job.limits.job_time_s,
        "wall_cap_s": job.limits.wall_time_s * stretch,
        "compile_cap_s": job.limits.compile_time_s * stretch,
        "cpus": config.cpus,
    }
    if job.judge is not None:
        return {
            "program": job.program,
            "language": job.language,
            "limits": limits,
            "judge": {
                "setup": job.judge.setup,
                "tests": list(job.judge.tests),
                "test_names": list(job.judge.test_names),
                "pytest": job.judge.pytest,
                "values": None if job.judge.values is None else _values(job.judge),
            },
        }
    return {
        "program": job.program,
        "language": job.language,
        "limits": limits,
        "stdin_cases": list(job.stdin_cases or ()),
        "files": {path: base64.b64encode(data).decode() for path, data in job.files.items()},
        "fetch_files": list(job.fetch_files),
        "stop_at_failure": job.stop_at_failure,
    }


def _values(judge: JudgeSpec) -> wire.Values:
    """Value tests in the codec's tokens: tuples, sets and big ints as the judge's own."""
    return {
        "target": judge.target,
        "cases": [
            {
                "args": None if case.args is None else encode(list(case.args), _no_refs),
                "expected": encode(case.expected, _no_refs),
                "message": case.message,
                "compare": case.compare,
                "tolerance": case.tolerance,
            }
            for case in judge.values or ()
        ],
    }


def _no_refs(value: Any) -> int:
    raise ValueError(f"a value test holds a {type(value).__name__}, which is not plain data")


def _to_result(reply: wire.Result, attempts: int) -> ExecutionResult:
    compiled = reply.get("compile")
    return ExecutionResult(
        status=ExecStatus(reply["status"]),
        tests=tuple(TestOutcome(**test) for test in reply.get("tests", ())),
        cases=tuple(
            CaseOutcome(
                status=ExecStatus(case["status"]),
                stdout=case["stdout"],
                stderr=case["stderr"],
                exit_code=case["exit_code"],
                duration_s=case["duration_s"],
                files={path: base64.b64decode(data) for path, data in case["files"].items()},
            )
            for case in reply.get("cases", ())
        ),
        stdout=reply.get("stdout", ""),
        stderr=reply.get("stderr", ""),
        error=reply.get("error"),
        duration_s=reply.get("duration_s", 0.0),
        attempts=attempts,
        compile=None
        if compiled is None
        else CompileOutcome(
            status=ExecStatus(compiled["status"]),
            stdout=compiled["stdout"],
            stderr=compiled["stderr"],
            exit_code=compiled["exit_code"],
            duration_s=compiled["duration_s"],
        ),
    )
