"""Public and hidden tests: each form's public subset (``FormTests.public``), the splits the
record schemas keep, and the problem's public view run as any problem is (in this process:
tests/fake_executors.py). The sandbox runs it in tests/test_environments.py."""

from __future__ import annotations

import ast
import json

import pytest
from fake_executors import InProcessExecutor

from codepost.verifiers import Problem, Verifier, load_problems
from codepost.verifiers.forms import form_of
from codepost.verifiers.forms.check import checks_of
from codepost.verifiers.forms.pytest_file import names_of
from codepost.verifiers.problems import NAMED_PROBLEMS, cap_tests, problem_from_record

HUMANEVAL = load_problems()


def passes(problem: Problem, completion: str) -> bool:
    (verdict,) = Verifier(InProcessExecutor()).verify(
        {problem.task_id: problem}, [{"task_id": problem.task_id, "completion": completion}]
    )
    return verdict.passed


def codecontests(public: list[str] | None, private: list[str]) -> dict:
    record = {
        "name": "cc",
        "description": "Print the input doubled.",
        "private_tests": {"input": private, "output": [str(2 * int(x)) for x in private]},
        "generated_tests": {"input": ["100"], "output": ["200"]},
    }
    if public is not None:
        record["public_tests"] = {"input": public, "output": [str(2 * int(x)) for x in public]}
    return record


def test_codecontests_public_tests_are_shown_and_every_test_scores():
    problem = problem_from_record(codecontests(["1", "2"], ["3"]))
    assert [case.input for case in problem.io] == ["1", "2", "3", "100"]  # all of them score
    public = problem.public_view()
    assert public is not None
    assert [case.input for case in public.io] == ["1", "2"]
    assert public.tests.public_io is None and public.tests.count() == 2
    # capping the scored tests (max_tests, longest first) leaves the shown ones as they were
    (capped,) = cap_tests({"cc": problem}, 1).values()
    assert [case.input for case in capped.io] == ["100"]
    assert [case.input for case in capped.public_view().io] == ["1", "2"]


def test_a_shipped_split_without_public_tests_shows_none_and_no_split_shows_the_first_case():
    assert problem_from_record(codecontests([], ["3", "4"])).public_view() is None
    no_split = problem_from_record(codecontests(None, ["3", "4"]))
    assert [case.input for case in no_split.public_view().io] == ["3"]


def test_the_prompts_example_is_a_public_case_even_when_capped_away():
    problem = problem_from_record(codecontests(["1"], ["3"]))
    (capped,) = cap_tests({"cc": problem}, 1).values()
    (example,) = form_of(capped).instructions(capped)
    assert "Example input:\n1\nExample output:\n2" in example
    hidden = problem_from_record(codecontests([], ["3"]))
    assert form_of(hidden).instructions(hidden) == [
        "Read from standard input and write to standard output."
    ]


def lcb_record(functional: bool) -> dict:
    if functional:
        cases = [("1\n2", "3"), ("5\n5", "10"), ("0\n0", "0")]
        kind = "functional"
    else:
        cases = [("1 2\n", "3\n"), ("5 5\n", "10\n"), ("0 0\n", "0\n")]
        kind = "stdin"
    tests = [{"input": i, "output": o, "testtype": kind} for i, o in cases]
    return {
        "question_id": "q",
        "question_content": "Add the two numbers.",
        "starter_code": "",
        "public_test_cases": json.dumps(tests[:2]),
        "private_test_cases": json.dumps(tests[2:]),
        "metadata": json.dumps({"func_name": "add"} if functional else {}),
    }


def test_livecodebench_public_test_cases_are_the_shown_ones_in_both_forms():
    stdin = problem_from_record(lcb_record(functional=False))
    assert stdin.tests.count() == 3
    assert [case.input for case in stdin.public_view().io] == ["1 2\n", "5 5\n"]
    functional = problem_from_record(lcb_record(functional=True))
    assert functional.tests.count() == 3
    public = functional.public_view()
    assert [case.args for case in public.call] == [(1, 2), (5, 5)]
    assert public.tests.shown(1) == (("Call", "add(5, 5)"), ("Expected", "10"))


APPS_STATEMENT = """Given n (1 <= n <= 100) and n numbers, print their sum.

-----Examples-----
Input
2
1 3

Output
4

Input
1
1

Output
1
"""


def test_apps_cases_that_are_the_statements_examples_are_public():
    io = {"inputs": ["1\n1\n", "3\n1 2 3\n", "2\n1 3\n"], "outputs": ["1\n", "6\n", "4\n"]}
    record = {"question": APPS_STATEMENT, "input_output": json.dumps(io)}
    public = problem_from_record(record).public_view()
    assert [case.input for case in public.io] == ["1\n1\n", "2\n1 3\n"]  # in the tests' order
    # "1" and "6" are in the statement, but not as an example's input and output lines
    no_examples = {**record, "question": "Given n (1 <= n <= 100) numbers, print 6 times 1."}
    first = problem_from_record(no_examples).public_view()
    assert [case.input for case in first.io] == ["1\n1\n"]  # no example: the first case


def test_mbpp_shows_its_first_assert_with_its_setup():
    problem = Problem(
        task_id="m",
        prompt="p",
        test_list=["assert f(1) == 2", "assert f(2) == 3"],
        test_setup_code="K = 1",
        test_imports=["import math"],
    )
    public = problem.public_view()
    assert public.test_list == ("assert f(1) == 2",)
    assert (public.test_setup_code, public.test_imports) == ("K = 1", ("import math",))
    assert public.tests.shown(0) == (("Test", "assert f(1) == 2"),)
    first_only = "def f(x):\n    return 2 if x == 1 else 0\n"
    assert passes(public, first_only) and not passes(problem, first_only)


def test_humaneval_shows_checks_first_assert_and_every_module_still_runs():
    for task_id, problem in HUMANEVAL.items():
        public = problem.public_view()
        assert public is not None and public.tests.count() == 1, task_id
        form_of(public).validate(public)  # a valid test module, check(candidate) and all
        (shown,), (first,) = checks_of(public.tests), checks_of(problem.tests)[:1]
        assert ast.dump(ast.parse(shown[1])) == ast.dump(ast.parse(first[1])), task_id
    problem = HUMANEVAL["HumanEval/0"]
    assert "0.3) == True" in problem.public_view().test
    assert "0.05) == False" in problem.test and "0.05) == False" not in problem.public_view().test
    first_only = (
        "def has_close_elements(numbers, threshold):\n"
        "    return numbers == [1.0, 2.0, 3.9, 4.0, 5.0, 2.2] and threshold == 0.3\n"
    )
    assert passes(problem.public_view(), first_only) and not passes(problem, first_only)


def test_a_check_with_setup_keeps_the_statements_before_its_first_assert():
    test = (
        "HELPER = 2\n\n"
        "def check(candidate):\n"
        "    import math\n"
        "    x = math.floor(2.5)\n"
        "    assert candidate(x) == HELPER\n"
        "    assert candidate(3) == 3\n"
    )
    problem = Problem(task_id="c", prompt="def f(x):\n", entry_point="f", test=test)
    public = problem.public_view()
    ((_, source),) = checks_of(public.tests)
    assert source.split("\n")[:3] == [
        "import math",
        "x = math.floor(2.5)",
        "assert candidate(x) == HELPER",
    ]
    assert "HELPER = 2" in public.test and "candidate(3)" not in public.test


def test_kodcode_shows_its_first_test_function_with_its_imports_and_fixtures():
    problems = load_problems("kodcode-sample")
    parametrized = problems["Algorithm_1001_I"].public_view()
    assert names_of(parametrized.tests).functions == ("test_encodes",)
    assert (
        "import pytest" in parametrized.test_file and "test_long_run" not in parametrized.test_file
    )
    ((label, text),) = parametrized.tests.shown(0)
    assert label == "Test" and text.startswith("@pytest.mark.parametrize")
    in_a_class = problems["Data_Structure_2002_I"].public_view()
    assert names_of(in_a_class.tests).functions == ("TestAccount::test_withdraw",)
    assert (
        "test_overdraw" not in in_a_class.test_file and "class TestAccount" in in_a_class.test_file
    )


def test_every_named_problem_has_a_public_view_that_runs_as_a_problem():
    for name in NAMED_PROBLEMS:
        for task_id, problem in load_problems(name).items():
            public = problem.public_view()
            assert public is not None, (name, task_id)
            assert 1 <= public.tests.count() <= problem.tests.count(), (name, task_id)
            form_of(public).validate(public)
            assert public.tests.shown(0), (name, task_id)


def test_problems_without_a_split_dump_as_before():
    """A record with no public split writes no field for it: problem sets' fingerprints (and so
    resume keys) stay as they were; one with a split reads back equal."""
    dumped = json.dumps([p.model_dump(mode="json") for p in load_problems("taco-sample").values()])
    assert "public_io" not in dumped and "public_call" not in dumped
    problem = problem_from_record(lcb_record(functional=True))
    assert problem_from_record(problem.model_dump(mode="json")) == problem


@pytest.mark.parametrize("field", ["public_io", "public_call"])
def test_codeposts_own_records_may_declare_their_public_tests(field):
    if field == "public_io":
        record = {"io": [{"input": "1", "output": "1"}], field: [{"input": "2", "output": "2"}]}
    else:
        record = {
            "call": [{"args": [1], "expected": 1}],
            "fn_name": "f",
            field: [{"args": [2], "expected": 2}],
        }
    problem = problem_from_record({"task_id": "own", "prompt": "p", **record})
    assert problem.public_view().tests.count() == 1
    assert problem.public_view().tests != problem.tests
