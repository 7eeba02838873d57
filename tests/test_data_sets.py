"""Each shipped sample set, in the record shape of a public data set, through ``codepost verify``
in the real sandbox: its references pass (C++ ones too), its mutants fail as their ``expect``
says (wrong answers, programs that do not compile, programs over the problem's own time or
memory limit)."""

from __future__ import annotations

import json

import pytest

from codepost.verifiers import load_problems, verify_command
from codepost.verifiers.problems import NAMED_PROBLEMS, packaged_path

pytestmark = pytest.mark.docker

SAMPLE_SETS = [name for name in NAMED_PROBLEMS if name.endswith("-sample")]


def verify(*args: str) -> int:
    return verify_command.main(["verify", *args, "--workers", "2"])


@pytest.mark.parametrize("name", SAMPLE_SETS)
def test_references_pass_and_mutants_fail(name, tmp_path):
    problems_file = packaged_path(name)
    samples = problems_file.with_name(problems_file.name.replace(".jsonl", ".samples.jsonl"))
    output = tmp_path / "results.jsonl"
    assert verify(str(samples), "--problems", name, "--output", str(output)) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    wrong = [
        (row["task_id"], row["expect"], row["status"], row["result"][:200])
        for row in rows
        if row["status"] != row["expect"]
        and not (row["expect"] == "failed" and row["status"] in ("failed", "runtime_error"))
    ]
    assert not wrong, wrong
    assert {row["expect"] for row in rows} >= {"passed", "failed"}
    problems = load_problems(name).values()
    references = [[]] if any(p.canonical_solution for p in problems) else []  # LiveCodeBench: none
    references += [["--language", "cpp"]] if any("cpp" in p.references for p in problems) else []
    for options in references:  # the problems' own references, then their C++ ones
        output = tmp_path / "reference.jsonl"
        assert verify("--reference", "--problems", name, "--output", str(output), *options) == 0
        rows = [json.loads(line) for line in output.read_text().splitlines()]
        assert all(row["passed"] for row in rows), [r["result"] for r in rows if not r["passed"]]
