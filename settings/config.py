"""One config mechanism for every command: a YAML file (``--config``) and dotted flags, both
read into the pydantic config classes that the Prefect form shows.

Every field of a command's config is a flag, named by its path: ``--launch.num-processes 2``,
``--stages.rl.update.learning-rate 1e-6`` (a stage of a run by its folder name, then a field of
its config), ``--evaluations.humaneval.sampling.max-tokens 256`` (an entry of a mapping by its
key), ``--stages.rl.update.advantage.lam 0.9`` (a field of the estimator in use). A flag adds a
mapping's entry only by giving it whole (``--stages.rl.scoring.reward.weights.length 0.5``,
``--evaluations.mbpp '{problems: {source: mbpp}}'``): a path into an entry the config lacks
(``--evaluations.humaneavl.sampling.max-tokens``) is a typo, refused with the keys there are. A flag sets
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
import textwrap
import types
from collections.abc import Sequence
from dataclasses import dataclass
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


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last
    without a word: a setting written twice is a setting lost)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` overrides by design
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in lines:
                raise SettingsError(f"{key!r} is given twice, on lines {lines[key]} and {line}")
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def read_settings(path: Path, config_name: str) -> dict[str, Any]:
    """The mapping of settings in YAML file ``path``; ValueError names the file, and the line
    where it stops being YAML (or gives a key twice), so a command refuses it as bad input."""
    with path.open() as stream:  # read from the stream, yaml's messages name the file
        try:
            data = yaml.load(stream, Loader=_UniqueKeys) or {}  # a SafeLoader
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path} is not valid YAML: {exc}") from exc
        except SettingsError as exc:
            raise SettingsError(f"{path}: {exc}") from None
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
    if not flags and path is None and default is not None:
        return default
    try:
        current = model.model_validate(data)  # the values a flag's neighbours keep
        for segments, value in flags:
            _set(data, current, ("model", model), segments, value, "--" + ".".join(segments))
            # the next flag keeps the values as this one left them (a preset's, say); a config
            # that some later flag completes (kl_in before kl_coef) is checked at the end
            with contextlib.suppress(ValidationError):
                current = model.model_validate(data)
        return model.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(explain(exc, model, data, flags, path)) from None


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
        if node[0] == "model" and isinstance(child, node[1]):  # an entry of its own model
            node = ("model", type(child))  # (a reward term's settings)
        if rest and key not in (data or {}):
            raise SettingsError(_no_entry(flag, segments, list(data or {})))
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


def _no_entry(flag: str, segments: list[str], keys: list[str]) -> str:
    """The refusal of a flag into a mapping's entry that is not there: its keys, the closest."""
    mapping = flag.removesuffix("." + ".".join(segments))
    close = difflib.get_close_matches(segments[0], keys, n=1)
    hint = f"; did you mean {mapping}.{close[0]}.{'.'.join(segments[1:])}?" if close else ""
    return (
        f"{flag}: {mapping} has no entry {segments[0]!r} (it has {', '.join(keys) or 'none'})"
        f"{hint} A new entry is given whole: {mapping}.{segments[0]} '{{...}}'"
    )


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
# Errors: each names the flag, or the YAML key and its line, and the value
# --------------------------------------------------------------------------------------------


def explain(
    exc: ValidationError,
    model: type[BaseModel],
    data: dict[str, Any],
    flags: Sequence[Flag],
    path: Path | None,
) -> str:
    """pydantic's errors for ``data`` (the YAML of ``path``, or a default, with ``flags`` set
    over it), one line each, naming the flag that gave the value, else the key and its line in
    the file; an unknown key with the settings spelled like it."""
    given = {_normal(segments): ("--" + ".".join(segments), raw) for segments, raw in flags}
    lines = []
    # a default computed from a field that failed adds nothing to that field's own error
    errors = [e for e in exc.errors() if e["type"] != "default_factory_not_called"]
    for error in errors or exc.errors():
        keys, flag_path, parent = _located(model, data, error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and parent is not None:
            close = difflib.get_close_matches(str(keys[-1]), list(parent.model_fields), n=3)
            message = f"{parent.__name__} has no such setting" + (
                f"; did you mean {', '.join(close)}?" if close else ""
            )
        # the flag that set this value (or a section holding it); an error of a section names
        # the one flag inside it only where nothing else set that section (no file)
        here = _normal(flag_path)
        holding = [f for f in given if here[: len(f)] == f]
        inside = [f for f in given if f[: len(here)] == here]
        named = holding or (inside if path is None and len(inside) == 1 else [])
        if here and named:
            flag, raw = given[max(named, key=len)]
            lines.append(f"{flag}{'' if raw is None else ' ' + raw}: {message}")
            continue
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys).lstrip(".")
        # the value, where it is one (not a section, whose own field the message names)
        shown = error["type"] != "extra_forbidden" and keys and not isinstance(error["input"], dict)
        value = f" = {error['input']!r}" if shown else ""
        source = f"{path}, line {_yaml_line(path, keys)}" if path is not None and keys else path
        lines.append(": ".join(str(part) for part in (source, where + value, message) if part))
    return "\n".join(lines)


def _located(
    model: type[BaseModel], data: Any, loc: tuple[Any, ...]
) -> tuple[list[Any], list[str], type[BaseModel] | None]:
    """An error's place: the keys that reach it in the settings as written (``stages``, 1,
    ``config``, ...), its flag's path (``stages``, ``rl``, ...), and the model whose field
    (or unknown key) the last key is."""
    keys: list[Any] = []
    flag: list[str] = []
    node: tuple[str, Any] = ("model", model)
    parent: type[BaseModel] | None = None
    entry: type[BaseModel] | None = None  # the model of a stage entry met last
    items = list(loc)
    while items:
        item = items.pop(0)
        kind, info = node
        if kind in ("model", "choice") and isinstance(item, str):
            try:
                model = info if kind == "model" else info.member((data or {}).get("name"))
            except (KeyError, ValueError):
                return [*keys, item], flag, None
            parent = model
            keys.append(item)
            if not (item == "config" and model is entry):
                flag.append(item)  # a stage's config has no segment: --stages.rl.iterations
            field = model.model_fields.get(item)
            if field is None:
                return keys, flag, parent
            node, data = _of(field), (data or {}).get(item)
        elif kind == "mapping" and isinstance(item, str):
            keys.append(item)
            flag.append(item)
            node, data = _kind(info), (data or {}).get(item)
        elif kind == "entries" and isinstance(item, int) and isinstance(data, list):
            members, tag = info
            given = data[item] if item < len(data) else None
            keys.append(item)
            flag.append(str(_entry_key(given, tag)))
            tags = {_tag(member, tag): member for member in members}
            if not items or items[0] not in tags:
                return keys, flag, None
            entry = tags[items.pop(0)]  # pydantic names the union's member: no key of the YAML
            node, data = ("model", entry), given if isinstance(given, dict) else {tag: given}
        else:  # inside a value (an item of a list, a member of a union): no flag of its own
            return keys + [item] * isinstance(item, int), flag, parent
    return keys, flag, parent


def _normal(segments: Sequence[str]) -> tuple[str, ...]:
    return tuple(segment.replace("-", "_") for segment in segments)


def _yaml_line(path: Path, keys: list[Any]) -> int:
    """The line of ``path`` where ``keys`` lead (as far as the file has them)."""
    node = yaml.compose(path.read_text(), Loader=yaml.SafeLoader)
    line = 1
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if k.value == str(key)]
            if not found:
                break
            line, node = found[0][0].start_mark.line + 1, found[0][1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


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


@dataclass(frozen=True)
class _Setting:
    """A line of the settings' help: a flag (or a section met before: ``PATH.*``) in its
    group (``""``: the config's own fields; ``model``, ``stages.rl``, ``evaluations.KEY``)."""

    group: str
    flag: str
    kind: str
    text: str


def settings_help(model: type[BaseModel], width: int = 100, every: bool = False) -> str:
    """``model``'s settings as flags with their type, description and default, each flag once,
    grouped by section (the model's own fields, then each section, stage and mapping entry);
    without ``every``, a section is one line. A model met again (every stage has a ``model``) is
    listed once and referred to after."""
    settings = _settings(model, "", "", {})
    groups: dict[str, list[_Setting]] = {}
    for setting in settings:
        groups.setdefault(setting.group, []).append(setting)
    lines: list[str] = []
    for group, members in groups.items():
        if group and not every:
            lines += _wrapped(f"--{group}.*", "", _group_titles(model).get(group, ""), width)
            continue
        if group:
            lines.append(f"{group}: {_group_titles(model).get(group, '')}".rstrip(": "))
        for member in members:
            lines += _wrapped(member.flag, member.kind, member.text, width)
    return "\n".join(lines)


def setting_flags(model: type[BaseModel]) -> list[str]:
    """Every flag :func:`settings_help` lists (not the sections met before, ``PATH.*``)."""
    return [s.flag for s in _settings(model, "", "", {}) if not s.flag.endswith(".*")]


def _wrapped(flag: str, kind: str, text: str, width: int) -> list[str]:
    head = f"  {flag} {kind}".rstrip()
    return textwrap.wrap(
        f"{head}  {text}".rstrip(), width, subsequent_indent=" " * 6, break_on_hyphens=False
    ) or [head]


def _group_titles(model: type[BaseModel]) -> dict[str, str]:
    """Each group of ``model``'s settings -> what it is (a field's description, a stage's)."""
    titles: dict[str, str] = {}
    for name, field in model.model_fields.items():
        kind, info = _of(field)
        flag = name.replace("_", "-")
        if kind == "model":
            titles[flag] = field.description or (info.__doc__ or "").split("\n")[0]
        elif kind == "entries":
            for member in info[0]:
                stage = _tag(member, info[1])
                titles[f"{flag}.{stage}"] = f"the stage named {stage}: {member.__doc__ or ''}"
        elif kind == "mapping" and _is_model(_unwrap(info)[0]):
            titles[f"{flag}.KEY"] = field.description or ""
    return titles


def _settings(
    model: type[BaseModel], prefix: str, group: str, seen: dict[type, str]
) -> list[_Setting]:
    """``model``'s settings under ``prefix``, in ``group`` (a field of the top model starts
    its own)."""
    found: list[_Setting] = []
    for name, field in model.model_fields.items():
        flag = prefix + name.replace("_", "-")
        kind, info = _of(field)
        own = group or (flag if kind in ("model", "choice") and not prefix else "")
        if kind == "model" and info in seen:
            found.append(_Setting(own, f"--{flag}.*", "", f"as --{seen[info]}.* ({info.__name__})"))
        elif kind == "model":
            seen[info] = flag
            found += _settings(info, flag + ".", own, seen)
        elif kind == "choice":
            found += _choice_settings(own, flag, field, info)
        elif kind == "entries":
            members, tag = info
            for member in sorted(members, key=lambda member: _tag(member, tag)):
                stage = f"{flag}.{_tag(member, tag)}"
                config = member.model_fields["config"].annotation
                found += _settings(config, stage + ".", stage, seen)
        elif kind == "mapping" and _is_model(_unwrap(info)[0]):
            found += _settings(_unwrap(info)[0], f"{flag}.KEY.", f"{flag}.KEY", seen)
        elif kind == "mapping":
            found.append(_Setting(group, f"--{flag}.KEY", _type_name(info), _about(field)))
        else:
            found.append(_Setting(group, f"--{flag}", _type_name(field.annotation), _about(field)))
    return found


def _choice_settings(group: str, flag: str, field: FieldInfo, chooser: Any) -> list[_Setting]:
    """A choice among classes (an estimator): its name, then each hyperparameter once, with
    what it is in each class that has it (``eps``: grpo's, reinforce++'s, ...)."""
    found = [_Setting(group, f"--{flag}.name", _choices(chooser.members()), _about(field))]
    params: dict[str, dict[str, list[str]]] = {}  # key -> its text -> the classes
    kinds: dict[str, str] = {}
    for member in chooser.members():
        for key, param in member.model_fields.items():
            if key != "name":
                params.setdefault(key, {}).setdefault(_about(param), []).append(
                    str(_tag(member, "name"))
                )
                kinds.setdefault(key, _type_name(param.annotation))
    for key, texts in params.items():
        text = "; ".join(f"({', '.join(tags)}) {about}" for about, tags in texts.items())
        found.append(_Setting(group, f"--{flag}.{key.replace('_', '-')}", kinds[key], text))
    return found


def _about(field: FieldInfo) -> str:
    """A field's description and default."""
    default = _default(field)
    return " ".join(
        word for word in (field.description or "", default and f"(default: {default})") if word
    )


def _choices(members: Sequence[type[BaseModel]]) -> str:
    return "{" + ",".join(str(_tag(m, "name")) for m in members) + "}"


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
