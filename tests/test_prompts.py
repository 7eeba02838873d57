"""Problem sets (MBPP splits) and prompts: the sampler, SFT and evaluation all prompt alike."""

from __future__ import annotations

import pytest

from codepost.pipeline.data.problem_sets import ProblemSet, fingerprint, load_problem_set
from codepost.pipeline.data.prompts import ANSWER_END, build_prompt, reference_answer
from codepost.verifiers import Problem, build_program
from codepost.verifiers.chat import user_message
from codepost.verifiers.problems import MBPP

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class TemplateTokenizer:
    chat_template = CHAT_TEMPLATE

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        from jinja2 import Template

        return Template(CHAT_TEMPLATE).render(
            messages=messages, add_generation_prompt=add_generation_prompt
        )


@pytest.mark.parametrize(("split", "count"), [("train", 374), ("test", 500), ("validation", 90)])
def test_mbpp_splits_are_the_task_id_ranges_of_its_readme(split, count):
    problems = load_problem_set(ProblemSet(source=MBPP, split=split))
    assert len(problems) == count


def test_limit_and_shuffle_are_deterministic():
    a = load_problem_set(ProblemSet(limit=5, shuffle_seed=3))
    b = load_problem_set(ProblemSet(limit=5, shuffle_seed=3))
    assert list(a) == list(b) != [f"HumanEval/{i}" for i in range(5)]
    assert fingerprint(a) == fingerprint(b) != fingerprint(load_problem_set(ProblemSet(limit=5)))


def test_a_split_that_a_file_does_not_have_is_refused():
    with pytest.raises(ValueError, match="no 'train' split"):
        load_problem_set(ProblemSet(split="train"))


def test_mbpp_chat_prompt_shows_one_assert_and_the_answer_format():
    problem = load_problem_set(ProblemSet(source=MBPP, split="train", limit=1))
    (problem,) = problem.values()
    prompt = build_prompt(problem, TemplateTokenizer())
    assert prompt.completion_style == "chat"
    assert prompt.text.startswith("<|user|>") and prompt.text.endswith("<|assistant|>")
    assert problem.test_list[0] in prompt.text and problem.test_list[1] not in prompt.text


def test_io_prompt_shows_the_first_case_as_an_example():
    problem = Problem(
        task_id="io", prompt="Add two numbers.", io=[{"input": "1 2\n", "output": "3\n"}]
    )
    message = user_message(problem)
    assert "Example input:\n1 2" in message and "Example output:\n3" in message


def test_humaneval_continuation_is_the_raw_code_prompt_and_needs_a_code_prompt():
    problems = load_problem_set(ProblemSet(limit=1))
    (problem,) = problems.values()
    prompt = build_prompt(problem, TemplateTokenizer(), "continuation")
    assert prompt.text == problem.prompt and prompt.completion_style == "continuation"
    mbpp = next(iter(load_problem_set(ProblemSet(source=MBPP, split="test")).values()))
    with pytest.raises(ValueError, match="continuation prompts need a code prompt"):
        build_prompt(mbpp, TemplateTokenizer(), "continuation")


@pytest.mark.parametrize("style", ["chat", "continuation"])
def test_the_reference_answer_in_each_style_is_read_back_as_the_reference(style):
    (problem,) = load_problem_set(ProblemSet(limit=1)).values()
    answer = reference_answer(problem, style)
    program = build_program(problem, answer, style)
    assert program.style == style
    assert "for idx, elem in enumerate(numbers)" in program.source


def test_a_chat_answer_opens_with_the_fence_and_ends_at_its_closing_fence():
    (problem,) = load_problem_set(ProblemSet(limit=1)).values()
    chat = build_prompt(problem, TemplateTokenizer())
    assert chat.answer_prefix == "```python\n" and chat.stop == (ANSWER_END,)
    assert chat.model_input == chat.text + "```python\n"
    # SFT teaches the same answer the sampler completes: the prefix, the code, the fence.
    answer = reference_answer(problem)
    assert answer.startswith(chat.answer_prefix) and answer.endswith(ANSWER_END)
    free = build_prompt(problem, TemplateTokenizer(), "chat-free")
    assert free.text == chat.text and free.model_input == free.text and free.stop == ()
    assert free.completion_style == chat.completion_style == "chat"
