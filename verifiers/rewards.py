"""Reward terms and their weighted sum.

The test term comes from the verdict (in [0, 1]); every other term is a small pure function of
the completion, registered once in :data:`REWARD_TERMS` with the least it gives and the model
of its own settings (as an advantage estimator has its hyperparameters): format and syntax in
{0, 1}, the length and forbidden-code penalties in [-1, 0]. ``RewardConfig.weights`` maps term
names to weights and ``RewardConfig.params`` a term's name to its settings; the verdict keeps
the test term and the weighted terms, unweighted (a term with weight 0 is not computed: two of
them parse the whole program). A new term is one registered function (:func:`reward_term`)
with its settings model, and a weight in the config, or a user's own function named by import
path in ``RewardConfig.custom`` (no fork needed). A ``sandbox_error`` is the
infrastructure's failure, never the program's (a program that breaks its containers gets a
``runtime_error``; one whose replies are slow to decide, a ``timeout``): by default its test
reward is ``None`` ("no reward" to TRL) and the callers count what they left out, so an engine
that dies mid-batch trains nothing as a failure; ``sandbox_errors="fail"`` scores it 0.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from ..settings.registry import Registry
from .extraction import Program, find_code_blocks, parse, strip_think
from .languages import PYTHON, source_language
from .plugins import Plugin

TEST = "test"  # the verdict's term; the others are registered below


class TermParams(BaseModel):
    """A reward term's own settings (``RewardConfig.params[name]``); a term without settings
    takes this one, which has none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# (its settings, completion, program, length) -> value; length counts the length term's unit
TermFunction = Callable[[Any, str, Program, int], float]


@dataclass(frozen=True)
class RewardTerm:
    """A term of the text: its function, the least it gives (``floor``, what a completion too
    long to make a program of gets) and the model of its settings."""

    fn: TermFunction
    floor: float = 0.0
    params: type[TermParams] = TermParams


REWARD_TERMS: Registry[RewardTerm] = Registry("reward term")


def reward_term(
    name: str, floor: float = 0.0, params: type[TermParams] = TermParams
) -> Callable[[TermFunction], TermFunction]:
    """Decorator registering a reward term of the completion under ``name``, called with its
    settings (a ``params`` instance) first."""

    def decorator(fn: TermFunction) -> TermFunction:
        if name == TEST:
            raise ValueError(f"reward term {name!r} is the tests' own")
        REWARD_TERMS.register(name, RewardTerm(fn, floor, params))
        return fn

    return decorator


class FormatParams(TermParams):
    require_think: bool = Field(
        False, description="the format reward also asks for a closed <think> block"
    )


class LengthParams(TermParams):
    unit: Literal["chars", "tokens"] = Field(
        "chars", description="what a length counts; tokens: samples carry completion_ids"
    )
    budget: int = Field(4096, gt=0, description="no penalty up to this length")
    buffer: int = Field(1024, gt=0, description="the penalty reaches -1 this far past the budget")


class ForbiddenParams(TermParams):
    imports: tuple[str, ...] = Field(
        ("ctypes", "multiprocessing", "socket", "subprocess"),
        description="modules (and their submodules) the model's code may not import",
    )
    calls: tuple[str, ...] = Field(
        (
            "__import__",
            "compile",
            "eval",
            "exec",
            "exit",
            "os._exit",
            "os.kill",
            "os.system",
            "quit",
            "sys.exit",
        ),
        description="calls the model's code may not make, import aliases resolved",
    )


def term_names() -> tuple[str, ...]:
    """Every registered reward term, the test term first, in the order they are summed."""
    return (TEST, *REWARD_TERMS)


class CustomTerm(Plugin):
    """A user's own term of the text: ``fn(completion, program, length, **kwargs) -> float``
    (``program``: :class:`~.extraction.Program`, the code the verifier would run)."""

    floor: float = Field(0.0, description="what a completion too long to make a program of gets")

    def arguments(self) -> int:
        return 3

    def term(self) -> RewardTerm:
        fn, kwargs = self.function, self.kwargs
        return RewardTerm(
            lambda params, completion, program, length: float(
                fn(completion, program, length, **kwargs)
            ),
            self.floor,
        )


def _each_terms_schema(schema: dict[str, Any]) -> None:
    """``params``' JSON schema with each registered term's own settings, as the values are
    read (:meth:`RewardConfig._each_terms_own`): what Prefect's form shows and what a
    deployment's parameters are checked against (the base model alone allows no field)."""
    schema.pop("additionalProperties", None)
    schema["properties"] = {
        name: term.params.model_json_schema()
        for name, term in REWARD_TERMS.items()
        if term.params.model_fields
    }
    schema["additionalProperties"] = False


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Spellings of earlier versions, refused with the new one's name.
    renamed: ClassVar[dict[str, str]] = {
        **{
            f"{name}_weight": f"weights.{name}"
            for name in ("test", "format", "syntax", "length", "forbidden")
        },
        "require_think": "params.format.require_think",
        "length_unit": "params.length.unit",
        "length_budget": "params.length.budget",
        "length_buffer": "params.length.buffer",
        "forbidden_imports": "params.forbidden.imports",
        "forbidden_calls": "params.forbidden.calls",
    }

    weights: dict[str, float] = Field(
        default_factory=lambda: {TEST: 1.0},
        description="reward term -> weight: test (the verdict's), format, syntax, length, "
        "forbidden, or any registered term; a term left out weighs 0 and is not computed",
    )
    custom: dict[str, CustomTerm] = Field(
        default_factory=dict,
        description="a user's own terms, name -> {import_path: package.module:function, kwargs, "
        "floor}: function(completion, program, length, **kwargs) -> float, weighted by "
        "weights[name]",
    )
    params: dict[str, SerializeAsAny[TermParams]] = Field(
        default_factory=lambda: {
            name: term.params() for name, term in REWARD_TERMS.items() if term.params.model_fields
        },
        description="a registered term's own settings, by its name: format {require_think}, "
        "length {unit, budget, buffer}, forbidden {imports, calls}; a term left out keeps its "
        "defaults",
        json_schema_extra=lambda schema: _each_terms_schema(schema),
    )
    test_reward: Literal["binary", "pass_fraction"] = "binary"
    sandbox_errors: Literal["exclude", "fail"] = "exclude"  # a sandbox error's test reward

    @field_validator("params", mode="before")
    @classmethod
    def _each_terms_own(cls, params: Any) -> Any:
        """Each entry read by its term's own model (unknown keys named by the term)."""
        if not isinstance(params, dict):
            return params
        return {
            name: value
            if isinstance(value, REWARD_TERMS[name].params)
            else REWARD_TERMS[name].params.model_validate(value)
            for name, value in params.items()
        }

    @model_validator(mode="after")
    def _known_terms(self) -> RewardConfig:
        taken = sorted(set(self.custom) & set(term_names()))
        if taken:
            raise ValueError(f"custom reward term {taken}: a registered term has that name")
        unknown = sorted(set(self.weights) - set(self.names()))
        if unknown:
            raise ValueError(f"no reward term {unknown}; known: {', '.join(self.names())}")
        return self

    def weight(self, name: str) -> float:
        return self.weights.get(name, 0.0)

    def term_params(self, name: str) -> Any:
        """Term ``name``'s settings: as given, else its defaults."""
        return self.params.get(name) or self.terms()[name].params()

    def term_value(self, name: str, completion: str, program: Program, length: int) -> float:
        """Term ``name`` of one completion, unweighted, with its settings."""
        return self.terms()[name].fn(self.term_params(name), completion, program, length)

    def terms(self) -> dict[str, RewardTerm]:
        """The terms of the text: the registered ones, then this config's own."""
        return {**REWARD_TERMS, **{name: term.term() for name, term in self.custom.items()}}

    def names(self) -> tuple[str, ...]:
        """Every term, the test term first, in the order they are summed."""
        return (TEST, *REWARD_TERMS, *self.custom)


def test_reward(passed: bool, pass_fraction: float, mode: str = "binary") -> float:
    return float(passed) if mode == "binary" else pass_fraction


def verdict_test_reward(
    config: RewardConfig, passed: bool, pass_fraction: float, sandbox_error: bool
) -> float | None:
    """The unweighted test component of one verdict; None for an excluded sandbox error."""
    if sandbox_error:
        return None if config.sandbox_errors == "exclude" else 0.0
    return test_reward(passed, pass_fraction, config.test_reward)


def think_closed(completion: str) -> bool:
    """A ``<think>`` block opened (here or by the chat template's generation prompt) and closed."""
    closing = completion.find("</think>")
    opening = completion.find("<think>")
    return closing >= 0 and opening < closing and completion.count("<think>") <= 1


def format_reward(completion: str, require_think: bool = False, language: str = PYTHON) -> float:
    """1 for exactly one closed, non-empty code block of ``language`` outside ``<think>`` (and
    a closed think block when required), else 0."""
    if require_think and not think_closed(completion):
        return 0.0
    blocks = find_code_blocks(strip_think(completion))
    tags = source_language(language).fences
    ok = len(blocks) == 1 and blocks[0].closed and blocks[0].language in tags
    return float(ok and bool(blocks[0].code.strip()))


def syntax_reward(source: str, language: str = PYTHON) -> float:
    """1 when a Python program parses. A program in a compiled language is judged by its
    compiler in the sandbox: 1 here, and the verifier makes it 0 on ``compile_error``."""
    return float(language != PYTHON or parse(source) is not None)


def length_penalty(length: int, budget: int, buffer: int) -> float:
    """0 up to ``budget``, then linear down to -1 at ``budget + buffer`` (DAPO's soft overlong
    punishment, measured past the budget)."""
    return max(-1.0, min(0.0, (budget - length) / buffer))


def find_forbidden(program: Program, imports: tuple[str, ...], calls: tuple[str, ...]) -> list[str]:
    """Forbidden imports and calls in the model's own code, with import aliases resolved
    (``from os import system as s; s()`` is ``os.system``). The trusted prompt is not looked at.
    The names are Python's: a program in another language has none (the sandbox contains what
    it does).
    """
    if program.language != PYTHON:
        return []
    tree, first_line = parse(program.source), program.code_line
    if tree is None:
        tree, first_line = parse(program.code), 1
    if tree is None:
        return []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found: list[str] = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) < first_line:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            found += [f"import {module}" for module in modules if _matches(module, imports)]
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name is None:
                continue
            head, _, rest = name.partition(".")
            resolved = aliases.get(head, head) + (f".{rest}" if rest else "")
            if resolved in calls:
                found.append(f"call {resolved}")
    return found


def forbidden_penalty(program: Program, imports: tuple[str, ...], calls: tuple[str, ...]) -> float:
    return -1.0 if find_forbidden(program, imports, calls) else 0.0


def _matches(module: str, forbidden: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in forbidden)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


reward_term("format", params=FormatParams)(
    lambda params, completion, program, length: format_reward(
        completion, params.require_think, program.language
    )
)
reward_term("syntax")(
    lambda params, completion, program, length: syntax_reward(program.source, program.language)
)
reward_term("length", floor=-1.0, params=LengthParams)(
    lambda params, completion, program, length: length_penalty(length, params.budget, params.buffer)
)
reward_term("forbidden", floor=-1.0, params=ForbiddenParams)(
    lambda params, completion, program, length: forbidden_penalty(
        program, params.imports, params.calls
    )
)


def rule_components(
    config: RewardConfig, completion: str, program: Program | None, length: int
) -> dict[str, float]:
    """The weighted terms of the text only (the syntax and forbidden-code terms parse the whole
    program, which costs ~300x its size in memory); with no ``program`` (a completion over
    the size limit), each one's floor."""
    return {
        name: term.floor
        if program is None
        else config.term_value(name, completion, program, length)
        for name, term in config.terms().items()
        if config.weight(name)
    }


def combine(config: RewardConfig, components: Mapping[str, float | None]) -> float | None:
    """The weighted sum; ``None`` when a weighted component is unknown (a sandbox error)."""
    total = 0.0
    for name in config.names():
        weight = config.weight(name)
        if weight == 0:
            continue
        value = components.get(name)
        if value is None:
            return None
        total += weight * value
    return total
