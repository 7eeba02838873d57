"""The code that runs inside a sandbox container (standard library only)."""

from __future__ import annotations

# Where the supervisor listens for its host, from its first pong to the host's next frame.
HOST_SOCKET = "/tmp/.codepost-host/host.sock"


def source_version() -> str:
    """A hash of this package's sources. The host compares its own with the one a container
    reports, so an image built from other runner code is refused instead of half understood
    (an old supervisor would silently skip a job's files)."""
    # Imported here: the zygotes import this package, and every module they hold is memory each
    # fork copies the page tables of (hashlib and pathlib: 1.3 MB of a zygote's 8.2).
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
