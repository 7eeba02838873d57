"""A child process's output, bytes as they come, in lines for a log: what the stage worker and
the ranks of a launched stage show while they run."""

from __future__ import annotations

import time

PROGRESS_EVERY_S = 15.0


class OutputLines:
    """Splits output into its lines as each ends. A progress bar redraws one line with ``\\r``:
    an ended line is its last state, and a line still being redrawn shows its state every
    :data:`PROGRESS_EVERY_S` (long work shows progress, not one line per redraw)."""

    def __init__(self) -> None:
        self._partial = b""
        self._progress_shown = time.monotonic()

    def feed(self, data: bytes) -> list[str]:
        """The lines ``data`` completes (and a progress bar's state when it is time to show it);
        at the end of the output, ``feed(b"\\n")`` gives a last line that did not end."""
        data = self._partial + data
        complete = data.rfind(b"\n") + 1
        lines = [
            text
            for line in data[:complete].decode(errors="replace").splitlines()
            if (text := line.rsplit("\r", 1)[-1].rstrip())
        ]
        partial = data[complete:]
        redraws = partial.decode(errors="replace").split("\r")
        now = time.monotonic()
        if len(redraws) > 2 and now - self._progress_shown > PROGRESS_EVERY_S:
            self._progress_shown = now
            lines.append(redraws[-2].strip())
        # a bar's earlier states are never shown again: keep the one being drawn
        self._partial = partial[partial.rfind(b"\r") :] if b"\r" in partial else partial
        return lines
