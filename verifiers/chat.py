"""What a chat model is asked for a problem, in words: the request that opens an episode, and
the answer format that ends it and every reply of an environment, so that a model answers each
turn in the one form the verifier reads."""

from __future__ import annotations

from .forms import form_of
from .languages import source_language
from .problems import Problem


def answer_format(problem: Problem) -> str:
    """The last line of a chat request: the whole solution in one block of its language."""
    language = source_language(problem.language)
    what = "solution" if language.name == "python" else f"{language.title} program"
    return f"Answer with the complete {what} in one ```{language.fences[0]} code block."


def user_message(problem: Problem) -> str:
    """The chat request for ``problem``: its statement, the interface to honour, the format."""
    if problem.prompt_is_code:
        return (
            "Complete the following Python function.\n\n"
            f"```python\n{problem.prompt.rstrip()}\n```\n\n{answer_format(problem)}"
        )
    parts = [
        problem.prompt.strip(),
        *form_of(problem).instructions(problem),
        answer_format(problem),
    ]
    return "\n\n".join(parts)
