"""The configuration reference, generated from the pydantic model so that it cannot drift from it.

``reference_entries()`` walks ``cdc.config.Config`` field by field, nested sections and lists of
sections (``tables[]``) included, and describes every key: its dotted path as written in YAML (the
alias where a field has one, e.g. ``json``), its type and constraints, default, whether it is
required, its description, and the environment variable that overrides it. ``render_reference()``
formats those entries as the Markdown committed as ``docs/configuration.md``; a unit test
regenerates it and fails when the committed file differs.

The environment variable names follow pydantic-settings' own rules (``env_prefix``,
``env_nested_delimiter``, and ``env_prefix_target``, which decides whether the prefix applies to an
alias), and a unit test sets each one and checks that it reaches its key, so a name printed here
is a name that works.

Command line: ``python -m cdc.reference > docs/configuration.md``.
"""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePath
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from cdc.config import Config

__all__ = ["Entry", "reference_entries", "render_reference"]

REGENERATE = "cdc config-reference > docs/configuration.md"
SECTION_DEFAULTS = "(see its keys)"


@dataclass(frozen=True, slots=True)
class Entry:
    """One configuration key."""

    path: str  # as written in YAML, e.g. "kafka.bootstrap_servers", "tables[].name", "json.schemas_enable"
    attributes: tuple[str, ...]  # the Python attribute names leading to it, e.g. ("json_format", "schemas_enable")
    type: str  # e.g. "integer >= 1", "one of `json`"
    default: str | None  # None: no default
    required: bool
    description: str
    env: str | None  # None: only settable as part of its enclosing list (see ``env_note``)
    env_note: str | None  # how to set it from the environment when ``env`` is None
    section: bool  # a nested section (or list of sections) whose keys follow
    alias_of: str | None  # the Python attribute name when the YAML key is an alias


# -- walking the model --------------------------------------------------------------------------


def reference_entries(model: type[BaseModel] = Config) -> list[Entry]:
    """Every key of ``model``, depth first, in declaration order."""
    config = model.model_config
    prefix = str(config.get("env_prefix", ""))
    nested = config.get("env_nested_delimiter")
    delimiter = str(nested) if nested else None
    target = str(config.get("env_prefix_target", "variable"))
    case_sensitive = bool(config.get("case_sensitive", False))
    entries: list[Entry] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if field.alias:
            # pydantic-settings reads an aliased field from the alias, prefixed only when told to.
            env = (prefix if target in ("alias", "all") else "") + field.alias
        else:
            env = prefix + name
        if not case_sensitive:
            env = env.upper()
        entries.extend(_walk(field, name, key, (name,), env, delimiter, list_env=None))
    return entries


def _walk(
    field: FieldInfo,
    name: str,
    path: str,
    attributes: tuple[str, ...],
    env: str | None,
    delimiter: str | None,
    *,
    list_env: str | None,
) -> Iterator[Entry]:
    annotation = field.annotation
    section_model, in_list = _section_model(annotation)
    default, required = _default(field)
    alias_of = name if field.alias and field.alias != name else None
    env_note = None
    if env is None and list_env is not None:
        env_note = f"as part of `{list_env}`"
    yield Entry(
        path=path,
        attributes=attributes,
        type=_type_text(annotation, field.metadata),
        default=default,
        required=required,
        description=_clean(field.description),
        env=env,
        env_note=env_note,
        section=section_model is not None,
        alias_of=alias_of,
    )
    if section_model is None:
        return
    if in_list:
        # Items of a list are set together: the whole list as JSON in the list's own variable.
        child_prefix, child_list_env = f"{path}[]", env or list_env
        for child_name, child in section_model.model_fields.items():
            child_key = child.alias or child_name
            yield from _walk(
                child,
                child_name,
                f"{child_prefix}.{child_key}",
                (*attributes, child_name),
                None,
                delimiter,
                list_env=child_list_env,
            )
        return
    for child_name, child in section_model.model_fields.items():
        child_key = child.alias or child_name
        child_env = None
        if env is not None and delimiter is not None:
            child_env = f"{env}{delimiter}{child_key.upper()}"
        yield from _walk(
            child,
            child_name,
            f"{path}.{child_key}",
            (*attributes, child_name),
            child_env,
            delimiter,
            list_env=list_env,
        )


def _section_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the nested model, whether it is a list of them) for a section or list of sections."""
    for candidate in _without_none(annotation):
        if _is_model(candidate):
            return candidate, False
        if get_origin(candidate) in (list, tuple, set, frozenset):
            args = [a for a in get_args(candidate) if a is not Ellipsis]
            if len(args) == 1 and _is_model(args[0]):
                return args[0], True
    return None, False


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _without_none(annotation: Any) -> list[Any]:
    if _is_union(annotation):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


# -- describing types ---------------------------------------------------------------------------

_SCALARS: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
    PurePath: "path",
    SecretStr: "secret string",
}


def _type_text(annotation: Any, metadata: list[Any]) -> str:
    bounds, sizes = _constraints(metadata)
    text = _type_name(annotation)
    if bounds:
        text += " " + ", ".join(bounds)
    if sizes:
        text += ", " + ", ".join(sizes)
    return text


def _type_name(annotation: Any) -> str:
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation is Any:
        return "any"
    if _is_union(annotation):
        args = list(get_args(annotation))
        optional = type(None) in args
        names = [_type_name(a) for a in args if a is not type(None)]
        text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        return f"{text} (optional)" if optional else text
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{_scalar(v)}`" for v in get_args(annotation))
    if origin in (list, tuple, set, frozenset):
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        item = _type_name(args[0]) if args else "any"
        return f"list of {item}" if not _is_model(args[0] if args else None) else "list of sections"
    if origin in (dict, Mapping):
        key_type, value_type = get_args(annotation) or (Any, Any)
        return f"map of {_type_name(key_type)} to {_type_name(value_type)}"
    if _is_model(annotation):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _constraints(metadata: list[Any]) -> tuple[list[str], list[str]]:
    """(numeric bounds such as ">= 1", length limits such as "at least 1 item")."""
    bounds: list[str] = []
    sizes: list[str] = []
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            bounds.append(f">= {_scalar(item.ge)}")
        elif isinstance(item, annotated_types.Gt):
            bounds.append(f"> {_scalar(item.gt)}")
        elif isinstance(item, annotated_types.Le):
            bounds.append(f"<= {_scalar(item.le)}")
        elif isinstance(item, annotated_types.Lt):
            bounds.append(f"< {_scalar(item.lt)}")
        elif isinstance(item, annotated_types.MinLen):
            sizes.append(f"at least {item.min_length}" + (" item" if item.min_length == 1 else " items"))
        elif isinstance(item, annotated_types.MaxLen):
            sizes.append(f"at most {item.max_length}" + (" item" if item.max_length == 1 else " items"))
    return bounds, sizes


# -- defaults -----------------------------------------------------------------------------------


def _default(field: FieldInfo) -> tuple[str | None, bool]:
    """(the default as YAML would show it, required)."""
    if field.is_required():
        return None, True
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return None, True
    if isinstance(value, BaseModel):
        return SECTION_DEFAULTS, False
    return _scalar(value), False


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return _scalar(value.value)
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, default=str, sort_keys=True)


def _clean(text: str | None) -> str:
    return " ".join((text or "").split())


# -- Markdown -----------------------------------------------------------------------------------

_HEADER = """\
# Configuration reference

<!-- Generated from cdc.config.Config by `{regenerate}`. Do not edit by hand:
     tests/unit/test_reference.py fails when this file and the model differ. -->

`cdc run --config FILE` and `cdc validate FILE` read one YAML file, validated by a single pydantic
model (`cdc.config.Config`). Unknown keys are errors, and every error names the dotted path of its
key. A complete, commented example is [`example.yaml`](example.yaml).

**Environment variables.** Every key can be overridden from the environment through the same model:
`{prefix}` followed by the key's path, with `{delimiter}` between levels, e.g.
`{example}=broker:9092`. Names are {case}. The environment wins over the file.
A section or a map given as JSON is merged into the file's: keys it does not name keep their values
from the file or their defaults (`{map_example}='{{"sasl.password": "..."}}'` adds one producer
setting). A list given as JSON replaces the file's list, so the keys inside a list of sections
(`tables[]`) can only be set by giving the whole list:
`{list_example}='["public.customers", {{"name": "public.orders", "key": ["id"]}}]'`.

**Secrets.** Never put a password in `source.dsn` (it is refused): set `{password_env}`, or
`source.password_file` to a file holding it (a mounted Kubernetes or Docker secret).
"""


def render_reference(model: type[BaseModel] = Config) -> str:
    """The Markdown reference of every configuration key of ``model``."""
    entries = reference_entries(model)
    config = model.model_config
    prefix = str(config.get("env_prefix", ""))
    delimiter = str(config.get("env_nested_delimiter") or "")
    by_path = {e.path: e for e in entries}
    out = [
        _HEADER.format(
            regenerate=REGENERATE,
            prefix=prefix,
            delimiter=delimiter,
            example=_env_of(by_path, "kafka.bootstrap_servers") or f"{prefix}KAFKA{delimiter}BOOTSTRAP_SERVERS",
            list_example=_env_of(by_path, "tables") or f"{prefix}TABLES",
            map_example=_env_of(by_path, "kafka.producer") or f"{prefix}KAFKA{delimiter}PRODUCER",
            password_env=_env_of(by_path, "source.password") or f"{prefix}SOURCE{delimiter}PASSWORD",
            case="case-insensitive" if not config.get("case_sensitive", False) else "case-sensitive",
        )
    ]
    aliased = [e for e in entries if e.alias_of]
    if aliased:
        out.append(
            "**Aliases.** "
            + "; ".join(
                f"The YAML key `{e.path}` is the model's attribute `{'.'.join(e.attributes)}` "
                f"(its environment variable is `{e.env}`)"
                for e in aliased
            )
            + ".\n"
        )

    top = [e for e in entries if len(e.attributes) == 1]
    out.append(_table("Top-level keys", None, top))
    for entry in entries:
        if entry.section:
            children = [e for e in entries if _is_child(e, entry)]
            out.append(
                _table(f"`{entry.path}[]`" if entry.type.startswith("list") else f"`{entry.path}`", entry, children)
            )
    return "\n".join(out).rstrip("\n") + "\n"


def _env_of(by_path: Mapping[str, Entry], path: str) -> str | None:
    entry = by_path.get(path)
    return entry.env if entry is not None else None


def _is_child(candidate: Entry, parent: Entry) -> bool:
    n = len(parent.attributes)
    return len(candidate.attributes) == n + 1 and candidate.attributes[:n] == parent.attributes


def _table(title: str, parent: Entry | None, rows: list[Entry]) -> str:
    lines = [f"## {title}", ""]
    if parent is not None:
        if parent.description:
            lines += [_escape(parent.description)[0].upper() + _escape(parent.description)[1:] + ".", ""]
        facts = ["required" if parent.required else "optional"]
        if parent.env:
            how = "a JSON list" if parent.type.startswith("list") else "a JSON object, or one variable per key"
            facts.append(f"from the environment: `{parent.env}` ({how})")
        elif parent.env_note:
            facts.append(f"from the environment: {parent.env_note}")
        lines += ["Section: " + "; ".join(facts) + ".", ""]
    lines += [
        "| Key | Type | Default | Required | Environment variable | Description |",
        "|---|---|---|---|---|---|",
    ]
    for e in rows:
        if e.default is None:
            default = "—"
        elif e.default == SECTION_DEFAULTS:
            default = e.default
        else:
            default = f"`{e.default.replace('|', '&#124;')}`"
        if e.env:
            env = f"`{e.env}`"
        elif e.env_note:
            env = e.env_note
        else:
            env = "—"
        notes = []
        if e.section:
            notes.append(f"see `{e.path}{'[]' if e.type.startswith('list') else ''}` below")
        if e.alias_of:
            notes.append(f"Python attribute `{e.alias_of}`")
        description = _escape(e.description)
        if notes:
            description = f"{description} ({'; '.join(notes)})" if description else "; ".join(notes)
        lines.append(
            f"| `{e.path}` | {_escape(e.type)} | {default} | {'yes' if e.required else 'no'} | {env} | "
            f"{description or '—'} |"
        )
    lines.append("")
    return "\n".join(lines)


_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")  # what Markdown would take for an HTML tag


def _escape(text: str) -> str:
    """Plain text made safe in a Markdown table cell: pipes and angle brackets escaped."""
    return _TAG_START.sub(r"\\<", text.replace("|", "\\|").replace("\n", " "))


def main() -> int:
    sys.stdout.write(render_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
