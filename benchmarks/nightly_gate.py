"""The nightly gate over a series of nights, simulated: how often a model that never improves is
promoted at least once within 30, 90 and 365 nights, how soon a real gain is promoted, and how
often a guard stops a real regression. Two rules, on the same simulated nights:

- before: the per-night rule the gate had (two-sided exact McNemar p < alpha with a gain, so
  one-sided at alpha/2 every night; a guard vetoing only a significant loss);
- after: the series' rule (docs/nightly.md): one-sided at the n-th night's share of alpha
  (``level``) on the n-th night tested against a champion; a guard passing only a night shown
  worse by less than the margin (``greedy_noninferiority_p``); both the gate's own functions.

Greedy pass@1 on ``--problems`` problems. Each problem is solved by a checkpoint with its own
rate, drawn from a Beta distribution (mean ``--mean``, concentration ``--concentration``: most
problems nearly always or nearly never solved, the rest in between, so that two checkpoints of
one quality disagree on a share of the problems, printed). The champion's outcomes are drawn
once per series: greedy decoding gives it the same answers every night it is evaluated, so its
luck on the benchmark is shared by all the nights compared with it. Each night's checkpoint is
a fresh draw from the same rates (no gain), or from rates moved on the logit scale so that
their mean moves by the gain (a gain lands on the problems in reach, not on those no model
solves). A series stops at its first promotion: the false-promotion rate counts series promoted
at least once. Monte-Carlo error: one standard error beside each rate.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, logit
from scipy.stats import binom

from codepost.pipeline.nightly.gate import greedy_noninferiority_p, level

CHUNK = 1_000  # series simulated at once: (CHUNK, problems) draws per night
Threshold = Callable[[float, int], float]  # (alpha, n-th night against the champion) -> level
RULES: dict[str, Threshold] = {"before": lambda alpha, n: alpha / 2, "after": level}


@dataclass(frozen=True)
class Population:
    """The benchmark's problems and how checkpoints of one quality solve them."""

    problems: int = 164
    mean: float = 0.4
    concentration: float = 0.5

    def rates(self, rng: np.random.Generator, series: int) -> np.ndarray:
        """Each problem's chance of being solved, one row per series."""
        a, b = self.mean * self.concentration, (1 - self.mean) * self.concentration
        return rng.beta(a, b, size=(series, self.problems))

    @property
    def disagreement(self) -> float:
        """The expected share of problems that two checkpoints of one quality disagree on:
        E[2 r (1 - r)] for r ~ Beta."""
        c = self.concentration
        return 2 * self.mean * (1 - self.mean) * c / (c + 1)


def moved(rates: np.ndarray, change: float) -> np.ndarray:
    """``rates`` moved by one shift on the logit scale per row, so that each row's mean moves
    by ``change`` (bisection)."""
    if change == 0:
        return rates
    logits = logit(np.clip(rates, 1e-12, 1 - 1e-12))
    low, high = np.full(len(rates), -30.0), np.full(len(rates), 30.0)
    target = rates.mean(axis=1) + change
    for _ in range(60):
        shift = (low + high) / 2
        above = expit(logits + shift[:, None]).mean(axis=1) > target
        low, high = np.where(above, low, shift), np.where(above, shift, high)
    return expit(logits + ((low + high) / 2)[:, None])


def gain_p(gained: np.ndarray, lost: np.ndarray) -> np.ndarray:
    """One-sided exact McNemar p of a gain: P(X >= gained), X ~ Binomial(gained + lost, 1/2);
    1 with no discordant problem. Below 1/2 it is the gate's ``Comparison.p_gain``."""
    discordant = gained + lost
    return np.where(discordant > 0, binom.sf(gained - 1, discordant, 0.5), 1.0)


def _outcomes(rng: np.random.Generator, rates: np.ndarray) -> np.ndarray:
    return rng.random(rates.shape) < rates


def _paired(champion: np.ndarray, night: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Problems gained and lost by the night, per series."""
    return (night & ~champion).sum(axis=1), (champion & ~night).sum(axis=1)


def _chunks(series: int) -> Iterator[int]:
    for start in range(0, series, CHUNK):
        yield min(CHUNK, series - start)


def first_promotions(
    population: Population,
    series: int,
    nights: int,
    *,
    gain: float = 0.0,
    first_test: int = 1,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """For each rule, each series' first promoted night (1 to ``nights``; 0: none), the
    nights' checkpoints better than the champion by ``gain`` and tested from the
    ``first_test``-th night against it on."""
    rng = np.random.default_rng(seed)
    first = {rule: [] for rule in RULES}
    for size in _chunks(series):
        rates = population.rates(rng, size)
        night_rates = moved(rates, gain)
        champion = _outcomes(rng, rates)
        promoted = {rule: np.zeros(size, dtype=int) for rule in RULES}
        for night in range(1, nights + 1):
            p = gain_p(*_paired(champion, _outcomes(rng, night_rates)))
            for rule, threshold in RULES.items():
                now = (promoted[rule] == 0) & (p < threshold(alpha, first_test + night - 1))
                promoted[rule][now] = night
        for rule in RULES:
            first[rule].append(promoted[rule])
    return {rule: np.concatenate(chunks) for rule, chunks in first.items()}


def within(first: np.ndarray, nights: int) -> float:
    """The share of series promoted at least once within ``nights``."""
    return float(np.mean((first > 0) & (first <= nights)))


def guard_stops(
    population: Population,
    draws: int,
    change: float,
    *,
    margins: tuple[float, ...] = (0.05,),
    alpha: float = 0.05,
    guard_alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, float]:
    """The share of nights whose pass@1 on the guard moved by ``change`` (from a champion
    drawn anew each time) that the guard stops: "before", a loss with two-sided p < alpha;
    "margin m", a night not shown worse by less than m at ``guard_alpha``."""
    rng = np.random.default_rng(seed)
    stopped = dict.fromkeys(["before", *(f"margin {m:g}" for m in margins)], 0)
    for size in _chunks(draws):
        rates = population.rates(rng, size)
        champion, night = _outcomes(rng, rates), _outcomes(rng, moved(rates, change))
        gained, lost = _paired(champion, night)
        stopped["before"] += int(np.sum(gain_p(lost, gained) < alpha / 2))
        for margin in margins:
            p = greedy_noninferiority_p(gained, lost, population.problems, margin)
            stopped[f"margin {margin:g}"] += int(np.sum(p >= guard_alpha))
    return {guard: count / draws for guard, count in stopped.items()}


def standard_error(rate: float, trials: int) -> float:
    return math.sqrt(max(rate, 1 / trials) * (1 - rate) / trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=10_000, help="simulated series per row")
    parser.add_argument("--problems", type=int, default=164)
    parser.add_argument("--mean", type=float, default=0.4, help="mean pass@1 of the problems")
    parser.add_argument("--concentration", type=float, default=0.5, help="of the Beta spread")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--gains", type=float, nargs="+", default=[0.05, 0.10])
    parser.add_argument("--margins", type=float, nargs="+", default=[0.05, 0.08, 0.10])
    parser.add_argument("--guard-alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    population = Population(args.problems, args.mean, args.concentration)
    n, alpha = args.series, args.alpha

    def table(columns: list[str], rows: dict[str, dict[str, float]]) -> None:
        print(f"{'':>28} | " + " | ".join(f"{column:>15}" for column in columns))
        for label, rates in rows.items():
            cells = [f"{rates[c]:.3f} ± {standard_error(rates[c], n):.3f}" for c in columns]
            print(f"{label:>28} | " + " | ".join(f"{cell:>15}" for cell in cells))

    rules = list(RULES)
    print(
        f"{args.problems} problems, mean pass@1 {args.mean}, Beta concentration "
        f"{args.concentration} (two checkpoints of one quality disagree on "
        f"{population.disagreement:.1%} of them), alpha {alpha}, {n} series per row\n"
    )
    print("A model that never improves, promoted at least once within:")
    null = first_promotions(population, n, 365, alpha=alpha, seed=args.seed)
    table(rules, {f"{k} nights": {r: within(null[r], k) for r in rules} for k in (30, 90, 365)})
    for gain in args.gains:
        print(f"\nA real gain of {gain:+.2f} pass@1 on every night, promoted within:")
        rows = {}
        for first_test in (1, 31, 91):
            gained = first_promotions(
                population, n, 30, gain=gain, first_test=first_test, alpha=alpha, seed=args.seed
            )
            for nights in (1, 7, 30) if first_test == 1 else (30,):
                label = f"{nights} night(s) from night {first_test}"
                rows[label] = {r: within(gained[r], nights) for r in rules}
        table(rules, rows)
    print(
        f"\nA guard of {args.problems} problems (guard alpha {args.guard_alpha}), the share of "
        "nights it stops, by the night's change of pass@1 on it:"
    )
    changes = sorted({0.0, -0.024, *(-m for m in args.margins)}, reverse=True)
    stops = {
        f"{change:+.3f}": guard_stops(
            population,
            n,
            change,
            margins=tuple(args.margins),
            alpha=alpha,
            guard_alpha=args.guard_alpha,
            seed=args.seed,
        )
        for change in changes
    }
    table(["before", *(f"margin {m:g}" for m in args.margins)], stops)


if __name__ == "__main__":
    main()
