"""Where the main job's wall time went: its phases as shares of the run, read from a run folder's
``logs/run.log`` (the job is not rerun).

The phases are what the run logged with a duration: engines (vLLM's start, from its
``non-default args`` line to its ``init engine ... took`` line, and the RL iterations' weight
refreshes), generation (each finished ``sampling`` progress bar), scoring (``scoring ...``),
training (SFT/DPO ``training steps``, each RL iteration's ``time/update_s``) and publishing
(each RL iteration's ``time/save_s``). Wall time is the first line's clock to the last line's
(a run resumed after a stop counts its pause). The rest (``other``: imports, model loading,
SFT/DPO publishing, Prefect, the reports) is wall time less the phases: nothing separate logs
it.

    .venv/bin/python benchmarks/main_job.py runs/post-train
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta
from pathlib import Path

LINE = re.compile(r"^(\d\d:\d\d:\d\d) ")
# A finished progress bar: "<what>: <done>/<total> in 4m 14s".
FINISHED = re.compile(
    r"codepost\.progress: (?P<what>[^\[][^:]*(?:: [^:]+)?): \d+/\d+ in (?P<d>.+)$"
)
DURATION = re.compile(r"(?:(\d+)h ?)?(?:(\d+)m ?)?(?:(\d+)s)?$")
PHASES = {  # progress bar name -> phase
    "sampling": "generation",
    "scoring": "scoring",
    "training steps": "training",
    "update": "training",
}
# An RL iteration's line: "..., time/update_s 198.2, time/save_s 3.1, time/refresh_s 0.9".
ITERATION_PHASES = re.compile(r"time/(update|save|refresh)_s (\d+(?:\.\d+)?)")
PER_ITERATION = {"update": "training", "save": "publishing", "refresh": "engines"}
ENGINE_START = "non-default args"
ENGINE_READY = "init engine"


def seconds_of(text: str) -> float:
    match = DURATION.search(text.strip())
    if match is None or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r}")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return 3600 * hours + 60 * minutes + seconds


def phase_of(what: str) -> str | None:
    return next((phase for key, phase in PHASES.items() if key in what), None)


def phases(log: Path) -> tuple[float, dict[str, float]]:
    """The run's wall seconds and each phase's seconds."""
    clock: list[datetime] = []  # each line's time, made monotonic across midnight
    totals = dict.fromkeys(["engines", "generation", "scoring", "training", "publishing"], 0.0)
    engine_started: datetime | None = None
    for line in log.read_text(errors="replace").splitlines():
        stamp = LINE.match(line)
        if stamp is None:
            continue
        now = datetime.strptime(stamp.group(1), "%H:%M:%S")
        while clock and now < clock[-1]:
            now += timedelta(days=1)
        clock.append(now)
        if ENGINE_START in line:
            engine_started = now
        elif ENGINE_READY in line and engine_started is not None:
            totals["engines"] += (now - engine_started).total_seconds()
            engine_started = None
        for name, seconds in ITERATION_PHASES.findall(line):
            totals[PER_ITERATION[name]] += float(seconds)
        finished = FINISHED.search(line)
        if finished and (phase := phase_of(finished.group("what"))):
            totals[phase] += seconds_of(finished.group("d"))
    if len(clock) < 2:
        raise SystemExit(f"{log}: no timed lines")
    return (clock[-1] - clock[0]).total_seconds(), totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run folder (its logs/run.log)")
    args = parser.parse_args()
    wall, totals = phases(args.run_dir / "logs" / "run.log")
    totals["other"] = max(0.0, wall - sum(totals.values()))
    print(f"{args.run_dir}: wall {wall / 60:.1f} min")
    for name, seconds in totals.items():
        print(f"{name:14s} {seconds / 60:7.1f} min  {seconds / wall:6.1%}")
    print(f"generation share: {totals['generation'] / wall:.2f}")


if __name__ == "__main__":
    main()
