"""Pair mining on hand-built scored rollouts: strategies, duplicates, exclusions, splits."""

from __future__ import annotations

from pathlib import Path

import pytest
from stage_helpers import (
    GOOD_LONG,
    GOOD_LONG_COPY,
    GOOD_SHORT,
    SYNTAX,
    WRONG,
    mixed_group,
    rollout,
    write_rollouts,
)

from codepost.pipeline.checkpoints.manifest import read_manifest
from codepost.pipeline.stages.dpo import load_pairs
from codepost.pipeline.stages.pairs import (
    PairMiningConfig,
    mine_pairs,
    normalize_code,
    run_pair_mining,
)


def test_normalize_code_ignores_comments_and_layout_but_not_structure() -> None:
    assert normalize_code(GOOD_LONG, "chat") == normalize_code(GOOD_LONG_COPY, "chat")
    assert normalize_code(GOOD_LONG, "chat") != normalize_code(GOOD_SHORT, "chat")
    nested = "if a:\n    b()\n    c()\n"
    outside = "if a:\n    b()\nc()\n"
    assert normalize_code(nested, "continuation") != normalize_code(outside, "continuation")
    assert normalize_code("x = (1 +  # open\n", "continuation") == "x = (1 +"


def test_strategies_duplicates_and_exclusions() -> None:
    pairs, counts = mine_pairs(mixed_group("p1"), PairMiningConfig())
    rows = pairs["p1"]
    by_strategy = {
        s: [r for r in rows if r["strategy"] == s] for s in PairMiningConfig().strategies
    }
    # best (highest reward) against worst (lowest reward)
    assert [(r["chosen"], r["rejected"]) for r in by_strategy["best_vs_worst"]] == [
        (GOOD_LONG, SYNTAX)
    ]
    # the shortest passing answer, whichever failing one was drawn
    assert [r["chosen"] for r in by_strategy["shortest_passing"]] == [GOOD_SHORT]
    # every chosen passes, every rejected fails, no sandbox error, no duplicate code used
    assert {r["chosen"] for r in rows} <= {GOOD_LONG, GOOD_SHORT}
    assert {r["rejected"] for r in rows} <= {SYNTAX, WRONG}
    keys = [(r["chosen"], r["rejected"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4  # 2 passing x 2 failing distinct pairs in all
    assert counts["excluded_rows"] == 1
    assert counts["duplicate_completions"] == 1
    assert counts["best_vs_worst"] + counts["shortest_passing"] + counts["all_pairs"] == 4
    assert counts["duplicate_pairs"] == 2  # found again by all_pairs
    assert {r["rejected_status"] for r in rows} <= {"syntax_error", "failed"}


def test_cap_per_prompt_and_reward_margin() -> None:
    capped, _ = mine_pairs(
        mixed_group("p1"), PairMiningConfig(strategies=["all_pairs"], max_pairs_per_prompt=3)
    )
    assert len(capped["p1"]) == 3
    failing = [rollout("p2", WRONG, False, 0.6), rollout("p2", SYNTAX, False, 0.1)]
    assert mine_pairs(failing, PairMiningConfig())[0] == {}
    pairs, _ = mine_pairs(failing, PairMiningConfig(reward_margin=0.3))
    assert {(r["chosen"], r["rejected"]) for r in pairs["p2"]} == {(WRONG, SYNTAX)}
    assert mine_pairs(failing, PairMiningConfig(reward_margin=0.6))[0] == {}


def test_tests_margin_prefers_more_tests_passed() -> None:
    more, fewer = rollout("p3", WRONG, False, 0.0), rollout("p3", SYNTAX, False, 0.0)
    more["pass_fraction"], fewer["pass_fraction"] = 0.75, 0.25
    assert mine_pairs([more, fewer], PairMiningConfig())[0] == {}
    pairs, _ = mine_pairs([more, fewer], PairMiningConfig(tests_margin=0.5))
    assert {(r["chosen"], r["rejected"]) for r in pairs["p3"]} == {(WRONG, SYNTAX)}
    assert mine_pairs([more, fewer], PairMiningConfig(tests_margin=0.6))[0] == {}


def test_published_pairs_hold_out_whole_prompts(tmp_path: Path) -> None:
    rows = [row for i in range(10) for row in mixed_group(f"p{i}")]
    rollouts = write_rollouts(tmp_path / "rollouts.parquet", rows)
    config = PairMiningConfig(held_out_fraction=0.3)
    mined = run_pair_mining(config, rollouts, tmp_path / "pairs")
    assert mined.path == tmp_path / "pairs"
    dataset = load_pairs(mined.path)
    train_ids, test_ids = set(dataset["train"]["prompt_id"]), set(dataset["test"]["prompt_id"])
    assert len(test_ids) == 3 and len(train_ids) == 7 and not train_ids & test_ids
    assert len(dataset["train"]) + len(dataset["test"]) == 40
    metrics = read_manifest(mined.path).metrics
    assert metrics["test_pairs"] == len(dataset["test"]) and metrics["prompts_with_pairs"] == 10
    # a rerun finds the published pairs and reports the same counts
    assert run_pair_mining(config, rollouts, tmp_path / "pairs").counts == metrics
    nothing_held_out = run_pair_mining(
        PairMiningConfig(held_out_fraction=0), rollouts, tmp_path / "all"
    )
    assert list(load_pairs(nothing_held_out.path)) == ["train"]


@pytest.mark.parametrize("passed", [True, False])
def test_no_pair_is_a_message_and_nothing_published(tmp_path: Path, passed: bool) -> None:
    rows = [
        rollout(f"p{i}", code, passed, float(passed)) for i in range(3) for code in (WRONG, SYNTAX)
    ]
    rollouts = write_rollouts(tmp_path / "rollouts.parquet", rows)
    mined = run_pair_mining(PairMiningConfig(), rollouts, tmp_path / "pairs")
    assert mined.path is None and not (tmp_path / "pairs").exists()
    assert "no pairs" in mined.message and "skipped" in mined.message
    assert mined.counts["prompts_all_passed" if passed else "prompts_all_failed"] == 3


def test_bad_rollouts_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.parquet"):
        run_pair_mining(PairMiningConfig(), tmp_path / "missing.parquet", tmp_path / "out")
    rows = [{k: v for k, v in rollout("p", WRONG, False, 0.0).items() if k != "passed"}]
    rollouts = write_rollouts(tmp_path / "unscored.parquet", rows)
    with pytest.raises(ValueError, match=r"missing column.*passed"):
        run_pair_mining(PairMiningConfig(), rollouts, tmp_path / "out")
    rows = [{**rollout("p", WRONG, False, 0.0), "sampler_weights": f"/ckpt/{i}"} for i in range(2)]
    rollouts = write_rollouts(tmp_path / "two_policies.parquet", rows)
    with pytest.raises(ValueError, match="sampled by 2 checkpoints"):
        run_pair_mining(PairMiningConfig(), rollouts, tmp_path / "out")


def test_rollouts_of_several_policies_are_mined_as_offline_pairs_when_asked(tmp_path: Path):
    rows = [{**row, "sampler_weights": f"/ckpt/{i % 2}"} for i, row in enumerate(mixed_group("p"))]
    rollouts = write_rollouts(tmp_path / "rl.parquet", rows)
    mined = run_pair_mining(PairMiningConfig(several_policies=True), rollouts, tmp_path / "out")
    data = read_manifest(mined.path).data
    assert data["sampler_policies"] == "2" and "sampler_weights" not in data
    assert mined.counts["train_pairs"] > 0
