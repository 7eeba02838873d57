"""The size of the paired test of sampled pass@1: how often it rejects a true null at alpha.

Each simulated pair of evaluations draws, per problem, a pass probability from Beta(1, 3) (mean
0.25, most problems rarely solved, as on MBPP with a small model), then ``--samples``
completions per problem for each checkpoint from that same probability: no difference. A test
of size alpha rejects such pairs at most an alpha share of the time, within the Monte-Carlo
error of ``--datasets`` pairs (one standard error printed beside each rate). ``--lift`` adds to
the second checkpoint's probabilities instead, for the power at a real difference.

Two tests, on the same pairs: the sign-flip test over problems that ``compare_sampled`` uses
(exact up to 20 non-zero differences, 10,000 random sign patterns beyond), and the percentile
bootstrap p it replaced (issue 40): twice the smaller share of 10,000 paired resamples whose
mean difference falls on either side of 0. The last line is the sign-flip test's largest
rejection rate over the sizes.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np

from codepost.pipeline.reporting.stats import RESAMPLES, sign_flip_p_value
from codepost.verifiers import exact_pass_at_k

Counts = dict[str, tuple[int, int]]
PairTest = Callable[[Counts, Counts], float]


def simulated_pair(
    rng: np.random.Generator, problems: int, samples: int, lift: float = 0.0
) -> tuple[Counts, Counts]:
    """(samples, passed) per problem of two checkpoints on the same problems."""
    probabilities = rng.beta(1.0, 3.0, size=problems)
    before = rng.binomial(samples, probabilities)
    after = rng.binomial(samples, np.clip(probabilities + lift, 0.0, 1.0))
    return (
        {f"t{i}": (samples, int(c)) for i, c in enumerate(before)},
        {f"t{i}": (samples, int(c)) for i, c in enumerate(after)},
    )


def sign_flip(before: Counts, after: Counts) -> float:
    """The p ``compare_sampled`` reports (its bootstrap interval left out: not part of p)."""
    differences = [
        exact_pass_at_k(*after[t], 1) - exact_pass_at_k(*before[t], 1) for t in sorted(before)
    ]
    return sign_flip_p_value(differences)


def percentile_bootstrap(before: Counts, after: Counts) -> float:
    """The p ``compare_sampled`` reported before the sign-flip test (seed 0, as it had; pass@1
    as c/n)."""
    differences = np.array(
        [after[t][1] / after[t][0] - before[t][1] / before[t][0] for t in before]
    )
    if not differences.any():
        return 1.0
    draws = np.random.default_rng(0).integers(0, differences.size, (RESAMPLES, differences.size))
    means = differences[draws].mean(axis=1)
    return min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))


def rejection_rate(
    test: PairTest,
    problems: int,
    datasets: int,
    *,
    samples: int = 8,
    lift: float = 0.0,
    alpha: float = 0.05,
    seed: int = 0,
) -> float:
    """The share of ``datasets`` simulated pairs on which ``test`` gives p < alpha."""
    rng = np.random.default_rng([seed, problems])
    pairs = (simulated_pair(rng, problems, samples, lift) for _ in range(datasets))
    return sum(test(before, after) < alpha for before, after in pairs) / datasets


def standard_error(rate: float, datasets: int) -> float:
    return math.sqrt(rate * (1 - rate) / datasets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, nargs="+", default=[5, 25, 100])
    parser.add_argument("--datasets", type=int, default=2000, help="simulated pairs per size")
    parser.add_argument("--samples", type=int, default=8, help="completions per problem")
    parser.add_argument("--lift", type=float, default=0.0, help="0: the null")
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args()
    tests = {"sign-flip": sign_flip, "percentile bootstrap": percentile_bootstrap}
    print(
        f"rejection rate at alpha={args.alpha} (± 1 s.e.), {args.datasets} pairs per size, "
        f"{args.samples} samples per problem, lift {args.lift:g}"
    )
    print(f"{'problems':>8} | " + " | ".join(f"{name:>22}" for name in tests))
    worst = 0.0
    for problems in args.problems:
        rates = {
            name: rejection_rate(
                test,
                problems,
                args.datasets,
                samples=args.samples,
                lift=args.lift,
                alpha=args.alpha,
            )
            for name, test in tests.items()
        }
        shown = [
            f"{rate:.4f} ± {standard_error(rate, args.datasets):.4f}" for rate in rates.values()
        ]
        print(f"{problems:>8} | " + " | ".join(f"{cell:>22}" for cell in shown))
        worst = max(worst, rates["sign-flip"])
    print(f"sign-flip: largest rejection rate {worst:.4f}")


if __name__ == "__main__":
    main()
