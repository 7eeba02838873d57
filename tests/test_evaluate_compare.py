"""``codepost evaluate --compare A B`` on evaluation folders written here (no model, no
Docker), the evaluation table's intervals, and settings refused before any model loads."""

from __future__ import annotations

import re

import pytest
from evaluation_helpers import BASE, SFT, outcomes, write_evaluation
from rich.console import Console

from codepost.flows.cli import main
from codepost.pipeline.cli import print_table
from codepost.pipeline.reporting.evaluations import EvaluationResults, pass_at_k_of_rows


@pytest.fixture
def pair(tmp_path):
    """Two evaluations of 20 problems: greedy +7/-1 (McNemar p = 0.0703), and sampled
    (4 samples each) with one more correct sample on every problem."""
    before = {f"task/{i}": (4, i % 3) for i in range(20)}
    after = {task: (n, c + 1) for task, (n, c) in before.items()}
    a = write_evaluation(tmp_path / "a", "ckpt/base", outcomes(BASE, 20), before)
    b = write_evaluation(tmp_path / "b", "ckpt/sft", outcomes(SFT, 20), after)
    return a, b


def test_compare_prints_intervals_counts_and_p_values(pair, capsys):
    a, b = pair
    assert main(["evaluate", "--compare", str(a), str(b / "evaluation.json")]) == 0
    out = capsys.readouterr().out
    assert "ckpt/base" in out and "ckpt/sft" in out and "20 problems" in out
    # greedy: 0.2 and 0.5 with their Wilson intervals, +0.3, gained 7, lost 1, p
    assert re.search(r"0\.2000 \(4/20\)\s*│\s*\[0\.0807, 0\.4160\]", out)
    assert re.search(r"\+0\.3000\s*│\s*7\s*│\s*1\s*│\s*0\.0703\b", out)
    # sampled: pass@1 and pass@4, a bootstrap interval of the difference, p < 0.05
    sampled = out[out.index("sampled pass@k") :]
    rows = {int(m[1]): m[0] for m in re.finditer(r"│\s*(\d)\s*│.*", sampled)}
    assert set(rows) == {1, 4}
    # one more correct sample of 4 on every problem: +0.25 whatever the resample
    assert re.search(r"\+0\.2500\s*│\s*\[\+0\.2500, \+0\.2500\]\s*│\s*<0\.0001", rows[1])


def test_compare_refuses_different_problems_naming_both_folders(tmp_path, pair, capsys):
    a, _ = pair
    other = write_evaluation(tmp_path / "other", "ckpt/x", outcomes(BASE, 21))
    assert main(["evaluate", "--compare", str(a), str(other)]) == 2
    err = "".join(capsys.readouterr().err.split())  # rich folds long lines
    assert "differentproblems" in err and "task/20" in err
    assert f"0onlyin{a}" in err and f"1onlyin{other}" in err
    changed = write_evaluation(
        tmp_path / "changed", "ckpt/y", outcomes(BASE, 20), fingerprint="0" * 16
    )
    assert main(["evaluate", "--compare", str(a), str(changed)]) == 2
    err = "".join(capsys.readouterr().err.split())
    assert f"problems_fingerprint{'f' * 16}vs{'0' * 16}" in err and str(changed) in err


def test_compare_names_a_missing_folder(tmp_path, pair, capsys):
    a, _ = pair
    assert main(["evaluate", "--compare", str(a), str(tmp_path / "nowhere")]) == 2
    err = "".join(capsys.readouterr().err.split())
    assert str(tmp_path / "nowhere" / "evaluation.json") in err


def test_the_evaluation_table_shows_each_interval():
    rows = [{"prompt_id": f"t{i}", "passed": i < 3, "status": "passed"} for i in range(32)]
    results = {
        "checkpoint": "ckpt",
        "num_problems": 32,
        "greedy": {
            **pass_at_k_of_rows(rows, [1]),
            "samples": 32,
            "passed": 3,
            "sandbox_errors": 0,
            "temperature": 0.0,
        },
    }
    console = Console(width=200, record=True)
    print_table(EvaluationResults.model_validate(results), console)
    text = console.export_text()
    assert re.search(r"pass@1\s*│\s*0\.0938\s*│\s*\[0\.0324, 0\.2422\]", text)
    assert "_ci95" not in text


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("sampling: {max_tokens: [8\n", "line 2"),
        ("engine: {cpu_kv_cache_gib: 0.5}\n", "engine.cpu_kv_cache_gib"),
        ("sampling: {max_tokens: 2048}\n", "max_tokens=2048"),
        ("max_tokens: 256\n", "max_tokens is renamed: use sampling.max_tokens"),
    ],
)
def test_evaluate_refuses_settings_it_cannot_use_naming_them(tmp_path, capsys, text, named):
    config = tmp_path / "eval.yaml"
    config.write_text(text)
    argv = ["evaluate", "--config", str(config), "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert named in err, err
    assert not (tmp_path / "out").exists()
