"""Problem loading: HumanEval, MBPP (full and sanitized), stdin/stdout sets, hub ids, bad input."""

from __future__ import annotations

import gzip
import json
import re
import sys
import types

import pytest

from codepost.verifiers import Problem, ProblemFormatError, load_problems
from codepost.verifiers.problems import problem_from_record

MBPP = "mbpp"  # the copy shipped in codepost/verifiers/data
SANITIZED_MBPP = "mbpp-sanitized"
HUMANEVAL_ROW = {
    "task_id": "X/0",
    "prompt": "def f(x):\n",
    "canonical_solution": "    return x\n",
    "test": "def check(candidate):\n    assert candidate(1) == 1\n",
    "entry_point": "f",
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_humaneval_loads_as_it_comes():
    problems = load_problems()
    assert len(problems) == 164
    problem = problems["HumanEval/32"]
    assert problem.test_form == "check"
    assert problem.prompt_is_code
    assert problem.entry_point == "find_zero"
    assert "def poly(" in problem.prompt
    assert problem.canonical_solution.startswith("    begin, end = -1., 1.")
    assert list(problems)[:2] == ["HumanEval/0", "HumanEval/1"]


def test_mbpp_loads_as_it_comes():
    problems = load_problems(MBPP)
    assert len(problems) == 974
    pair = problems["601"]
    assert pair.test_form == "asserts"
    assert not pair.prompt_is_code
    assert pair.prompt.startswith("Write a function to find the longest chain")
    assert pair.entry_point == "max_chain_length"
    assert pair.canonical_solution.startswith("class Pair(object):")
    assert len(pair.test_list) == 3
    assert problems["367"].test_setup_code.startswith("root = Node(1)")
    assert problems["126"].entry_point is None  # its tests call only `sum`: never inferred


def test_sanitized_mbpp_loads_from_a_json_array():
    problems = load_problems(SANITIZED_MBPP)
    assert len(problems) == 427
    problem = problems["2"]
    assert (
        problem.prompt == "Write a function to find the shared elements from the given two lists."
    )
    assert problem.entry_point == "similar_elements"  # not `set`, the builtin around it
    assert sum(bool(p.test_imports) for p in problems.values()) == 13


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "set.jsonl.gz"
    with gzip.open(path, "wt") as stream:
        stream.write(json.dumps(HUMANEVAL_ROW) + "\n\n")
    assert list(load_problems(path)) == ["X/0"]


def test_stdin_stdout_forms():
    io = problem_from_record(
        {"task_id": 1, "prompt": "echo", "io": [{"input": "a\n", "output": "a\n"}]}
    )
    assert io.test_form == "io" and io.task_id == "1"
    apps = problem_from_record(
        {
            "problem_id": 7,
            "question": "add",
            "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}),
            "solutions": json.dumps(["print(sum(map(int, input().split())))"]),
        }
    )
    assert [(c.input, c.output) for c in apps.io] == [("1 2\n", "3\n"), ("3 4\n", "7\n")]
    assert apps.canonical_solution == "print(sum(map(int, input().split())))"
    contests = problem_from_record(
        {
            "name": "A. Sum",
            "description": "add",
            "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
            "private_tests": {"input": ["2 2\n"], "output": ["4\n"]},
            "generated_tests": {"input": [], "output": []},
        }
    )
    assert [c.input for c in contests.io] == ["1 2\n", "2 2\n"]


def test_a_dumped_problem_reloads_unchanged():
    for problem in (
        load_problems()["HumanEval/38"],
        load_problems(MBPP)["367"],
        Problem(task_id="io", prompt="p", io=[{"input": "", "output": "x"}]),
    ):
        assert problem_from_record(problem.model_dump()) == problem


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompt": "p", "test_list": ["assert 1"]}, "field 'task_id' missing"),
        ({"task_id": 1, "test_list": ["assert 1"]}, "field 'prompt' missing (also looked for text"),
        ({"task_id": 1, "prompt": "p"}, "no tests"),
        ({**HUMANEVAL_ROW, "entry_point": None}, "needs an entry_point"),
        ({**HUMANEVAL_ROW, "test": "assert True\n"}, "does not define check(candidate)"),
        ({**HUMANEVAL_ROW, "test": "def check(candidate):\n    '''doc'''\n"}, "no statements"),
        ({**HUMANEVAL_ROW, "test": "def check(x):\n    assert x\n"}, "exactly one argument"),
        ({**HUMANEVAL_ROW, "test": "def check(candidate:\n"}, "test is not valid Python"),
        ({"task_id": 1, "text": "p", "test_list": "assert 1"}, "field 'test_list'"),
        ({"task_id": 1, "text": "p", "test_list": []}, "test_list is empty"),
        ({"task_id": 1, "text": "p", "test_list": ["assert f(1) =="]}, "test 0 is not valid"),
        ({"task_id": 1, "text": "p", "test_list": ["assert 1", " "]}, "test 1 is blank"),
        ({**HUMANEVAL_ROW, "entry_point": "f(x)"}, "field 'entry_point': not a Python name"),
        ({**HUMANEVAL_ROW, "entry_point": "class"}, "not a Python name: 'class'"),
        ({"task_id": 1, "prompt": "p", "io": [{"input": "1"}]}, "field 'io.0.output'"),
        ({"task_id": 1, "prompt": "p", "io": []}, "io has no cases"),
        ({"task_id": 1, "prompt": "p", "input_output": "{"}, "'input_output': not valid JSON"),
        (
            {"task_id": 1, "prompt": "p", "input_output": {"inputs": ["1"], "outputs": []}},
            "1 inputs but 0 outputs",
        ),
        (
            {
                "task_id": 1,
                "prompt": "p",
                "input_output": {"inputs": [], "outputs": [], "fn_name": "f"},
            },
            "call has no cases",  # call-based: the function called with each case's arguments
        ),
        ({**HUMANEVAL_ROW, "test_list": ["assert f(1)"]}, "exactly one form"),
        ({**HUMANEVAL_ROW, "colour": "red"}, None),  # unknown fields of a source are ignored
        ([1, 2], "must be a JSON object, got list"),
    ],
)
def test_malformed_records(record, message):
    if message is None:
        assert problem_from_record(record).task_id == "X/0"
        return
    with pytest.raises(ProblemFormatError, match=re.escape(message)):
        problem_from_record(record)


def test_errors_name_the_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [HUMANEVAL_ROW, {**HUMANEVAL_ROW, "task_id": "X/1"}])
    path.write_text(path.read_text() + '{"task_id": "X/2", "prompt": \n')
    with pytest.raises(ProblemFormatError, match=rf"^{path}:3: not valid JSON"):
        load_problems(path)
    bad = {**HUMANEVAL_ROW, "task_id": "X/1", "entry_point": ["f"]}
    write_jsonl(path, [HUMANEVAL_ROW, bad])
    with pytest.raises(ProblemFormatError, match=rf"^{path}:2: field 'entry_point'"):
        load_problems(path)
    write_jsonl(path, [HUMANEVAL_ROW, HUMANEVAL_ROW])
    with pytest.raises(ProblemFormatError, match=rf"^{path}:2: duplicate task_id 'X/0'"):
        load_problems(path)
    path.write_text("\n\n")
    with pytest.raises(ProblemFormatError, match="no problems"):
        load_problems(path)


def test_json_array_errors_name_the_record(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([HUMANEVAL_ROW, {"task_id": 5, "prompt": "p"}]))
    with pytest.raises(ProblemFormatError, match=rf"^{path}: record 1: no tests"):
        load_problems(path)
    path.write_text(json.dumps({"task_id": 1}))
    with pytest.raises(ProblemFormatError, match="expected a JSON array"):
        load_problems(path)
    path.write_text("[{")
    with pytest.raises(ProblemFormatError, match=rf"^{path}:1: not valid JSON"):
        load_problems(path)


def test_missing_file_is_not_taken_for_a_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError, match="no problem file"):
        load_problems(tmp_path / "missing.jsonl")


def test_hub_ids_go_to_datasets_load_dataset(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return [HUMANEVAL_ROW, {**HUMANEVAL_ROW, "task_id": "X/1"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    problems = load_problems("openai/openai_humaneval")
    assert list(problems) == ["X/0", "X/1"]
    load_problems("google-research-datasets/mbpp:sanitized", split="train")
    assert calls == [
        ("openai/openai_humaneval", None, "test"),
        ("google-research-datasets/mbpp", "sanitized", "train"),
    ]


@pytest.mark.parametrize(
    ("source", "close"), [("mbpp-sample", "'mbpp-sanitized'"), ("human-eval", "'humaneval'")]
)
def test_a_misspelt_set_is_refused_naming_the_close_names_without_asking_the_hub(
    monkeypatch, source, close
):
    """``mbpp-sample`` went to the hub, which failed after a minute of retries."""
    asked = []
    hub = types.SimpleNamespace(load_dataset=lambda *args, **kwargs: asked.append(args))
    monkeypatch.setitem(sys.modules, "datasets", hub)
    with pytest.raises(ValueError, match=f"no problem set '{source}'.*did you mean .*{close}"):
        load_problems(source)
    assert asked == []


def test_hub_rows_errors_name_the_row(monkeypatch):
    rows = [HUMANEVAL_ROW, {"task_id": "X/1"}]
    fake = types.SimpleNamespace(load_dataset=lambda name, config, split: rows)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ProblemFormatError, match=r"^some/set \(test\) row 1: field 'prompt'"):
        load_problems("some/set")
