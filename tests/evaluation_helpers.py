"""Evaluation folders as ``run_evaluate`` leaves them, written by tests of the report and of
``codepost evaluate --compare`` (no model, no sandbox)."""

from __future__ import annotations

import json
from pathlib import Path

from codepost.pipeline.reporting.evaluations import pass_at_k_of_rows, write_per_problem


def write_evaluation(
    folder: Path,
    checkpoint: str,
    greedy: dict[str, bool] | None,
    sampled: dict[str, tuple[int, int]] | None = None,
    *,
    ks: tuple[int, ...] = (1, 4),
    fingerprint: str = "f" * 16,
    sandbox_errors: frozenset[str] = frozenset(),
    episodes: dict[str, list[list[bool]]] | None = None,
) -> Path:
    """An evaluation folder as ``run_evaluate`` leaves it: ``samples.jsonl`` (greedy outcomes,
    sampled (n, c) counts), and ``per_problem.jsonl`` and ``evaluation.json`` made from those
    rows. Tasks in ``sandbox_errors`` fail greedy with a sandbox error; ``episodes`` stand for
    ``sampled`` with each sampled episode's outcome after each turn."""
    runs: dict[str, list[dict]] = {}
    if greedy is not None:
        runs["greedy"] = [
            {
                "prompt_id": task,
                "passed": passed,
                "status": "sandbox_error"
                if task in sandbox_errors
                else ("passed" if passed else "failed"),
            }
            for task, passed in greedy.items()
        ]
    if sampled is not None:
        runs["sampled"] = [
            {"prompt_id": task, "passed": i < c, "status": "passed" if i < c else "failed"}
            for task, (n, c) in sampled.items()
            for i in range(n)
        ]
    if episodes is not None:  # sampled episodes: each one's answer passed after each turn
        runs["sampled"] = [
            {"prompt_id": task, "passed": turns[-1], "turn_passed": turns,
             "status": "passed" if turns[-1] else "failed"}
            for task, each in episodes.items()
            for turns in each
        ]  # fmt: skip
    tasks = {row["prompt_id"] for rows in runs.values() for row in rows}
    results: dict = {
        "checkpoint": checkpoint,
        "problems": {"source": "test"},
        "problems_fingerprint": fingerprint,
        "num_problems": len(tasks),
        "config": {},
    }
    for run, rows in runs.items():
        results[run] = {
            **pass_at_k_of_rows(rows, [1] if run == "greedy" else list(ks)),
            "samples": len(rows),
            "passed": sum(row["passed"] for row in rows),
            "sandbox_errors": sum(row["status"] == "sandbox_error" for row in rows),
            "temperature": 0.0 if run == "greedy" else 0.8,
        }
    folder.mkdir(parents=True, exist_ok=True)
    all_rows = [{"run": run, **row} for run, rows in runs.items() for row in rows]
    (folder / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in all_rows))
    write_per_problem(folder / "per_problem.jsonl", all_rows)
    (folder / "evaluation.json").write_text(json.dumps(results))
    return folder


def outcomes(passed: set[int], problems: int) -> dict[str, bool]:
    return {f"task/{i}": i in passed for i in range(problems)}


BASE = {0, 1, 2, 3}
SFT = {0, 1, 2, *range(4, 11)}  # gains 4..10, loses 3: +7/-1, McNemar p = 18/256
