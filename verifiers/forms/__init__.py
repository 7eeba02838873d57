"""Test forms: the kinds of tests a problem carries, each one module that registers itself.

A form declares how to recognise and validate its tests (its ``tests_model`` and the record
field that marks it), how to build the sandbox job that runs them (and its judge), how to
prompt for a solution, and how to read the sandbox's result into an assessment. The verifier,
the prompts and the problem loaders ask this registry; no other code names a form. The
built-in forms are this package's modules (``check``, ``asserts``, ``io``, ``call``,
``pytest``); another module that calls :func:`register` adds one.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ...settings.registry import Registry
from ..verdicts import Assessment, assess_judged

if TYPE_CHECKING:
    from ...sandbox import ExecutionResult, Job, Limits
    from ..problems import Problem

# Loaded by name (the registry imports every module here on the first look-up): a stage that
# judges programs runs them all, so its resume key holds them all (pipeline/code_version.py).
__modules_loaded_by_name__ = True

Tests = TypeVar("Tests", bound="FormTests")
Derived = TypeVar("Derived")


def kept_with_tests(derive: Callable[[Tests], Derived]) -> Callable[[Tests], Derived]:
    """``derive(tests)`` computed once per problem's tests (equal ones share it) and kept as
    long as they are: once for all the samples of a problem and every request that names its
    set, however many problems a run cycles through (a cache of the last few would miss every
    time), and nothing kept of a problem gone."""
    results: weakref.WeakKeyDictionary[Tests, Derived] = weakref.WeakKeyDictionary()

    @functools.wraps(derive)
    def kept(tests: Tests) -> Derived:
        try:
            return results[tests]
        except KeyError:
            result = results[tests] = derive(tests)
            return result

    return kept


class FormTests(BaseModel):
    """A problem's tests in one form; each form subclasses it with ``form: Literal[name]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    form: str

    def count(self) -> int:
        """How many tests a verdict has (one per test function, assert, case...)."""
        raise NotImplementedError

    def capped(self, max_tests: int) -> FormTests:
        """At most ``max_tests`` of these tests, chosen deterministically (rllm keeps the
        longest inputs); forms whose tests are one module run it whole."""
        return self

    def public(self) -> FormTests | None:
        """The tests a model may see (an episode's feedback runs them), as tests of this form;
        None when there are none. Each form's rule is declared (docs/test-forms.md), never a
        random draw: the data set's own public tests where it ships them, else the first test.
        """
        return None

    def shown(self, index: int) -> tuple[tuple[str, str], ...]:
        """Test ``index`` as a person reading it sees it, ``(label, text)`` pairs (an assert
        line; a case's input and expected output): what feedback quotes of a failing public
        test, so it is only asked of the tests :meth:`public` gave."""
        return ()


class Form(ABC):
    """How problems with tests of one form are run and judged."""

    tests_model: ClassVar[type[FormTests]]
    marker: ClassVar[str]  # the record field that holds tests of this form
    languages: ClassVar[tuple[str, ...]] = ("python",)  # what the programs it judges are in
    per_case_limits: ClassVar[bool] = False  # io: the sandbox's limits apply to each case

    @property
    def name(self) -> str:
        return str(self.tests_model.model_fields["form"].default)

    def validate(self, problem: Problem) -> None:
        """Checks across the problem's fields (raise ValueError naming what is wrong)."""
        return None

    def instructions(self, problem: Problem) -> list[str]:
        """What a chat prompt says after the problem statement: the interface to honour."""
        return []

    def limits(self, problem: Problem, limits: Limits) -> Limits:
        """The limits a job runs under: the problem's own time and memory limits, where it
        has them, for each program (an io case); one job that runs all the tests (a judge)
        gets the time of all of them."""
        changes: dict[str, Any] = {}
        if problem.time_limit_s is not None:
            per_job = problem.time_limit_s * (1 if self.per_case_limits else problem.tests.count())
            changes.update(wall_time_s=per_job, cpu_time_s=per_job)
        if problem.memory_limit_mb is not None:
            changes["memory_mb"] = problem.memory_limit_mb
        return dataclasses.replace(limits, **changes)

    @abstractmethod
    def build_job(self, problem: Problem, program: str, limits: Limits, *, all_cases: bool) -> Job:
        """The sandbox job that runs ``program`` against the problem's tests. ``all_cases``
        False (a binary reward) lets it stop at the first case that crashed or hit a limit."""

    def next_job(
        self, problem: Problem, jobs: Sequence[Job], results: Sequence[ExecutionResult]
    ) -> Job | None:
        """A further job that the results so far call for (an output checker), or None."""
        return None

    @abstractmethod
    def assess(
        self, problem: Problem, jobs: Sequence[Job], results: Sequence[ExecutionResult]
    ) -> Assessment:
        """The status, per-test results and excerpts of a sample from its jobs' results."""


class JudgedForm(Form):
    """A form whose one job's judge runs the tests (the verdict is the judge's outcomes)."""

    def assess(
        self, problem: Problem, jobs: Sequence[Job], results: Sequence[ExecutionResult]
    ) -> Assessment:
        return assess_judged(jobs[0], results[0])


_FORMS: Registry[Form] = Registry("test form", __name__)


def register(form: Form) -> Form:
    return _FORMS.register(form.name, form)


def forms() -> dict[str, Form]:
    """Every registered form by name (the built-in ones are this package's modules)."""
    return _FORMS.all()


def form_named(name: str) -> Form:
    return _FORMS[name]


def form_of(problem: Problem) -> Form:
    return form_named(problem.tests.form)


def tests_from(value: Any) -> FormTests:
    """A problem's ``tests``: a form's model as it is, or a mapping read by its ``form``."""
    if isinstance(value, FormTests):
        return value
    if not isinstance(value, Mapping) or "form" not in value:
        raise ValueError(f"tests must be an object with a 'form' ({', '.join(forms())})")
    return validated(form_named(str(value["form"])), value)


def split_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """Problem fields from a flat record (``test`` + ``entry_point``, ``test_list``, ``io``...):
    the fields of the one form whose marker it holds become its ``tests``."""
    known = sorted(forms().values(), key=lambda form: form.name)
    present = [form for form in known if form.marker in record]
    if len(present) != 1:
        markers = ", ".join(f"{form.marker} ({form.name})" for form in known)
        if not present:
            raise ValueError(f"no tests: expected one of {markers}")
        got = " and ".join(form.marker for form in present)
        raise ValueError(f"a problem needs tests in exactly one form: {markers}; it has {got}")
    (form,) = present
    own = set(form.tests_model.model_fields) - {"form"}
    tests = {key: value for key, value in record.items() if key in own}
    rest = {key: value for key, value in record.items() if key not in own}
    return {**rest, "tests": validated(form, {"form": form.name, **tests})}


def validated(form: Form, fields: Mapping[str, Any]) -> FormTests:
    """``fields`` as the form's tests; errors name the record's own fields."""
    try:
        return form.tests_model.model_validate(dict(fields))
    except ValidationError as exc:
        raise ValueError(describe_validation(exc)) from None


def without_none(fields: dict[str, Any], key: str) -> dict[str, Any]:
    """A form's dumped fields without ``key`` when it is None: a field added later leaves the
    records (and the fingerprints of the problem sets) that do not use it as they were."""
    if fields.get(key, 0) is None:
        del fields[key]
    return fields


def describe_validation(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in error["loc"])
        parts.append(f"field {field!r}: {message}" if field else message)
    return "; ".join(parts)
