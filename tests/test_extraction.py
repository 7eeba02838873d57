"""Completions -> programs: think blocks, markdown fences, block choice, program assembly."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from codepost.verifiers import Problem, build_program, extract_code
from codepost.verifiers.extraction import (
    completion_text,
    defines,
    find_code_blocks,
    import_lines,
    resolve_style,
    strip_think,
)

HUMANEVAL_LIKE = Problem(
    task_id="t",
    prompt="import math\nfrom typing import List\n\n\ndef helper(x):\n    return x\n\n\n"
    'def f(xs: List[int]) -> int:\n    """Sum."""\n',
    entry_point="f",
    test="def check(candidate):\n    assert candidate([1]) == 1\n",
    prompt_is_code=True,
)
MBPP_LIKE = Problem(
    task_id="m",
    prompt="Write a function f that sums a list.",
    test_list=["assert f([1, 2]) == 3"],
    entry_point="f",
)


def test_strip_think_blocks():
    assert strip_think("<think>plan ```python\nx=1\n```</think>answer") == "answer"
    assert strip_think("a<think>x</think>b<think>y</think>c") == "abc"
    assert strip_think("answer<think>never closed ```python\nx") == "answer"
    # the chat template opened <think> in the prompt: everything up to </think> is reasoning
    assert strip_think("reasoning```python\nbad\n```</think>\nfinal") == "\nfinal"


def test_find_code_blocks():
    text = (
        "intro\n```Python\ndef f():\n    return 1\n```\nprose\n```\nplain\n```\n"
        "````markdown\n```python\ninner\n```\n````\n```bash\nls\n"
    )
    blocks = find_code_blocks(text)
    assert [(b.language, b.closed) for b in blocks] == [
        ("python", True),
        ("", True),
        ("markdown", True),
        ("bash", False),
    ]
    assert blocks[0].code == "def f():\n    return 1\n"
    assert blocks[2].code == "```python\ninner\n```\n"  # a longer fence holds shorter ones
    assert [b.is_python for b in blocks] == [True, True, False, False]


def test_extract_prefers_the_block_that_defines_the_entry_point():
    text = (
        "```python\ndef f(xs):\n    return sum(xs)\n```\n"
        "Usage, a longer block:\n```python\nprint(f([1, 2, 3]))\nprint(f([4, 5, 6]))\n```\n"
    )
    assert extract_code(text, "f") == "def f(xs):\n    return sum(xs)\n"
    assert extract_code(text, None).startswith("print(f([1, 2, 3]))")  # the longest


def test_extract_takes_the_last_definition_and_ignores_thinking():
    text = (
        "<think>```python\ndef f(xs):\n    return 'draft'\n```</think>"
        "```python\ndef f(xs):\n    return 0\n```\nFixed:\n```python\ndef f(xs):\n    return 1\n```"
    )
    assert extract_code(text, "f") == "def f(xs):\n    return 1\n"


def test_extract_falls_back_to_any_block_then_to_the_text():
    assert extract_code("```\nx = 1\n```\n```text\nlonger output here\n```", "f") == "x = 1\n"
    assert extract_code("```text\nonly this\n```", "f") == "only this\n"
    assert extract_code("<think>hmm</think>def f():\n    return 1\n", "f") == (
        "def f():\n    return 1\n"
    )


def test_extract_recognises_a_definition_in_broken_code():
    text = "```python\ndef f(xs):\n    return (\n```\n```python\nprint('a much longer block')\n```"
    assert extract_code(text, "f") == "def f(xs):\n    return (\n"


def test_defines():
    assert defines("def f(): pass", "f")
    assert defines("class f: pass", "f")
    assert defines("f = lambda: 1", "f")
    assert not defines("def g(): f = 1", "f")
    assert defines("def f(:\n", "f")  # regex fallback


def test_import_lines_of_prose_are_none():
    assert (
        import_lines("Write f.\nfrom the list, return the largest.\nimport os\n") == "import os\n"
    )


def test_import_lines():
    assert import_lines(HUMANEVAL_LIKE.prompt) == "import math\nfrom typing import List\n"
    assert import_lines("import os\ndef f(:\n") == "import os\n"


def test_resolve_style():
    assert resolve_style("    return 1\n", "auto") == "continuation"
    assert resolve_style("```python\nx\n```", "auto") == "chat"
    assert resolve_style("</think>x", "auto") == "chat"
    assert resolve_style("```", "continuation") == "continuation"
    with pytest.raises(ValueError, match="completion_style"):
        resolve_style("x", "markdown")


def test_continuation_program_is_prompt_plus_completion():
    program = build_program(HUMANEVAL_LIKE, "    return sum(xs)\n")
    assert program.source == HUMANEVAL_LIKE.prompt + "    return sum(xs)\n"
    assert program.style == "continuation"
    assert program.source.splitlines()[program.code_line - 1] == "    return sum(xs)"


def test_chat_program_keeps_the_prompts_code_first():
    answer = "Here:\n```python\ndef f(xs):\n    return helper(sum(xs))\n```\nDone."
    program = build_program(HUMANEVAL_LIKE, answer)
    assert program.style == "chat"
    assert program.code == "def f(xs):\n    return helper(sum(xs))\n"
    assert program.source.startswith(HUMANEVAL_LIKE.prompt.rstrip("\n"))
    assert program.source.endswith(program.code)
    assert program.source.splitlines()[program.code_line - 1] == "def f(xs):"
    namespace: dict = {}
    exec(program.source, namespace)  # the answer's f replaces the prompt's stub
    assert namespace["f"]([1, 2]) == 3


def test_chat_program_after_a_prompt_that_does_not_parse_gets_its_imports():
    problem = HUMANEVAL_LIKE.model_copy(update={"prompt": "import math\ndef f(xs):\n    x = ("})
    program = build_program(problem, "```python\ndef f(xs):\n    return 1\n```", "chat")
    assert program.source == "import math\n\n\ndef f(xs):\n    return 1\n"


def test_a_chat_answers_future_imports_stay_first():
    answer = (
        '```python\n"""Doc."""\nfrom __future__ import annotations\n'
        "def f(xs: list[int]) -> int:\n    return sum(xs)\n```"
    )
    program = build_program(HUMANEVAL_LIKE, answer)
    assert program.source.startswith('"""Doc."""\nfrom __future__ import annotations\n')
    assert program.source.splitlines()[program.code_line - 1] == "def f(xs: list[int]) -> int:"
    namespace: dict = {}
    exec(compile(program.source, "<program>", "exec", dont_inherit=True), namespace)
    assert namespace["f"]([1, 2]) == 3 and namespace["f"].__annotations__["xs"] == "list[int]"
    shared_line = "```python\nfrom __future__ import annotations; import os\n```"
    assert build_program(HUMANEVAL_LIKE, shared_line).code_line > 1  # kept after the prompt


def test_mbpp_programs_are_the_completion_alone():
    assert build_program(MBPP_LIKE, "def f(x):\n    return sum(x)\n").source == (
        "def f(x):\n    return sum(x)\n"
    )
    chat = build_program(MBPP_LIKE, "```py\ndef f(x):\n    return sum(x)\n```")
    assert chat.source == "def f(x):\n    return sum(x)\n"
    assert chat.code_line == 1


def test_completion_text():
    assert completion_text("x") == "x"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert completion_text(messages) == "a"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]
    assert completion_text(parts) == "ab"
    with pytest.raises(TypeError, match="assistant message"):
        completion_text([{"role": "user", "content": "q"}])


def test_triple_backticks_inside_a_python_string_are_code():
    text = (
        "Here:\n```python\ndef f():\n    s = '''\n```\nnot the end\n'''\n"
        '    t = "```"  # """\n    return s\n```\nprose\n'
    )
    (block,) = find_code_blocks(text)
    assert block.closed
    assert block.code == (
        "def f():\n    s = '''\n```\nnot the end\n'''\n    t = \"```\"  # \"\"\"\n    return s\n"
    )
    assert extract_code(text, "f") == block.code


def test_unbalanced_quotes_end_the_block_at_the_first_fence_after_all():
    (block,) = find_code_blocks("```python\nx = '''\n```\nprose, not code\n")
    assert block.closed and block.code == "x = '''\n"


@pytest.mark.parametrize(
    "text",
    [
        "```" + "a" * 200_000 + "`",  # quadratic for the old fence pattern (30 s at 100 kB)
        "```" + " " * 200_000 + "x`",
        "```python\n" + '"' * 200_000 + "\n```\n",
        "```python\n" + "\\" * 100_000 + '"' * 100_000 + "\n```\n",
        "```python\nx = '''\n" + "```\n" * 50_000,
    ],
    ids=["long-fence", "long-spaces", "quotes", "backslashes", "fences-in-a-string"],
)
def test_extraction_is_linear_on_hostile_text(text):
    """Timed against one pass of the regex engine over the same text on the same machine (a
    match a character), so the bound holds whatever the machine's speed: 2 to 6 passes here,
    where the old fence pattern took thousands (30 s at 100 kB)."""
    one_pass = _fastest_seconds(lambda: re.findall(r"[\s\S]", text))
    extraction = _fastest_seconds(lambda: (extract_code(text, "f"), find_code_blocks(text)))
    assert extraction < 100 * one_pass, (extraction, one_pass)


def _fastest_seconds(work: Callable[[], object]) -> float:
    """The fastest of three runs: a busy machine slows some of them, rarely all."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)
