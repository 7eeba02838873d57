"""The site's reference pages, generated from the package when the site is built (an mkdocs
hook, named in ``mkdocs.yml``), so they cannot drift from the code: the registered stages, the
RL algorithms, the RL metric names and every config field.

Each page is one function in :data:`PAGES` that returns markdown; a new registry is one more
function and one more line there (and its page in the nav). Tables are built from the
registries and the pydantic models as imported, never from copied lists.
"""

from __future__ import annotations

import ast
import enum
import inspect
import json
import re
import textwrap
import types
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from codepost.pipeline.data.rows import RolloutRow, ScoredRow
from codepost.pipeline.inference.server import SampleServerConfig
from codepost.pipeline.post_train import PostTrainConfig
from codepost.pipeline.rl import algorithms, metric_names
from codepost.pipeline.stages import STAGES
from codepost.verifiers.env_server import EnvServerConfig
from codepost.verifiers.gym_server import GymServerConfig
from codepost.verifiers.server.config import ServerConfig
from codepost.verifiers.verdicts import VerdictStatus
from codepost.verifiers.verify_command import VerifyConfig

GENERATED = (
    "This page is generated from the code when the site is built (`docs/hooks/reference.py`)."
)


# --------------------------------------------------------------------------------------------
# Markdown pieces
# --------------------------------------------------------------------------------------------


def prose(text: str | None) -> str:
    """A docstring or description as markdown: reST's ``code`` and :role:`x` become `code`."""
    text = inspect.cleandoc(text or "")
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def cell(text: str) -> str:
    """``text`` fit for one table cell: one line, pipes escaped, ``<`` outside code escaped."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def code(value: Any) -> str:
    return f"`{value}`"


def value(data: Any) -> str:
    """A default or a setting as it is written in a YAML config (JSON is YAML too); a model
    inside it shows only the fields that differ from its defaults."""
    return code(json.dumps(plain(data)))


def plain(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json", exclude_defaults=True)
    if isinstance(data, Mapping):
        return {key: plain(item) for key, item in data.items()}
    if isinstance(data, list | tuple):
        return [plain(item) for item in data]
    return to_jsonable_python(data)


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


# --------------------------------------------------------------------------------------------
# pydantic models: types, defaults, descriptions
# --------------------------------------------------------------------------------------------


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's type names, in order (inside unions, lists, dicts...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in models_in(arg)]


def type_name(annotation: Any, linked: bool = True) -> str:
    """A field's type as users write it; models link to their section of the config page."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return code("null")
    if origin is Annotated:
        return type_name(args[0], linked)
    if origin is Literal:
        return " | ".join(value(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg, linked) for arg in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(value(member.value) for member in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        name = annotation.__name__
        return f"[{name}](config.md#{anchor(annotation)})" if linked else code(name)
    if origin is not None:
        inner = ", ".join(type_name(arg, linked) for arg in args if arg is not Ellipsis)
        return f"{code(getattr(origin, '__name__', origin))} of {inner}" if inner else code(origin)
    return code(getattr(annotation, "__name__", annotation))


BOUNDS = {  # annotated_types' constraint -> how it reads, the attribute holding its number
    annotated_types.Gt: (">", "gt"),
    annotated_types.Ge: ("≥", "ge"),
    annotated_types.Lt: ("<", "lt"),
    annotated_types.Le: ("≤", "le"),
    annotated_types.MinLen: ("length ≥", "min_length"),
    annotated_types.MaxLen: ("length ≤", "max_length"),
}


def bounds(field: FieldInfo) -> str:
    """The field's constraints (``≥ 1, ≤ 100``, a pattern)."""
    found = []
    for rule in field.metadata:
        for kind, (sign, attribute) in BOUNDS.items():
            if isinstance(rule, kind):
                found.append(f"{sign} {getattr(rule, attribute)}")
        if getattr(rule, "pattern", None):
            found.append(f"matches {code(rule.pattern)}")
    return ", ".join(found)


def default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    data = field.get_default(call_default_factory=True, validated_data={})
    if isinstance(data, BaseModel):
        changed = plain(data)
        return f"{code(type(data).__name__)} defaults" + (
            f", with {value(changed)}" if changed else ""
        )
    return value(data)


@cache
def source_comments(model: type[BaseModel]) -> dict[str, str]:
    """Comments beside a model's fields in its source (and its bases'): the description of a
    field that has no ``description``."""
    comments: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        if klass is BaseModel or not issubclass(klass, BaseModel):
            continue
        comments |= assignment_comments(klass)
    return comments


def assignment_comments(klass: type) -> dict[str, str]:
    """``name -> comment`` for each assignment in a class body that ends in a ``# comment``."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # made at run time (create_model): no source
        return {}
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        target = getattr(node, "target", None) or next(iter(getattr(node, "targets", [])), None)
        line = lines[node.end_lineno - 1]
        if isinstance(target, ast.Name) and "#" in line:
            found[target.id] = line.split("#", 1)[1].strip()
    return found


def registry_choice(field: FieldInfo) -> Any:
    """The registry choice of a field that holds one registered entry's hyperparameters (an
    advantage estimator's, a policy loss's), picked by their ``name``; else None."""
    return next((rule for rule in field.metadata if hasattr(rule, "members")), None)


def chosen_names(chooser: Any) -> str:
    """The hyperparameter models a registry choice takes, each linked to its section."""
    return " | ".join(
        f"[{member.__name__}](algorithms.md#{anchor(member)})" for member in chooser.members()
    )


def field_rows(model: type[BaseModel], skip: Iterable[str] = ()) -> list[list[str]]:
    rows = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        chooser = registry_choice(field)
        kind = chosen_names(chooser) if chooser else type_name(field.annotation)
        limits = bounds(field)
        description = field.description or source_comments(model).get(name, "")
        rows.append(
            [
                code(name),
                kind + (f" ({limits})" if limits else ""),
                default(field),
                prose(description),
            ]
        )
    return rows


def model_section(model: type[BaseModel], level: str = "##", skip: Iterable[str] = ()) -> str:
    """A model's heading, import path, docstring and fields (but those in ``skip``)."""
    where = code(f"{model.__module__}.{model.__qualname__}")
    parts = [f"{level} {model.__name__}", where, prose(model.__doc__)]
    if set(model.model_fields) - set(skip):
        header = ["field", "type", "default", "description"]
        parts.append(table(header, field_rows(model, skip)))
    return "\n\n".join(part for part in parts if part)


def reachable_models(*roots: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model reachable from ``roots`` through their fields, breadth first, once each."""
    order: list[type[BaseModel]] = []
    queue = list(roots)
    while queue:
        model = queue.pop(0)
        if model in order:
            continue
        order.append(model)
        for field in model.model_fields.values():
            if registry_choice(field) is None:  # those are on the algorithms page
                queue += models_in(field.annotation)
    names = [model.__name__ for model in order]
    clashes = {name for name in names if names.count(name) > 1}
    if clashes:
        raise ValueError(f"config models share a name (their anchors would clash): {clashes}")
    return order


# --------------------------------------------------------------------------------------------
# The pages
# --------------------------------------------------------------------------------------------


def config_page() -> str:
    models = reachable_models(
        PostTrainConfig,
        SampleServerConfig,
        VerifyConfig,
        ServerConfig,
        EnvServerConfig,
        GymServerConfig,
    )
    intro = f"""# Configuration reference

{GENERATED} Every model here is a pydantic model: the same one reads the YAML file of
`codepost run --config`, checks the command line and renders Prefect's parameter form. Unknown
keys are refused, naming the field. A nested model's default is its own defaults (its section
below) unless the table says which fields differ.

A run's config is a [PostTrainConfig](#posttrainconfig); each item of its `stages` is a stage's
name alone or `{{stage, name, config}}`, whose `config` is the stage's own model:

{table(["stage", "config"], ([code(s.name), type_name(s.config)] for s in STAGES.values()))}

`codepost sample-server --config FILE` reads a [SampleServerConfig](#sampleserverconfig),
`codepost verify` a [VerifyConfig](#verifyconfig) (the fields it shares with `verify-server`'s
`POST /verify` request and the HTTP client are one model, `VerifyOptions`), `codepost
verify-server` a [ServerConfig](#serverconfig), `codepost env-server` an
[EnvServerConfig](#envserverconfig) and `codepost gym-server` a
[GymServerConfig](#gymserverconfig); each field is also a flag of its command."""
    return "\n\n".join([intro, *(model_section(model) for model in models)]) + "\n"


def stages_page() -> str:
    def kinds(names: Iterable[str]) -> str:
        return ", ".join(code(name) for name in names) or "-"

    rows = (
        [
            code(stage.name),
            stage.description,
            kinds(stage.needs),
            kinds(stage.uses),
            kinds(stage.makes),
            "yes" if stage.accelerator else "no",
            "yes" if stage.multi_process else "no",
            type_name(stage.config),
        ]
        for stage in STAGES.values()
    )
    header = [
        "stage",
        "what it does",
        "needs",
        "uses if made",
        "makes",
        "accelerator",
        "rank-aware",
        "config",
    ]
    extendable = [
        f"`{stage.name}`: {kinds(stage.extendable)}"
        for stage in STAGES.values()
        if stage.extendable
    ]
    return f"""# Stages

{GENERATED} Every module of `pipeline/stages/` registers one stage
(`pipeline/stages/registry.py`); a run is an ordered list of them (see
[Stages and resuming](../stages.md)).

{table(header, rows)}

*needs*: artifacts an earlier stage must make (a run without them is refused before it starts);
*uses if made*: artifacts it takes when an earlier stage made them; *accelerator*: it runs in
the stage worker, on the GPU where there is one; *rank-aware*: it runs on N processes with
`--launch.num-processes N`.

Config fields that only add work, left out of the output's key (more of them continue the same
folder): {"; ".join(extendable)}.
"""


def settings(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{code(name)} = {value(data)}" for name, data in values.items()) or "-"


def hyperparameters(params: type[BaseModel]) -> str:
    fields = params.model_fields.items()
    return ", ".join(
        f"{code(name)} (required)" if field.is_required() else f"{code(name)} = {default(field)}"
        for name, field in fields
    )


def algorithms_page() -> str:
    presets = (
        [
            code(name),
            code(preset.advantage.name),
            code(preset.policy_loss.name),
            "yes" if algorithms.ADVANTAGE_ESTIMATORS[preset.advantage.name].needs_critic else "no",
            settings(preset.advantage.model_dump(exclude={"name"})),
            settings(preset.policy_loss.model_dump(exclude={"name"})),
            settings(
                {"loss_agg_mode": preset.loss_agg_mode, "mask_truncated": preset.mask_truncated}
            ),
            preset.description,
        ]
        for name, preset in algorithms.ALGORITHMS.items()
    )
    estimators = (
        [code(name), prose(entry.fn.__doc__).split("\n\n")[0], hyperparameters(entry.params)]
        for name, entry in algorithms.ADVANTAGE_ESTIMATORS.items()
    )
    losses = (
        [
            code(name),
            prose(entry.fn.__doc__).split("\n\n")[0],
            code(entry.ratio_level),
            hyperparameters(entry.params),
        ]
        for name, entry in algorithms.POLICY_LOSSES.items()
    )
    params = {entry.params for entry in algorithms.ADVANTAGE_ESTIMATORS.values()}
    params |= {entry.params for entry in algorithms.POLICY_LOSSES.values()}
    params.discard(algorithms.Hyperparameters)
    sections = [
        model_section(model, "###") for model in sorted(params, key=lambda model: model.__name__)
    ]
    return f"""# Algorithms

{GENERATED} The three registries of `pipeline/rl/algorithms.py` (see
[Algorithms](../algorithms.md)): `UpdateConfig.algorithm` names a preset; `advantage` and
`policy_loss` (each `{{name: ..., <its hyperparameters>}}`) replace what it fills in.

## Presets (`ALGORITHMS`)

{table(["algorithm", "estimator", "loss", "critic", "estimator hyperparameters", "loss hyperparameters", "update settings", "description"], presets)}

Update settings are defaults of [UpdateConfig](config.md#updateconfig) fields; fields set there win.

## Advantage estimators (`ADVANTAGE_ESTIMATORS`)

{table(["estimator", "what it computes", "hyperparameters (defaults)"], estimators)}

## Policy losses (`POLICY_LOSSES`)

{table(["loss", "what it computes", "ratio", "hyperparameters (defaults)"], losses)}

## Hyperparameter models

{chr(10).join(chr(10) + section for section in sections)}
"""


def metrics_page() -> str:
    """From ``metric_names``: each namespace's names, with the comments beside them."""
    namespaces = [
        klass
        for klass in vars(metric_names).values()
        if inspect.isclass(klass) and klass.__module__ == metric_names.__name__
    ]
    sections, listed = [], {metric_names.ITERATION}
    for klass in namespaces:
        names = {
            key: name
            for key, name in vars(klass).items()
            if key.isupper() and isinstance(name, str)
        }
        comments = assignment_comments(klass)
        rows = [[code(name), comments.get(key, "")] for key, name in names.items()]
        prefix = next(iter(names.values())).split("/")[0]
        sections.append(f"## `{prefix}/`\n\n{table(['metric', 'meaning'], rows)}\n")
        listed |= set(names.values())
    if metric_names.DECLARED - listed:
        unlisted = sorted(metric_names.DECLARED - listed)
        raise ValueError(f"metrics outside a namespace class of metric_names: {unlisted}")
    statuses = ", ".join(code(status.value) for status in VerdictStatus)
    families = [
        [
            code(metric_names.reward_component("<component>")),
            prose(metric_names.reward_component.__doc__),
        ],
        [
            code(metric_names.status_count("<status>")),
            f"{prose(metric_names.status_count.__doc__)} Statuses: {statuses}.",
        ],
        [
            code(metric_names.staleness_count("<k>")),
            prose(metric_names.staleness_count.__doc__),
        ],
        [
            code(metric_names.loss_metric("<name>")),
            prose(metric_names.loss_metric.__doc__),
        ],
    ]
    maxima = ", ".join(code(name) for name in sorted(metric_names.MAXIMA))
    return f"""# RL metrics

{GENERATED} From `pipeline/rl/metric_names.py`; `{metric_names.ITERATION}` is the x axis of
every curve (1-based).

{prose(metric_names.__doc__)}

{"".join(sections)}
## Named at run time

{table(["metric", "meaning"], families)}

Over an update's optimizer steps, {maxima} take the largest value; the others the mean.
"""


def rows_page() -> str:
    return f"""# Rollout rows

{GENERATED} One row per completion, in Parquet (`pipeline/data/rows.py`): the samplers write
`RolloutRow`s, scoring adds the columns of `ScoredRow`, and each reward component is a column
of its own, `reward_<component>`. The Parquet schema is derived from these models, and every
stage reads and writes the files through `read_rows` / `write_rows`, which name the file, the
column and the row that break it.

{model_section(RolloutRow)}

{model_section(ScoredRow, skip=RolloutRow.model_fields)}

`ScoredRow` has every column of `RolloutRow` too.
"""


PAGES: Mapping[str, Callable[[], str]] = {
    "reference/config.md": config_page,
    "reference/stages.md": stages_page,
    "reference/algorithms.md": algorithms_page,
    "reference/metrics.md": metrics_page,
    "reference/rows.md": rows_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, page in PAGES.items():
        files.append(File.generated(config, path, content=page()))
    return files
