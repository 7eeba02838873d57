"""One config mechanism for every command: a YAML file (``--config``) and dotted flags, both
read into the pydantic config classes that the Prefect form shows.

Every field of a command's config is a flag, named by its path: ``--launch.num-processes 2``,
``--stages.rl.update.learning-rate 1e-6`` (a stage of a run by its folder name, then a field of
its config), ``--evaluations.humaneval.sampling.max-tokens 256`` (an entry of a mapping by its
key), ``--stages.rl.update.advantage.lam 0.9`` (a field of the estimator in use). A flag sets
that one field over the YAML (or the command's default) and keeps every other as it was, then
the whole config is validated as the YAML and the form are. Values are read as YAML (``1e-6``,
``true``, ``null``, ``[1, 8]``), except for text fields, which take the text as it is; a
``bool`` flag alone is true and ``--no-<flag>`` false. Field names take ``-`` or ``_``.

A flag is derived from the classes rather than written for each command (TRL's ``TrlParser``
and prime-rl's dotted overrides do the same). pydantic-settings' CLI source derives flags too,
but stops at lists and mappings (a run's ``--stages`` would be one JSON value), which hold
nearly every setting of a run, and reads the environment unasked: this walker is ours.

Settings an earlier version spelled otherwise are refused naming the new spelling: a model
lists them in a ``renamed`` class variable (old field name -> new path).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
import textwrap
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

M = TypeVar("M", bound=BaseModel)
Flag = tuple[list[str], str | None]  # the path's segments as typed, the value (None: none)
_TRUTH = {"true", "false", "yes", "no", "on", "off", "1", "0"}
# A seed every library takes: numpy's and torch's stop at 2**32 - 1 (past it ``set_seed`` fails
# inside a stage, after the work before it).
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]


class SettingsError(ValueError):
    """Settings that cannot be read: the message names the file or the flag."""


def read_settings(path: Path, config_name: str) -> dict[str, Any]:
    """The mapping of settings in YAML file ``path``; ValueError names the file, and the line
    where it stops being YAML, so a command refuses it as bad input."""
    with path.open() as stream:  # read from the stream, yaml's messages name the file
        try:
            data = yaml.safe_load(stream) or {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of {config_name} settings")
    return data


def load_config(
    model: type[M], path: Path | None, flags: Sequence[Flag], default: M | None = None
) -> M:
    """``model`` from the YAML file ``path`` (or ``default``, or the model's defaults) with the
    ``flags`` set over it. Raises :class:`SettingsError` or pydantic's ``ValidationError``."""
    if path is not None:
        data = read_settings(path, model.__name__)
        check_renamed(data, model, source=f"{path}: ")
    else:
        data = {} if default is None else default.model_dump(exclude_unset=True)
    if not flags:
        return default if path is None and default is not None else model.model_validate(data)
    current = model.model_validate(data)  # the values a flag's neighbours keep
    for segments, value in flags:
        _set(data, current, ("model", model), segments, value, "--" + ".".join(segments))
        # the next flag keeps the values as this one left them (a preset's, say); a config
        # that some later flag completes (kl_in before kl_coef) is checked at the end
        with contextlib.suppress(ValidationError):
            current = model.model_validate(data)
    return model.model_validate(data)


# --------------------------------------------------------------------------------------------
# What a field holds: a model, the params of a registry entry, a list of stage entries, a
# mapping, or a value
# --------------------------------------------------------------------------------------------


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """``annotation`` without ``Annotated`` and ``| None``, and the metadata it carried."""
    metadata: list[Any] = []
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *extra = get_args(annotation)
            metadata += extra
        elif get_origin(annotation) in (Union, types.UnionType):
            args = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(args) != 1:
                return annotation, metadata
            annotation = args[0]
        else:
            return annotation, metadata


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _kind(annotation: Any, metadata: Sequence[Any] = ()) -> tuple[str, Any]:
    """("model", class), ("choice", chooser), ("entries", (members, tag)),
    ("mapping", value annotation) or ("value", annotation); ``metadata``: a field's (pydantic
    keeps a field's ``Annotated`` extras apart from its annotation)."""
    inner, extras = _unwrap(annotation)
    metadata = [*metadata, *extras]
    chooser = next((m for m in metadata if hasattr(m, "member")), None)
    if chooser is not None:  # e.g. an advantage estimator's params, picked by name
        return "choice", chooser
    if _is_model(inner):
        return "model", inner
    origin, args = get_origin(inner), get_args(inner)
    if origin is dict:
        return "mapping", args[1]
    if origin is list:
        item, item_metadata = _unwrap(args[0])
        members = [m for m in get_args(item) if _is_model(m)]
        tag = next((m.discriminator for m in item_metadata if isinstance(m, FieldInfo)), None)
        if members and tag:
            return "entries", (members, tag)
    return "value", annotation


def _of(field: FieldInfo) -> tuple[str, Any]:
    return _kind(field.annotation, field.metadata)


def _field(model: type[BaseModel], segments: list[str], flag: str) -> str:
    """The field of ``model`` that ``segments[0]`` names (``-`` or ``_``); else the error says
    what it was renamed to or which fields are close."""
    segment = segments[0]
    for name in (segment, segment.replace("-", "_")):
        if name in model.model_fields:
            return name
    name = segment.replace("-", "_")
    renamed = getattr(model, "renamed", {})
    if name in renamed:
        path, _, note = renamed[name].partition(" ")
        parent = flag.removesuffix(".".join(segments))  # "--stages.rl.update."
        raise SettingsError(
            f"{flag} is renamed: use {parent}{path.replace('_', '-')} {note}".strip()
        )
    close = difflib.get_close_matches(name, list(model.model_fields), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise SettingsError(f"{flag}: {model.__name__} has no setting {name!r}{hint}")


def _entry_key(entry: Any, tag: str) -> Any:
    return entry.get("name") or entry.get(tag) if isinstance(entry, dict) else entry


def _dump(value: Any) -> Any:
    """What a validated value looks like as settings: only the fields set (so the defaults
    that depend on other settings still follow them)."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    if isinstance(value, list):
        return [_dump(item) for item in value]
    if isinstance(value, dict):
        return {key: _dump(item) for key, item in value.items()}
    return value


# --------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------


def split_settings(argv: Sequence[str], model: type[BaseModel]) -> tuple[list[Flag], list[str]]:
    """The settings flags of ``argv`` (``--<a field of model>[.<more>] [VALUE]``) and the rest,
    for the command's own options."""
    flags: list[Flag] = []
    rest: list[str] = []
    items = list(argv)
    while items:
        item = items.pop(0)
        name, equals, value = item[2:].partition("=")
        negated = name.startswith("no-")
        segments = name.removeprefix("no-").split(".") if negated else name.split(".")
        if not item.startswith("--") or segments[0].replace("-", "_") not in model.model_fields:
            rest.append(item)
            continue
        if negated:
            flags.append((segments, "false"))
        elif equals:
            flags.append((segments, value))
        elif items and not items[0].startswith("--") and _takes(model, segments, items[0]):
            flags.append((segments, items.pop(0)))
        else:
            flags.append((segments, None))
    return flags, rest


def _takes(model: type[BaseModel], segments: list[str], word: str) -> bool:
    """Whether the flag at ``segments`` takes ``word`` as its value: a bool flag takes only
    yes/no words (``--greedy CHECKPOINT`` is a flag and a positional argument)."""
    field: FieldInfo | None = None
    node: tuple[str, Any] = ("model", model)
    for segment in segments:
        if node[0] != "model":
            return True
        field = node[1].model_fields.get(segment.replace("-", "_"))
        if field is None:
            return True
        node = _of(field)
    assert field is not None  # segments is never empty
    return _unwrap(field.annotation)[0] is not bool or word.lower() in _TRUTH


def _set(
    data: Any, value: Any, node: tuple[str, Any], segments: list[str], raw: str | None, flag: str
) -> None:
    """Set the setting at ``segments`` in ``data`` (settings, as YAML reads them), whose
    validated form is ``value`` and whose kind is ``node`` (:func:`_kind`): each level the path
    enters that ``data`` lacks is filled in from ``value``."""
    segment, rest = segments[0], segments[1:]
    kind, info = node
    annotation: Any
    if kind in ("model", "choice"):
        model = info if kind == "model" else info.member(data.get("name") or value.name)
        key: Any = _field(model, segments, flag)
        field = model.model_fields[key]
        child, annotation, node = getattr(value, key, None), field.annotation, _of(field)
    elif kind == "mapping":
        key, child, annotation = segment, (value or {}).get(segment), info
        node = _kind(info)
    elif kind == "entries":
        tag = info[1]
        names = [_entry_key(entry, tag) for entry in data]
        if segment not in names:
            raise SettingsError(f"{flag}: no stage named {segment!r} (the run has {names})")
        index = names.index(segment)
        if not isinstance(data[index], dict):
            data[index] = {tag: data[index]}
        if not rest:
            raise SettingsError(f"{flag}: name a setting of {segment}'s config")
        data, key = data[index], "config"
        child = value[index].config
        annotation = type(child)
        node = ("model", annotation)
    else:
        raise SettingsError(f"{flag}: {segments[0]} has no settings under it")
    if not rest:
        value = _parse(raw, annotation, flag)
        if node[0] == "model" and not isinstance(value, dict):
            first = next(iter(node[1].model_fields)).replace("_", "-")
            raise SettingsError(f"{flag} holds settings: set one, e.g. {flag}.{first}")
        data[key] = value
        return
    if not isinstance(data.get(key), dict | list):
        data[key] = _dump(child) if child is not None else {}
    _set(data[key], child, node, rest, raw, flag)


def _parse(raw: str | None, annotation: Any, flag: str) -> Any:
    """A flag's value: text for a text field, else YAML (a bool flag alone is true); one value
    for a list field is a list of one (``--report-to tensorboard``)."""
    if raw is None:
        return True
    inner, _ = _unwrap(annotation)
    options = get_args(inner) if get_origin(inner) in (Union, types.UnionType) else (inner,)
    texts = any(o is str or get_origin(o) is Literal or o is Path for o in options)
    if texts and not raw.startswith(("[", "{")) and raw not in ("null", "~"):
        return raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{flag}: {raw!r} is not a YAML value ({exc})") from None
    if get_origin(inner) is list and value is not None and not isinstance(value, list):
        return [value]
    return value


# --------------------------------------------------------------------------------------------
# Nested settings given in part
# --------------------------------------------------------------------------------------------


class Settings(BaseModel):
    """A config class whose nested settings, given in part, keep the rest at *its* defaults.

    RL scores with format and syntax weights of its own (``ScoreConfig``'s are 0); YAML, a
    Prefect form or a Python dict that gives ``scoring: {sandbox: {...}}`` alone keeps RL's
    weights, where pydantic alone would build a fresh ``ScoreConfig`` and drop them. A nested
    class lists in ``starts_anew_with`` the fields that name a different thing (a problem
    set's ``source``): given one, the rest are that class's own defaults (another source does
    not inherit MBPP's split). Only plain nested models merge: a mapping, a list or a choice
    among classes (an advantage estimator) is taken as given, and so is a model instance built
    in Python."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    starts_anew_with: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _nested_settings_keep_these_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        merged = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if field is None or not isinstance(value, dict) or _of(field)[0] != "model":
                continue
            try:
                default = field.get_default(call_default_factory=True)
            except ValueError:  # a default computed from the other fields
                continue
            if isinstance(default, BaseModel):
                merged[name] = _over(_of(field)[1], default.model_dump(exclude_unset=True), value)
        return merged


def _over(model: type[BaseModel], default: dict[str, Any], given: dict[str, Any]) -> dict:
    """``given`` over ``default`` (the fields a default set), into nested models too."""
    if any(name in given for name in getattr(model, "starts_anew_with", ())):
        return given
    merged = {**default, **given}
    for name, value in given.items():
        field = model.model_fields.get(name)
        if field is None or not (isinstance(value, dict) and isinstance(default.get(name), dict)):
            continue
        kind, nested = _of(field)
        if kind == "model":
            merged[name] = _over(nested, default[name], value)
    return merged


# --------------------------------------------------------------------------------------------
# Spellings of earlier versions
# --------------------------------------------------------------------------------------------


def check_renamed(data: Any, annotation: Any, source: str = "") -> None:
    """Refuse a setting an earlier version spelled otherwise, naming its new spelling;
    ``source`` starts the message (the file)."""
    _check_renamed(data, _kind(annotation), "", source)


def _check_renamed(data: Any, node: tuple[str, Any], where: str, source: str) -> None:
    kind, info = node
    if kind == "mapping" and isinstance(data, dict):
        for key, item in data.items():
            _check_renamed(item, _kind(info), f"{where}{key}.", source)
        return
    if kind == "entries" and isinstance(data, list):
        members, tag = info
        for index, entry in enumerate(data):
            member = next((m for m in members if _tag(m, tag) == _entry_key(entry, tag)), None)
            if isinstance(entry, dict) and member is not None:
                _check_renamed(entry, ("model", member), f"{where.rstrip('.')}[{index}].", source)
        return
    if kind not in ("model", "choice") or not isinstance(data, dict):
        return
    try:
        model = info if kind == "model" else info.member(data.get("name"))
    except (ValueError, KeyError):
        return  # an unknown name: the validation names it
    renamed = getattr(model, "renamed", {})
    for key, item in data.items():
        if key in model.model_fields:
            _check_renamed(item, _of(model.model_fields[key]), f"{where}{key}.", source)
        elif key in renamed:
            raise SettingsError(f"{source}{where}{key} is renamed: use {where}{renamed[key]}")


def _tag(member: type[BaseModel], tag: str) -> Any:
    """The value of ``member``'s tag field: its ``Literal``."""
    (value,) = get_args(member.model_fields[tag].annotation)
    return value


# --------------------------------------------------------------------------------------------
# --help
# --------------------------------------------------------------------------------------------


def settings_help(model: type[BaseModel], width: int = 100) -> str:
    """Every setting of ``model`` as its flag, type, description and default: a model met
    again (every stage has a ``model``) is named once and referred to after."""
    lines: list[str] = []
    _describe(model, "", lines, {}, width)
    return "\n".join(lines)


def setting_flags(model: type[BaseModel]) -> list[str]:
    """Every flag :func:`settings_help` lists (sections of models met again as ``PATH.*``)."""
    return re.findall(r"^  (--[^\s*]+)", settings_help(model, width=10_000), flags=re.MULTILINE)


def _describe(
    model: type[BaseModel], prefix: str, lines: list[str], seen: dict[type, str], width: int
) -> None:
    for name, field in model.model_fields.items():
        flag = prefix + name.replace("_", "-")
        kind, info = _of(field)
        if kind == "model" and info in seen:
            lines.append(f"  --{flag}.*  as --{seen[info]}.* ({info.__name__})")
        elif kind == "model":
            seen[info] = flag
            _describe(info, flag + ".", lines, seen, width)
        elif kind == "choice":
            _line(lines, f"--{flag}.name", _choices(info.members()), field, width)
            for member in info.members():
                for key, param in member.model_fields.items():
                    if key != "name":
                        described = param.description or ""
                        param = FieldInfo.merge_field_infos(
                            param, description=f"({_tag(member, 'name')}) {described}"
                        )
                        _line(lines, f"--{flag}.{key.replace('_', '-')}", None, param, width)
        elif kind == "entries":
            members, tag = info
            for member in sorted(members, key=lambda member: _tag(member, tag)):
                stage = _tag(member, tag)
                lines.append(
                    f"  --{flag}.{stage}.*  the config of the stage named {stage} (its name, else its stage)"
                )
                _describe(member.model_fields["config"].annotation, f"{flag}.{stage}.", lines,
                          seen, width)  # fmt: skip
        elif kind == "mapping" and _is_model(_unwrap(info)[0]):
            value_model = _unwrap(info)[0]
            about = f"{field.description or ''} (KEY: each a {value_model.__name__})"
            lines.extend(
                textwrap.wrap(f"  --{flag}.KEY.*  {about}", width, subsequent_indent=" " * 6)
            )
            _describe(value_model, f"{flag}.KEY.", lines, seen, width)
        elif kind == "mapping":
            _line(lines, f"--{flag}.KEY", _type_name(info), field, width)
        else:
            _line(lines, f"--{flag}", None, field, width)


def _choices(members: Sequence[type[BaseModel]]) -> str:
    return "{" + ",".join(str(_tag(m, "name")) for m in members) + "}"


def _line(lines: list[str], flag: str, kind: str | None, field: FieldInfo, width: int) -> None:
    words = [field.description or ""]
    default = _default(field)
    if default is not None:
        words.append(f"(default: {default})")
    head = f"  {flag} {kind or _type_name(field.annotation)}"
    text = " ".join(word for word in words if word)
    lines.extend(
        textwrap.wrap(
            f"{head}  {text}", width=width, subsequent_indent=" " * 6, break_on_hyphens=False
        )
        or [head]
    )


def _default(field: FieldInfo) -> str | None:
    if field.default_factory is not None:
        if field.default_factory_takes_validated_data:
            return None  # it follows other settings: the description says which
        value = field.default_factory()  # type: ignore[call-arg]
        return None if isinstance(value, BaseModel) else json.dumps(value, default=str)
    return None if field.is_required() else json.dumps(field.default, default=str)


def _type_name(annotation: Any) -> str:
    inner, _ = _unwrap(annotation)
    origin, args = get_origin(inner), get_args(inner)
    if origin is Literal:
        return "{" + ",".join(str(arg) for arg in args) + "}"
    if origin in (Union, types.UnionType):
        return "|".join(_type_name(arg) for arg in args if arg is not type(None))
    if origin in (list, tuple):
        return f"[{_type_name(args[0])},...]"
    if origin is dict:
        return f"{{KEY: {_type_name(args[1])}}}"
    names = {bool: "BOOL", int: "INT", float: "FLOAT", str: "TEXT"}
    optional = annotation is not inner and type(None) in get_args(annotation)
    name = names.get(inner, getattr(inner, "__name__", str(inner)).upper())
    return f"{name}|null" if optional else name
