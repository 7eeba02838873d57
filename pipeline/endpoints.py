"""Whether an HTTP service answers, within seconds: what a command checks before it starts (a
tracker's server, the model hub), where the services' own clients retry for minutes first."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    status: int | None  # the HTTP status; None: no answer at all
    reason: str


def ask(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> Answer:
    """GET ``url``, waiting ``timeout_s`` at most for each step (connecting, the answer)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Answer(response.status, f"{response.status} {response.reason}")
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, f"{exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError) as exc:  # refused, unresolved, timed out
        cause = getattr(exc, "reason", exc)
        if isinstance(cause, TimeoutError):
            return Answer(None, f"no answer within {timeout_s:g} s")
        return Answer(None, f"no answer ({cause})")
