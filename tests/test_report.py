"""The post-training report: greedy pass@1 per stage with Wilson intervals and McNemar tests
against the previous stage and the base, from evaluation folders written here (no model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from evaluation_helpers import BASE, SFT, outcomes, write_evaluation

from codepost.pipeline.reporting.evaluations import EvaluationResults
from codepost.pipeline.reporting.report import stage_rows, write_report
from codepost.pipeline.reporting.stats import wilson_interval


@pytest.fixture
def run(tmp_path):
    """A run folder with two benchmarks evaluated after three stages."""
    humaneval, mbpp = {}, {}
    for stage, passed in (("base", BASE), ("sft", SFT), ("rl", SFT)):
        humaneval[stage] = write_evaluation(
            tmp_path / stage / "eval" / "humaneval", f"ckpt/{stage}", outcomes(passed, 20)
        )
    for stage, passed in (("base", {0}), ("sft", {0, 1}), ("rl", {0, 1, 2, 3, 4, 5})):
        mbpp[stage] = write_evaluation(
            tmp_path / stage / "eval" / "mbpp-test",
            f"ckpt/{stage}",
            outcomes(passed, 10),
            sandbox_errors=frozenset({"task/9"}) if stage == "rl" else frozenset(),
        )
    return tmp_path, {"humaneval": humaneval, "mbpp-test": mbpp}


def interval(passed: int, n: int) -> str:
    low, high = wilson_interval(passed, n)
    return f"[{low:.4f}, {high:.4f}]"


def test_rows_hold_the_intervals_and_paired_tests(run):
    _, evaluations = run
    rows = stage_rows(evaluations)
    assert [(r["benchmark"], r["stage"]) for r in rows] == [
        (benchmark, stage) for benchmark in evaluations for stage in ("base", "sft", "rl")
    ]
    base, sft, rl = rows[:3]
    assert base["greedy pass@1"] == 0.2 and (base["passed"], base["problems"]) == (4, 20)
    assert (base["ci95 low"], base["ci95 high"]) == pytest.approx(wilson_interval(4, 20))
    assert all(
        base[f"{field} vs {other}"] is None
        for field in ("difference", "gained", "lost", "p")
        for other in ("previous", "base")
    )
    assert (sft["gained vs previous"], sft["lost vs previous"]) == (7, 1)
    assert sft["p vs previous"] == pytest.approx(0.0703125)
    assert sft["difference vs previous"] == pytest.approx(0.3)
    assert (rl["gained vs previous"], rl["lost vs previous"], rl["p vs previous"]) == (0, 0, 1.0)
    assert rl["p vs base"] == pytest.approx(0.0703125)  # against the first stage, not the last
    assert rows[5]["sandbox errors"] == 1
    assert json.loads(json.dumps(rows)) == rows  # plain values, for a table artifact


def test_report_tables_plot_and_results(run):
    run_dir, evaluations = run
    (run_dir / "rl").mkdir(exist_ok=True)
    (run_dir / "rl" / "reward_curve.png").write_bytes(b"\x89PNG")
    path = write_report(run_dir, evaluations)
    assert path == run_dir / "report.md"
    report = path.read_text()
    lines = report.splitlines()
    assert lines[0] == "# Post-training run"
    assert "Wilson" in report and "McNemar" in report and "p < 0.05" in report
    assert "## humaneval" in lines and "## mbpp-test" in lines
    assert f"| base | 0.2000 | {interval(4, 20)} | 4/20 |  |  | `ckpt/base` |" in lines
    assert (
        f"| sft | 0.5000 | {interval(10, 20)} | 10/20 | +0.3000, +7/-1, p=0.0703 "
        f"| +0.3000, p=0.0703 | `ckpt/sft` |" in lines
    )
    assert (
        f"| rl | 0.5000 | {interval(10, 20)} | 10/20 | +0.0000, +0/-0, p=1.0000 "
        f"| +0.3000, p=0.0703 | `ckpt/rl` |" in lines
    )
    # mbpp rl: +4/-0 against sft (p = 2/16), +5/-0 against base (p = 2/32)
    assert (
        f"| rl | 0.6000 | {interval(6, 10)} | 6/10 | +0.4000, +4/-0, p=0.1250 "
        f"| +0.5000, p=0.0625 | `ckpt/rl` |" in lines
    )
    assert "Sandbox errors, counted as failures: rl 1." in lines
    assert report.index("## humaneval") < report.index("## mbpp-test")
    assert "![pass@1 per stage](pass_at_1.png)" in lines
    assert "![RL reward curve](rl/reward_curve.png)" in lines
    assert (run_dir / "pass_at_1.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    saved = json.loads((run_dir / "evaluations.json").read_text())
    assert saved["rows"] == stage_rows(evaluations)
    sft_results = saved["evaluations"]["humaneval"]["sft"]
    assert sft_results["folder"] == str(evaluations["humaneval"]["sft"])
    assert sft_results["results"]["greedy"]["pass@1"] == 0.5


def test_a_benchmark_evaluated_with_samples_gets_sampled_pass_at_1_and_paired_bootstraps(
    tmp_path,
):
    base = {f"task/{i}": (4, i % 3) for i in range(6)}  # pass@1 (0 + 1/4 + 2/4) x 2 / 6 = 0.25
    trained = {f"task/{i}": (4, min(4, i % 3 + 2)) for i in range(6)}  # +0.5 on every problem
    evaluations = {
        "trained": {
            "base": write_evaluation(tmp_path / "a", "ckpt/a", None, base),
            "sft": write_evaluation(tmp_path / "b", "ckpt/b", None, base),
            "rl": write_evaluation(tmp_path / "c", "ckpt/c", None, trained),
        }
    }
    report = write_report(tmp_path, evaluations).read_text()
    assert "reward curve" not in report
    assert "no greedy run" not in report  # no greedy table for a benchmark without greedy runs
    assert "(4 samples per problem at temperature 0.8)" in report
    lines = report.splitlines()
    assert "| base | 0.2500 |" in lines[lines.index("## trained") + 6]
    assert "| sft | 0.2500 |" in report and "+0.0000 [+0.0000, +0.0000], p=1.0000" in report
    # Every problem gains: every resample's mean difference is +0.5, and of the 2**6 sign
    # patterns only the observed one and its mirror reach |+0.5|: p = 2/64, not 0.
    assert "| rl | 0.7500 | [0.5833, 0.9167] | 6 | +0.5000 [+0.5000, +0.5000], p=0.0312 " in report
    rows = json.loads((tmp_path / "evaluations.json").read_text())["sampled_rows"]
    assert [(r["stage"], r["sampled pass@1"], r["problems"]) for r in rows] == [
        ("base", 0.25, 6), ("sft", 0.25, 6), ("rl", 0.75, 6)
    ]  # fmt: skip
    assert rows[2]["p vs previous"] == 2 / 2**6 and rows[0]["p vs base"] is None


def test_an_arm_is_compared_with_the_checkpoint_it_trained_from(tmp_path):
    """GRPO and RFT both train from SFT: RFT's "previous" is SFT, not the GRPO arm listed
    before it, greedy and sampled alike; without ``started_from``, the stage before it."""
    outcomes_of = {"base": BASE, "sft": SFT, "grpo": {0}, "rft": SFT}
    counts_of = {"base": 0, "sft": 2, "grpo": 0, "rft": 2}
    evaluations = {
        "humaneval": {
            stage: write_evaluation(tmp_path / stage / "g", f"ckpt/{stage}", outcomes(ok, 20))
            for stage, ok in outcomes_of.items()
        },
        "trained": {
            stage: write_evaluation(
                tmp_path / stage / "s", f"ckpt/{stage}", None, {"t/0": (4, n), "t/1": (4, n)}
            )
            for stage, n in counts_of.items()
        },
    }
    started_from = {"sft": "base", "grpo": "sft", "rft": "sft"}
    rows = stage_rows(evaluations, started_from)
    greedy = {r["stage"]: r for r in rows if r["benchmark"] == "humaneval"}
    assert greedy["rft"]["difference vs previous"] == 0.0  # rft against sft
    assert greedy["grpo"]["difference vs previous"] == pytest.approx(-0.45)
    assert greedy["rft"]["difference vs base"] == pytest.approx(0.3)
    write_report(tmp_path, evaluations, started_from)
    sampled = json.loads((tmp_path / "evaluations.json").read_text())["sampled_rows"]
    assert [r["difference vs previous"] for r in sampled] == [None, 0.5, -0.5, 0.0]
    in_order = {r["stage"]: r for r in stage_rows(evaluations) if r["benchmark"] == "humaneval"}
    assert in_order["rft"]["difference vs previous"] == pytest.approx(0.45)  # against grpo


def test_evaluation_files_of_earlier_runs_read_into_the_model_and_write_back_the_same(tmp_path):
    recorded = Path(__file__).parents[1] / "docs" / "learning-mbpp" / "evaluations.json"
    evaluations = json.loads(recorded.read_text())["evaluations"]
    for stages in evaluations.values():
        for stage in stages.values():
            results = EvaluationResults.model_validate(stage["results"])
            assert json.dumps(results.to_json()) == json.dumps(stage["results"])
    no_score = {"pass@8": math.nan, "pass@8_ci95": None, "samples": 4, "passed": 0}
    results = EvaluationResults(
        checkpoint="c", num_problems=4, sampled={**no_score, "temperature": 0.8}
    )
    path = results.write(tmp_path / "evaluation.json")
    assert '"pass@8": NaN' in path.read_text() and "greedy" not in path.read_text()
    again = EvaluationResults.read(path)
    assert math.isnan(again.sampled.pass_at_k[8]) and again.greedy is None
