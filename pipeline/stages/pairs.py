"""Pair mining: scored rollouts (Parquet) -> (prompt, chosen, rejected) pairs for DPO / IPO.

Within each prompt's group, ``chosen`` beats ``rejected`` when it passes and the other does not,
or (with ``reward_margin``) when its reward is higher by at least the margin, or (with
``tests_margin``) when it passes a larger share of the tests by at least the margin. Strategies:

* ``best_vs_worst``: the highest-ranked completion against the lowest-ranked;
* ``shortest_passing``: the shortest passing completion against a random failing one (teaches
  concise answers rather than the padding a plain best-vs-worst can reward);
* ``all_pairs``: every preferred pair, shuffled, up to ``max_pairs_per_prompt``.

Completions with the same code (after dropping comments and normalising whitespace) count once,
and a pair found by two strategies is kept once, under the first. Sandbox errors (``excluded``)
are never used. Whole prompts are held out for the eval loss, so held-out pairs are unseen.
The pairs are published as a ``datasets.DatasetDict`` (train / test) with a manifest whose
metrics carry the counts.
"""

from __future__ import annotations

import io
import math
import random
import re
import tokenize
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...settings.config import Seed
from ...verifiers import extract_code
from ..checkpoints.manifest import publish, read_manifest, sha256_file
from ..data.rows import TO_PAIR, read_rows
from ..training import already_published, console, stage_manifest
from .registry import Artifacts, Stage, register

Strategy = Literal["best_vs_worst", "shortest_passing", "all_pairs"]
# column -> its ``datasets`` dtype
PAIR_COLUMNS = {
    "prompt_id": "string",
    "prompt": "string",
    "chosen": "string",
    "rejected": "string",
    "strategy": "string",
    "chosen_reward": "float64",
    "rejected_reward": "float64",
    "rejected_status": "string",
}


class PairMiningConfig(BaseModel):
    """How preference pairs are drawn from scored rollouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategies: list[Strategy] = Field(
        default_factory=lambda: list[Strategy](["best_vs_worst", "shortest_passing", "all_pairs"]),
        min_length=1,
        description="in priority order: a pair two strategies find counts for the first",
    )
    reward_margin: float | None = Field(
        None, gt=0, description="also prefer a reward higher by this much; None = pass/fail only"
    )
    tests_margin: float | None = Field(
        None,
        gt=0,
        le=1,
        description="also prefer a share of tests passed higher by this much (more against "
        "fewer tests passed); None = pass/fail only",
    )
    max_pairs_per_prompt: int = Field(4, ge=1, description="cap of all_pairs per prompt")
    held_out_fraction: float = Field(
        0.1, ge=0, lt=1, description="share of prompts (with pairs) held out for the eval loss"
    )
    several_policies: bool = Field(
        False,
        description="mine rollouts sampled by several checkpoints (an RL run's) as offline "
        "pairs, DPO's own model then being their reference; off: such rollouts are refused, "
        "as DPO's reference should be the policy that sampled the pairs",
    )
    seed: Seed = 0


class MinedPairs(BaseModel):
    """What mining produced: the published pairs (None when there were none) and the counts."""

    model_config = ConfigDict(frozen=True)

    path: Path | None
    counts: dict[str, int]
    message: str


def normalize_code(completion: str, style: str) -> str:
    """The code of a completion without comments, blank lines or layout differences."""
    code = extract_code(completion) if style == "chat" else completion
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    try:
        tokens = [
            t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in skip
        ]
    except (tokenize.TokenError, SyntaxError):  # not Python: drop #-comments, squeeze spaces
        return " ".join(re.sub(r"#[^\n]*", "", code).split())
    marks = {tokenize.NEWLINE: ";", tokenize.INDENT: "{", tokenize.DEDENT: "}"}
    return " ".join(marks.get(t.type, t.string) for t in tokens)


def _rank(row: dict[str, Any]) -> tuple[bool, float, float]:
    reward = row["reward"]
    reward = reward if reward is not None and math.isfinite(reward) else -math.inf
    return (bool(row["passed"]), reward, row.get("pass_fraction") or 0.0)


def _prefers(a: dict[str, Any], b: dict[str, Any], config: PairMiningConfig) -> bool:
    if a["passed"] and not b["passed"]:
        return True
    if config.reward_margin is not None and _rank(a)[1] - _rank(b)[1] >= config.reward_margin:
        return True
    return config.tests_margin is not None and _rank(a)[2] - _rank(b)[2] >= config.tests_margin


def _group_pairs(
    group: list[dict[str, Any]], strategy: Strategy, config: PairMiningConfig, rng: random.Random
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(chosen, rejected) rows of one prompt's deduplicated group under one strategy."""
    if strategy == "best_vs_worst":
        best = max(group, key=lambda r: (_rank(r), -len(r["completion"])))
        worst = min(group, key=_rank)
        return [(best, worst)] if _prefers(best, worst, config) else []
    if strategy == "shortest_passing":
        passing = [r for r in group if r["passed"]]
        if not passing:
            return []
        chosen = min(passing, key=lambda r: len(r["completion"]))
        losers = [r for r in group if _prefers(chosen, r, config)]
        return [(chosen, rng.choice(losers))] if losers else []
    pairs = [(a, b) for a in group for b in group if a is not b and _prefers(a, b, config)]
    rng.shuffle(pairs)
    return pairs[: config.max_pairs_per_prompt]


def mine_pairs(
    rows: list[dict[str, Any]], config: PairMiningConfig
) -> tuple[dict[str, list[dict[str, Any]]], Counter[str]]:
    """Pairs by prompt id, and the counts (per strategy, duplicates, prompts without a pair)."""
    counts: Counter[str] = Counter()
    groups: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in sorted(rows, key=_rank, reverse=True):  # the best copy of duplicate code stays
        if row.get("excluded"):
            counts["excluded_rows"] += 1
            continue
        key = normalize_code(row["completion"], row["completion_style"])
        if key in groups[row["prompt_id"]]:
            counts["duplicate_completions"] += 1
        else:
            groups[row["prompt_id"]][key] = {**row, "key": key}
    rng = random.Random(config.seed)
    pairs_by_prompt: dict[str, list[dict[str, Any]]] = {}
    for prompt_id in sorted(groups):
        group = list(groups[prompt_id].values())
        seen: set[tuple[str, str]] = set()
        pairs = []
        for strategy in config.strategies:
            for chosen, rejected in _group_pairs(group, strategy, config, rng):
                if (chosen["key"], rejected["key"]) in seen:
                    counts["duplicate_pairs"] += 1
                    continue
                seen.add((chosen["key"], rejected["key"]))
                counts[strategy] += 1
                pairs.append(_pair_row(prompt_id, chosen, rejected, strategy))
        if pairs:
            pairs_by_prompt[prompt_id] = pairs
        elif all(r["passed"] for r in group):
            counts["prompts_all_passed"] += 1
        else:
            counts["prompts_all_failed"] += 1
    counts["prompts"] = len(groups)
    counts["prompts_with_pairs"] = len(pairs_by_prompt)
    return pairs_by_prompt, counts


def _pair_row(
    prompt_id: str, chosen: dict[str, Any], rejected: dict[str, Any], strategy: str
) -> dict[str, Any]:
    return {
        "prompt_id": prompt_id,
        "prompt": chosen["prompt"],
        "chosen": chosen["completion"],
        "rejected": rejected["completion"],
        "strategy": strategy,
        "chosen_reward": chosen["reward"],
        "rejected_reward": rejected["reward"],
        "rejected_status": rejected.get("status", ""),
    }


def split_prompts(prompt_ids: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """``prompt_ids`` shuffled and cut in two: those to train on and about ``fraction`` of them
    held out (at least one is kept to train on)."""
    shuffled = list(prompt_ids)
    random.Random(seed).shuffle(shuffled)
    held_out = min(round(len(shuffled) * fraction), len(shuffled) - 1)
    return shuffled[held_out:], shuffled[:held_out]


def load_rollouts(rollouts: Path) -> list[dict[str, Any]]:
    """Scored rollout rows from a Parquet file, checked (names the columns it lacks)."""
    return read_rows(rollouts, TO_PAIR)


def sampled_by(
    rows: list[dict[str, Any]], rollouts: Path, several_policies: bool = False
) -> dict[str, str]:
    """``{"sampler_weights": checkpoint}`` when the rows name the one checkpoint that sampled
    them (DPO's reference must be that one); rollouts of several policies share no reference,
    and are refused unless ``several_policies`` (then their count is recorded)."""
    weights = {row["sampler_weights"] for row in rows if row.get("sampler_weights")}
    if len(weights) > 1 and not several_policies:
        raise ValueError(
            f"rollouts {rollouts}: sampled by {len(weights)} checkpoints ({', '.join(sorted(weights))}); "
            "mine each policy's rollouts on their own (DPO has one reference), or set "
            "several_policies to mine them as offline pairs"
        )
    if len(weights) > 1:
        return {"sampler_policies": str(len(weights))}
    return {"sampler_weights": weights.pop()} if weights else {}


def run_pair_mining(config: PairMiningConfig, rollouts: Path, out_dir: Path) -> MinedPairs:
    """Mine, split by prompt and publish the pairs of ``rollouts`` in ``out_dir``; with no pair
    at all, publish nothing and say why."""
    from datasets import Dataset, DatasetDict, Features, Value

    out_dir = Path(out_dir)
    if already_published(out_dir, "pairs", config):
        counts = read_manifest(out_dir).metrics
        return MinedPairs(path=out_dir, counts=counts, message=f"{out_dir} already published")
    rows = load_rollouts(rollouts)
    data = {
        "rollouts": sha256_file(Path(rollouts))[:16],
        **sampled_by(rows, rollouts, config.several_policies),
    }
    pairs_by_prompt, counts = mine_pairs(rows, config)
    if not pairs_by_prompt:
        message = (
            f"no pairs in {rollouts}: of {counts['prompts']} prompts, "
            f"{counts['prompts_all_passed']} had only passing and {counts['prompts_all_failed']} "
            "only failing completions; nothing to prefer, preference training skipped"
        )
        console.print(f"[yellow]pairs: {message}[/yellow]")
        return MinedPairs(path=None, counts=dict(counts), message=message)

    train, test = split_prompts(sorted(pairs_by_prompt), config.held_out_fraction, config.seed)
    splits = {"test": test, "train": train}
    features = Features({name: Value(dtype) for name, dtype in PAIR_COLUMNS.items()})
    dataset = DatasetDict(
        {
            name: Dataset.from_list(
                [pair for prompt_id in ids for pair in pairs_by_prompt[prompt_id]],
                features=features,
            )
            for name, ids in splits.items()
            if ids  # datasets cannot reload an empty split
        }
    )
    counts.update({f"{name}_pairs": len(split) for name, split in dataset.items()})
    message = f"pairs: {dict(counts)}"
    console.print(message)
    manifest = stage_manifest("pairs", config, str(rollouts), data, counts)
    publish(out_dir, lambda folder: dataset.save_to_disk(str(folder)), manifest)
    return MinedPairs(path=out_dir, counts=dict(counts), message=message)


def _stage(config: PairMiningConfig, inputs: Artifacts, out_dir: Path) -> Artifacts:
    if inputs.scored is None:
        raise ValueError("pairs: no scored rollouts to mine")
    mined = run_pair_mining(config, Path(inputs.scored), out_dir)
    return Artifacts(pairs=str(mined.path) if mined.path else None)


def _check_inputs(config: PairMiningConfig, makers: dict[str, str]) -> None:
    if makers.get("scored") == "rl" and not config.several_policies:
        raise ValueError(
            "pairs mined from an RL stage's rollouts come from every iteration's policy: set "
            "several_policies to train DPO on them as offline pairs"
        )


register(
    Stage(
        name="pairs",
        config=PairMiningConfig,
        run=_stage,
        needs=("scored",),
        makes=("pairs",),
        accelerator=False,
        description="mine (prompt, chosen, rejected) pairs from scored rollouts",
        check_inputs=_check_inputs,
    )
)
