"""Learning run 3: the endpoint's problems, by the rule pre-registered in README.md, from phase
1's screen: the MBPP test problems where SFT passed at least once in its 8 samples at T = 0.7.
Writes them, in codepost's record shape, to the file phase 2's evaluations read.

    .venv/bin/python docs/learning-mbpp-3/select_endpoint.py \\
        runs/learning-mbpp-3/sft/eval/screen/<key>/per_problem.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from codepost.pipeline.data.problem_sets import ProblemSet, load_problem_set
from codepost.pipeline.reporting.evaluations import read_per_problem
from codepost.verifiers.problems import MBPP

ENDPOINT = Path("configs/learning-mbpp-3-endpoint.jsonl")
SAMPLES = 8  # the screen's n, fixed in the pre-registration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("screen", type=Path, help="SFT's per_problem.jsonl of the screen")
    args = parser.parse_args()
    results = read_per_problem(args.screen)
    if len(results) != 500 or any(result.n != SAMPLES for result in results):
        raise SystemExit(f"{args.screen}: not the screen of 500 problems x {SAMPLES} samples")
    chosen = sorted(r.task_id for r in results if (r.passed or 0) >= 1)
    problems = load_problem_set(ProblemSet(source=MBPP, split="test", task_ids=chosen))
    ENDPOINT.write_text(
        "".join(
            json.dumps(p.model_dump(mode="json", exclude_none=True)) + "\n"
            for p in problems.values()
        )
    )
    print(f"{len(chosen)} of {len(results)} problems passed at least once: {ENDPOINT}")


if __name__ == "__main__":
    main()
