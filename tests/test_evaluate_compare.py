"""``codepost evaluate --compare A B`` on evaluation folders written here (no model, no
Docker) and on two made by the real evaluation stage (tiny models, the Docker sandbox): every
number from ``evaluation.json`` and ``per_problem.jsonl`` alone; the evaluation table's
intervals, and settings refused before any model loads."""

from __future__ import annotations

import json
import re
import string

import pytest
from evaluation_helpers import BASE, SFT, outcomes, write_evaluation
from nightly_helpers import PROBLEMS, write_problems
from rich.console import Console
from tiny_models import char_tokenizer, next_token_lm

from codepost.flows.cli import main
from codepost.pipeline.data.problem_sets import ProblemSet
from codepost.pipeline.evaluate_command import print_table
from codepost.pipeline.inference.sampling import EngineConfig, SamplingConfig
from codepost.pipeline.reporting.evaluations import EvaluationResults, pass_at_k_of_rows
from codepost.pipeline.stages.evaluation import EvalConfig, run_evaluate
from codepost.pipeline.stages.scoring import ScoreConfig


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


def test_compare_needs_only_each_folders_per_problem_file(pair, capsys):
    """``per_problem.jsonl``: a line per problem, sorted by task id (as text: task/10 before
    task/2), with the greedy verdict and the sampled counts; the same comparison without
    ``samples.jsonl``, and from ``samples.jsonl`` alone for folders written before."""
    a, b = pair
    lines = (b / "per_problem.jsonl").read_text().splitlines()
    assert [json.loads(line)["task_id"] for line in lines[:3]] == ["task/0", "task/1", "task/10"]
    assert json.loads(lines[2]) == {
        "task_id": "task/10",
        "greedy_passed": True,
        "greedy_sandbox_error": False,
        "n": 4,
        "passed": 2,
        "sandbox_errors": 0,
    }
    assert main(["evaluate", "--compare", str(a), str(b)]) == 0
    with_samples = capsys.readouterr().out
    for folder in (a, b):
        (folder / "samples.jsonl").rename(folder / "samples.jsonl.away")
    assert main(["evaluate", "--compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out == with_samples
    for folder in (a, b):
        (folder / "samples.jsonl.away").rename(folder / "samples.jsonl")
        (folder / "per_problem.jsonl").unlink()
    assert main(["evaluate", "--compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out == with_samples
    (a / "samples.jsonl").unlink()
    assert main(["evaluate", "--compare", str(a), str(b)]) == 2
    err = "".join(capsys.readouterr().err.split())
    assert f"{a / 'per_problem.jsonl'}:nosuchfile" in err


def test_compare_refuses_a_bad_per_problem_line_naming_the_file_line_and_key(pair, capsys):
    a, b = pair
    path = b / "per_problem.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]

    def refused(edit: dict) -> str:
        """The error, its spaces taken out (rich folds long lines)."""
        edited = [rows[0], rows[1], rows[2] | edit, *rows[3:]]
        path.write_text("".join(json.dumps(row) + "\n" for row in edited))
        assert main(["evaluate", "--compare", str(a), str(b)]) == 2
        return "".join(capsys.readouterr().err.split())

    for edit, message in (
        ({"n": 0}, "line 3: n: Input should be greater than or equal to 1"),
        ({"n": 1}, "line 3: passed (2) + sandbox_errors (0) > n (1)"),
        ({"greedy": 1}, "line 3: greedy: Extra inputs are not permitted"),
        ({"passed": None}, "line 3: n (4) and passed (None) are both counts or both null"),
        ({"task_id": "task/1"}, "line 3: task_id 'task/1' again"),
    ):
        assert "".join(f"{path} {message}".split()) in refused(edit)
    rows = [row | {"n": None, "passed": None, "sandbox_errors": None} for row in rows]
    assert "".join(f"{path}: 20 of 20 problems have no sampled result".split()) in refused({})


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


@pytest.mark.docker
def test_real_evaluations_write_per_problem_files_that_compare_alone(tmp_path, capsys):
    """Two tiny models built to answer (``next_token_lm``: the same on any CPU), evaluated by
    the real stage and scored in the sandbox: one ends every answer at once (``return``
    alone), the other writes ``return 1`` and passes all six problems, greedy and sampled."""
    problems = ProblemSet(source=str(write_problems(tmp_path / "ones.jsonl")), split="all")
    config = EvalConfig(
        problems=problems,
        prompt_style="continuation",
        sampled=True,
        sampling=SamplingConfig(num_generations=2, temperature=0.8, max_tokens=16),
        ks=[1, 2],
        engine=EngineConfig(backend="hf"),
        scoring=ScoreConfig(workers=2),
    )
    tokenizer = char_tokenizer(string.printable)
    folders = []
    for name, rules in (("silent", {}), ("answering", {" ": "1"})):
        next_token_lm(tokenizer, rules).save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        run_evaluate(config, str(tmp_path / name), tmp_path / f"eval-{name}")
        folders.append(tmp_path / f"eval-{name}")
    for folder, passed in zip(folders, (False, True), strict=True):
        rows = [
            json.loads(line) for line in (folder / "per_problem.jsonl").read_text().splitlines()
        ]
        assert rows == [
            {
                "task_id": f"ones/{i}",
                "greedy_passed": passed,
                "greedy_sandbox_error": False,
                "n": 2,
                "passed": 2 * passed,
                "sandbox_errors": 0,
            }
            for i in range(PROBLEMS)
        ]
        (folder / "samples.jsonl").unlink()
    assert main(["evaluate", "--compare", *map(str, folders)]) == 0
    out = capsys.readouterr().out
    # greedy: 6 gained, 0 lost, McNemar p = 2/2**6; sampled: +1 on 6 problems, sign-flip 2/2**6
    assert re.search(r"\+1\.0000\s*│\s*6\s*│\s*0\s*│\s*0\.0312\b", out)
    sampled = out[out.index("sampled pass@k") :]
    assert re.search(r"\+1\.0000\s*│\s*\[\+1\.0000, \+1\.0000\]\s*│\s*0\.0312\b", sampled)
