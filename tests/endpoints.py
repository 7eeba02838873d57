"""Services that are not there, on real loopback sockets: a port that refuses connections and a
listener that takes them and never answers (a hung server)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

from servers import free_port


def closed_port_url() -> str:
    """A loopback URL nothing listens at: a connection is refused at once."""
    return f"http://127.0.0.1:{free_port()}"


@contextlib.contextmanager
def silent_listener_url() -> Iterator[str]:
    """A loopback URL whose listener never accepts: the kernel completes each connection (the
    backlog), and no byte ever comes back."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
