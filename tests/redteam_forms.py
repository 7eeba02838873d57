"""Attacks on the test forms: cheats against the call, check, io and pytest judges."""

from __future__ import annotations

from redteam_samples import (
    CALL_ADD,
    FAILED,
    NOT_PASSED,
    PYTEST_ADD,
    PYTEST_STAR,
    RUNTIME_ERROR,
    Attack,
    program,
)

# Cheats against the call and pytest judges: each would pass where the program and the test
# harness share a process (APPS' testing_util, rllm's KodCode reward runs pytest on solution.py
# and reads its exit status).
_PYTEST_SABOTAGE = """
import os
import sys

# a conftest and a pytest.ini wherever pytest might look, and pytest's own modules patched
HOOK = (
    "import pytest\\n"
    "@pytest.hookimpl(hookwrapper=True)\\n"
    "def pytest_runtest_makereport(item, call):\\n"
    "    outcome = yield\\n"
    "    outcome.get_result().outcome = 'passed'\\n"
)
for folder in ("/work", "/tmp", "/dev/shm", os.getcwd()):
    for name, text in (
        ("conftest.py", HOOK),
        ("pytest.ini", "[pytest]\\naddopts = -p conftest --co\\n"),
        ("pyproject.toml", "[tool.pytest.ini_options]\\naddopts = '--co'\\n"),
        ("test_solution.py", "def test_x():\\n    pass\\n"),
    ):
        try:
            with open(os.path.join(folder, name), "w") as stream:
                stream.write(text)
        except OSError:
            pass
sys.path.append("/usr/lib/python3/dist-packages")
try:
    import _pytest.runner
    import _pytest.assertion.rewrite

    _pytest.runner.call_and_report = lambda *a, **k: None
    _pytest.assertion.rewrite.rewrite_asserts = lambda *a, **k: None
except ImportError:
    pass
os.environ["PYTEST_ADDOPTS"] = "--co"
"""
FORM_ATTACKS = [
    Attack(
        "call_always_equal_result",
        program("""
        class Equal:
            def __eq__(self, other):
                return True

            __hash__ = object.__hash__


        def add(a, b):
            return Equal()
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_list_that_equals_anything",
        program("""
        class Anything(list):
            def __eq__(self, other):
                return True


        def add(a, b):
            return Anything()
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_sequence_of_tuples_posing_as_the_answer",  # APPS' list-of-tuples rule
        program("""
        class Pairs:
            def __getitem__(self, i):
                return (5,)

            def __iter__(self):
                return iter([(5,), (-3,), (10,)])


        def add(a, b):
            return Pairs()
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_frames_and_builtins_patched",
        program("""
        import builtins
        import sys

        builtins.isinstance = lambda *a: True
        builtins.list = lambda *a: [5]


        def add(a, b):
            frame = sys._getframe()
            while frame.f_back is not None:
                frame = frame.f_back
            return frame.f_locals.get("expected", 0)
        """),
        frozenset(NOT_PASSED),  # patched builtins break its own replies too
        CALL_ADD,
    ),
    Attack(
        "call_solution_class_that_answers_any_method",
        program("""
        class Solution:
            def __getattr__(self, name):
                return lambda *args: [args]
        """),
        frozenset({FAILED}),
        CALL_ADD,
    ),
    Attack(
        "call_os_exit_0_in_the_call",
        program("""
        import os


        def add(a, b):
            os._exit(0)
        """),
        frozenset(NOT_PASSED),
        CALL_ADD,
    ),
    Attack(
        "call_keyboard_interrupt_in_the_call",
        program("""
        def add(a, b):
            raise KeyboardInterrupt
        """),
        frozenset(NOT_PASSED),
        CALL_ADD,
    ),
    Attack(
        "pytest_conftest_ini_and_patched_pytest",
        _PYTEST_SABOTAGE + "\n\ndef add(a, b):\n    return 0\n",
        frozenset({FAILED}),
        PYTEST_ADD,
        wall_time_s=8.0,  # it imports pytest itself, beside the judge's: slow on a busy machine
        cpu_time_s=8.0,
    ),
    Attack(
        "pytest_sys_exit_0_at_load",
        program("""
        import sys

        sys.exit(0)


        def add(a, b):
            return a + b
        """),
        frozenset({RUNTIME_ERROR}),
        PYTEST_ADD,
    ),
    Attack(
        "pytest_os_exit_0_in_a_test",
        program("""
        import os


        def add(a, b):
            os._exit(0)
        """),
        frozenset(NOT_PASSED),
        PYTEST_ADD,
    ),
    Attack(
        "pytest_skip_and_interrupt_raised_by_the_program",
        program("""
        class Skipped(BaseException):
            pass


        class Exit(SystemExit):
            pass


        calls = []


        def add(a, b):
            calls.append(1)
            if len(calls) == 1:
                raise Skipped("skip me")
            if len(calls) == 2:
                raise Exit(0)
            raise KeyboardInterrupt
        """),
        frozenset(NOT_PASSED),
        PYTEST_ADD,
    ),
    Attack(
        "pytest_import_star_shadows_builtins_pytest_and_tests",
        program("""
        def evens(xs):
            return []


        def mean_of(xs):
            return "anything"


        def sorted(xs):
            return [2, 4]


        class pytest:
            approx = staticmethod(lambda value: "anything")


        def test_evens():
            pass


        def test_mean():
            pass


        pytestmark = []


        def setup_module(module):
            pass
        """),
        frozenset({FAILED}),
        PYTEST_STAR,
    ),
]
