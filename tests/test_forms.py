"""Test forms and record schemas at their boundaries: the registry, the call judge's
comparisons, io checkers, test caps, limits, prompts, LiveCodeBench's packed tests, and the
pytest judge run with this machine's pytest (the Docker tests run the image's)."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pytest
from fake_executors import InProcessExecutor

from codepost.sandbox import Limits
from codepost.sandbox.runner.pytest_judge import run_test_file
from codepost.verifiers import Problem, ProblemFormatError, Verifier, load_problems
from codepost.verifiers.chat import user_message
from codepost.verifiers.forms import form_of, forms
from codepost.verifiers.forms.call import prelude
from codepost.verifiers.forms.io import TokenOutput, outputs_match
from codepost.verifiers.problems import NAMED_PROBLEMS, cap_tests, problem_from_record
from codepost.verifiers.schemas import livecodebench

SAMPLE_SETS = [name for name in NAMED_PROBLEMS if name.endswith("-sample")]


def verdict(problem: Problem, completion: str):
    (result,) = Verifier(InProcessExecutor()).verify(
        {problem.task_id: problem}, [{"task_id": problem.task_id, "completion": completion}]
    )
    return result


def call_problem(outputs, inputs=None, compare="apps", fn="f") -> Problem:
    inputs = inputs or [[1]] * len(outputs)
    return Problem(
        task_id="c",
        prompt="p",
        tests={
            "form": "call",
            "fn_name": fn,
            "compare": compare,
            "call": [{"args": a, "expected": o} for a, o in zip(inputs, outputs, strict=True)],
        },
    )


def test_the_registered_forms_and_one_form_per_record():
    assert set(forms()) == {"check", "asserts", "io", "call", "pytest"}
    other_forms_field = {"task_id": 1, "prompt": "p", "test_list": ["assert 1"], "module": "m"}
    assert problem_from_record(other_forms_field).test_form == "asserts"  # a column, ignored
    with pytest.raises(ProblemFormatError, match=r"exactly one form: .*; it has test_list and io"):
        problem_from_record({"task_id": 1, "prompt": "p", "test_list": ["assert 1"], "io": []})


@pytest.mark.parametrize(
    ("returned", "expected", "compare", "passes"),
    [
        ("(1, 2)", [1, 2], "value", True),  # a tuple is a list (both harnesses)
        ("[3]", 3, "value", False),  # LiveCodeBench: == only
        ("3", [3], "value", False),
        ("3", [3], "apps", True),  # APPS: outputs stored as [value]
        ("[(1, 2), (3, 4)]", [[[1, 2], [3, 4]]], "apps", True),  # list of tuples
        ("{1: 'a'}", {"1": "a"}, "apps", True),  # JSON's string keys read as ints
        ("{1: 'a'}", {"1": "a"}, "value", False),
        ("True", [1], "apps", True),  # Python's ==, as APPS
    ],
)
def test_call_comparisons_follow_the_reference_harnesses(returned, expected, compare, passes):
    problem = call_problem([expected], compare=compare)
    result = verdict(problem, f"def f(x):\n    return {returned}\n")
    assert result.passed is passes, result.result


def test_call_uses_a_fresh_solution_per_test_and_the_prelude():
    problem = call_problem([1, 1], inputs=[[[]], [[]]], compare="value", fn="count")
    program = (
        "class Solution:\n    calls = 0\n\n    def count(self, xs: List[int]) -> int:\n"
        "        self.calls += 1\n        return self.calls\n"
    )
    assert verdict(problem, program).passed  # typing's List from the prelude; a new instance


def test_the_call_prelude_imports_what_the_program_uses_as_livecodebench_binds_it():
    assert "import" not in prelude("def f(x):\n    return x\n").split("import sys")[0]
    lines = prelude("def f(xs: List[int]):\n    return Counter(xs), collections, sqrt, pow\n")
    assert lines.startswith(
        "from typing import Counter\nfrom typing import List\nimport collections\n"
        "from math import sqrt\n"  # pow stays the builtin, as `from builtins import *` left it
    )


def test_a_future_import_stays_first_in_a_call_program():
    problem = call_problem([2])
    program = "from __future__ import annotations\n\ndef f(x: Missing) -> int:\n    return 2\n"
    assert verdict(problem, program).passed


@pytest.mark.parametrize(
    ("actual", "expected", "checker", "match"),
    [
        ("2.50\n", "2.5\n", TokenOutput(by_line=True), True),  # LiveCodeBench's Decimal rule
        ("2.3333333333333335\n", "2.3333333333\n", TokenOutput(by_line=True), False),
        ("1 2\n3\n", "1\n2 3\n", TokenOutput(by_line=True), False),
        ("1 2\n3\n", "1\n2 3\n", TokenOutput(), True),  # testlib's wcmp: tokens only
        ("0.3333333333333333", "0.333333333", TokenOutput(abs_tol=1e-6), True),
        ("1000001", "1000000", TokenOutput(rel_tol=1e-6), True),
        ("1000002", "1000000", TokenOutput(rel_tol=1e-6), False),
        ("nan", "nan", TokenOutput(abs_tol=1.0), True),  # equal as text
        ("nan", "1", TokenOutput(abs_tol=1e9), False),
        ("1e999999999", "1", TokenOutput(rel_tol=0.5), False),  # no huge expansion
        ("yes", "YES", TokenOutput(), False),
        ("3\n\n", "3", None, True),  # exact: as before
    ],
)
def test_io_checkers(actual, expected, checker, match):
    assert outputs_match(actual, expected, checker) is match


def test_a_checker_program_must_compile():
    with pytest.raises(ValueError, match="checker is not valid Python"):
        Problem(
            task_id="x",
            prompt="p",
            io=[{"input": "", "output": ""}],
            checker={"kind": "program", "source": "def ("},
        )


def test_max_tests_keeps_the_longest_inputs_in_order():
    io = [{"input": "x" * n, "output": ""} for n in (3, 9, 1, 9, 5)]
    problem = Problem(task_id="io", prompt="p", io=io)
    (capped,) = cap_tests({"io": problem}, 3).values()
    assert [len(case.input) for case in capped.io] == [9, 9, 5]
    assert cap_tests({"io": problem}, None)["io"] is problem
    humaneval = load_problems()["HumanEval/0"]
    assert cap_tests({"h": humaneval}, 1)["h"].tests == humaneval.tests  # a module runs whole


def test_a_problems_own_limits_within_a_servers_caps():
    from codepost.verifiers.server.config import ServerConfig
    from codepost.verifiers.server.verify import within_caps

    problem = Problem(
        task_id="x",
        prompt="p",
        io=[{"input": "", "output": ""}],
        time_limit_s=1e6,
        memory_limit_mb=1 << 20,
    )
    (capped,) = within_caps({"x": problem}, ServerConfig()).values()
    assert (capped.time_limit_s, capped.memory_limit_mb) == (60.0, 1024)


def test_a_problems_own_limits():
    limits = Limits(wall_time_s=10, cpu_time_s=10, memory_mb=512)
    (io, call) = (
        problem_from_record(
            {
                "question": "q",
                "time_limit": "2 seconds",
                "memory_limit": "64 megabytes",
                "input_output": {"inputs": ["1", "2"], "outputs": ["1", "2"], **extra},
            }
        )
        for extra in ({}, {"fn_name": "f"})
    )
    per_case = form_of(io).limits(io, limits)
    assert (per_case.wall_time_s, per_case.cpu_time_s, per_case.memory_mb) == (2, 2, 64)
    assert form_of(call).limits(call, limits).wall_time_s == 4  # one job, two tests


@pytest.mark.parametrize("name", SAMPLE_SETS)
def test_each_sample_set_is_read_by_its_schema_with_its_ids(name):
    problems = load_problems(name)
    samples = [json.loads(line) for line in _samples_file(name).read_text().splitlines()]
    assert {str(sample["task_id"]) for sample in samples} == set(problems)
    for problem in problems.values():
        assert problem.tests.count() >= 2 and problem.prompt


def _samples_file(name: str):
    from codepost.verifiers.problems import packaged_path

    path = packaged_path(name)
    return path.with_name(path.name.replace(".jsonl", ".samples.jsonl"))


def test_schemas_keep_the_records_own_ids_and_limits():
    taco = load_problems("taco-sample")
    assert list(taco) == ["0", "count-vowels", "2", "4321"]  # TACO: the row; APPS: problem_id
    assert (taco["0"].time_limit_s, taco["0"].memory_limit_mb) == (1.0, 256)
    assert taco["4321"].entry_point == "Solution" and taco["4321"].test_form == "call"
    contests = load_problems("codecontests-sample")["1000_B. Circle"]
    assert (contests.time_limit_s, contests.memory_limit_mb, contests.test_form) == (2.0, 64, "io")
    lcb = load_problems("livecodebench-sample")
    assert lcb["3999"].tests.count() == 3  # one public, two packed private tests
    assert lcb["abc999_a"].tests.checker.by_line


def test_columns_rename_a_data_sets_own_names(tmp_path):
    path = tmp_path / "mine.jsonl"
    row = {"id": "q1", "statement": "add", "tests": {"inputs": ["1 2\n"], "outputs": ["3\n"]}}
    path.write_text(json.dumps(row) + "\n")
    columns = {"id": "problem_id", "statement": "question", "tests": "input_output"}
    (problem,) = load_problems(path, columns=columns).values()
    assert (problem.task_id, problem.test_form) == ("q1", "io")


def _packed(value) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(value))).decode()


class Boom:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


def test_livecodebench_private_tests_admit_plain_strings_only(capsys):
    tests = [{"input": "1", "output": "1", "testtype": "stdin"}]
    assert livecodebench.private_tests(_packed(json.dumps(tests))) == tests
    with pytest.raises(ProblemFormatError, match=r"builtins\.print: not plain data"):
        livecodebench.private_tests(_packed(Boom()))
    assert "unpickled code ran" not in capsys.readouterr().out
    with pytest.raises(ProblemFormatError, match="hold a list, not a JSON string"):
        livecodebench.private_tests(_packed(tests))


def test_prompts_ask_for_what_each_form_tests():
    taco = load_problems("taco-sample")
    assert "class Solution:\n    def maxProfit" in user_message(taco["4321"])
    kod = load_problems("kodcode-sample")["Algorithm_1001_I"]
    assert "imported as the module `solution`" in user_message(kod)
    assert "`run_length_encode`" in user_message(kod)


def _remote(namespace):
    def remote(name):
        if name not in namespace:
            raise NameError(name)
        return namespace[name]

    return remote


def test_the_pytest_judge_with_this_machines_pytest():
    """One outcome per test function; ``import *`` never replaces the test's own names or
    builtins; a test file that does not load fails every test with its error."""
    program: dict = {}
    exec("def evens(xs):\n    return []\n\ndef sorted(xs):\n    return [2]\n", program)
    source = (
        "import pytest\nfrom solution import *\n\n"
        "@pytest.mark.parametrize('xs', [[2], [1, 2]])\n"
        "def test_evens(xs):\n    assert sorted(evens(xs)) == [2]\n\n"
        "class TestMore:\n    def test_empty(self):\n        assert evens([]) == []\n"
    )
    check = run_test_file(
        source,
        filename="test_solution.py",
        module="solution",
        bound=["pytest", "test_evens", "TestMore"],
        entry_points=["evens"],
        remote=_remote(program),
        remote_names=lambda: [n for n in program if not n.startswith("_")],
    )
    check("TestMore::test_empty")
    with pytest.raises(AssertionError, match=r"assert \[\] == \[2\]"):
        check("test_evens")
    broken = run_test_file(
        "from solution import missing\n\ndef test_x():\n    pass\n",
        filename="test_solution.py",
        module="solution",
        bound=[],
        entry_points=[],
        remote=_remote(program),
        remote_names=lambda: [],
    )
    with pytest.raises(ImportError, match="missing"):
        broken("test_x")
