"""Problems -> the text a model is prompted with, and the completion style the verifier reads.

The sampler, SFT and evaluation all prompt through :func:`build_prompt`, so SFT teaches the
format the verifier will read. Two styles:

* ``continuation``: the problem's own code prompt, raw (HumanEval with a base model); the
  completion continues it.
* ``chat``: a user turn through the tokenizer's chat template asking for one fenced block in
  the problem's language (```` ```python ````, ```` ```cpp ````); the verifier extracts the
  code. Problems whose prompt is prose are always chat; the problem's test form says what the
  turn adds to the statement (an MBPP assert, an io example, a starter code, the module a
  pytest file imports). The assistant's turn opens with that fence (:attr:`Prompt.answer_prefix`,
  as evalplus prompts chat models), so the answer is code from its first token and the
  samplers stop it at the closing fence (:data:`ANSWER_END`): no tokens are spent on prose
  after the code, and a completion that never closes its block is one cut at ``max_tokens``.
* ``chat-free``: the same user turn, the assistant's turn left empty and no stop at the fence:
  for models that reason (``<think>``) or explain before the code; generation runs to EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ...verifiers import Problem
from ...verifiers.chat import user_message
from ...verifiers.languages import source_language

PromptStyle = Literal["chat", "chat-free", "continuation"]
# Ends a ``chat`` answer: the closing fence of the block its prefix opened (a fence is a line
# of its own, so the code before it ends with a newline).
ANSWER_END = "\n```"


@dataclass(frozen=True)
class Prompt:
    """What a model is asked for one problem, and how its answer is read."""

    task_id: str
    text: str  # the prompt, chat template applied
    completion_style: Literal["chat", "continuation"]  # how the verifier reads the answer
    # Opens the answer: tokenized after ``text`` as part of the prompt, and the start of the
    # completion's text (so ``text + completion`` is the sequence the model saw, and the
    # verifier reads a whole fenced block).
    answer_prefix: str = ""

    @property
    def model_input(self) -> str:
        """Exactly what is tokenized as the prompt."""
        return self.text + self.answer_prefix

    @property
    def stop(self) -> tuple[str, ...]:
        """Where the answer ends besides EOS: the closing fence of a block the prefix opened."""
        return (ANSWER_END,) if self.answer_prefix else ()


def build_prompt(problem: Problem, tokenizer: Any, style: PromptStyle = "chat") -> Prompt:
    """The prompt for one problem. ``continuation`` needs a code prompt (HumanEval)."""
    if style == "continuation":
        if not problem.prompt_is_code:
            raise ValueError(
                f"{problem.task_id}: continuation prompts need a code prompt (HumanEval style); "
                "use style='chat'"
            )
        return Prompt(problem.task_id, problem.prompt, "continuation")
    if style not in ("chat", "chat-free"):
        raise ValueError(
            f"prompt style must be 'chat', 'chat-free' or 'continuation', got {style!r}"
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("style='chat' needs a tokenizer with a chat template")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message(problem)}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prefix = f"```{source_language(problem.language).fences[0]}\n" if style == "chat" else ""
    return Prompt(problem.task_id, text, "chat", prefix)


def reference_answer(problem: Problem, style: PromptStyle = "chat") -> str | None:
    """The completion a perfect model would give in ``style`` (for SFT), None without one."""
    solution = problem.canonical_solution
    if solution is None:
        return None
    solution = solution.replace("\r\n", "\n")
    if style == "continuation":
        return solution
    code = problem.prompt + solution if problem.prompt_is_code else solution
    return f"```{source_language(problem.language).fences[0]}\n{code.strip()}\n```"
