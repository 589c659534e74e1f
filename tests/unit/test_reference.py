"""The configuration reference and the example configuration cannot drift from the model."""

from __future__ import annotations

import json
import os
import re
import sys
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from cdc.config import Config, ConfigError, load_config
from cdc.reference import REGENERATE, Entry, reference_entries, render_reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

BASE = """
source:
  dsn: postgresql://cdc@db:5432/shop
  slot: shop_cdc
  publication: shop_cdc
tables:
  - public.customers
kafka:
  bootstrap_servers: kafka:9092
topic_prefix: shop
schema_registry:             # present so that format=avro and schema_registry.* overrides have a section
  url: http://registry:8080/apis/ccompat/v7
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No configuration variable from the caller's environment leaks into a test."""
    names = {e.env for e in reference_entries() if e.env}
    for name in os.environ:
        if name.upper().startswith("CDC_") or name.upper() in names:
            monkeypatch.delenv(name)
    return monkeypatch


def base_file(tmp_path: Path) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(BASE)
    return path


# -- the committed reference --------------------------------------------------------------------


def test_the_committed_configuration_reference_matches_the_model() -> None:
    committed = DOCS / "configuration.md"
    expected = render_reference()
    actual = committed.read_text() if committed.exists() else ""
    if actual != expected:
        pytest.fail(
            f"docs/configuration.md is out of date with cdc.config.Config. Regenerate it: "
            f"run `{REGENERATE}` (or `python -m cdc.reference > docs/configuration.md`) and commit the result.",
            pytrace=False,
        )


def test_the_reference_is_the_same_whatever_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    before = render_reference()
    clean_env.setenv("CDC_KAFKA__PARTITIONS", "7")
    clean_env.setenv("CDC_SOURCE__PASSWORD", "not-in-the-docs")
    after = render_reference()
    assert before == after
    assert "not-in-the-docs" not in after


def test_the_reference_names_path_type_default_requirement_and_variable_of_each_key() -> None:
    text = render_reference()
    row = next(line for line in text.splitlines() if line.startswith("| `kafka.bootstrap_servers` |"))
    assert row.split(" | ")[1:5] == ["string", "—", "yes", "`CDC_KAFKA__BOOTSTRAP_SERVERS`"]
    row = next(line for line in text.splitlines() if line.startswith("| `kafka.partitions` |"))
    assert row.split(" | ")[1:5] == ["integer >= 1", "`1`", "no", "`CDC_KAFKA__PARTITIONS`"]
    assert "partitions of each table topic" in row


def test_every_field_of_the_model_is_in_the_reference() -> None:
    documented = {e.attributes for e in reference_entries()}

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, field in model.model_fields.items():
            path = (*prefix, name)
            assert path in documented, f"{'.'.join(path)} is missing from the reference"
            for inner in _models_in(field.annotation):
                walk(inner, path)

    walk(Config, ())


def test_a_list_of_sections_is_documented_item_by_item_under_its_list_variable() -> None:
    entries = {e.path: e for e in reference_entries()}
    assert entries["tables"].env == "CDC_TABLES" and entries["tables"].required
    assert entries["tables[].name"].env is None
    assert entries["tables[].name"].env_note == "as part of `CDC_TABLES`"
    assert entries["tables[].key"].default == "null" and not entries["tables[].key"].required


def test_an_aliased_section_is_documented_under_its_yaml_key() -> None:
    entries = {e.path: e for e in reference_entries()}
    assert "json.schemas_enable" in entries
    assert not any(path.startswith("json_format") for path in entries)
    assert entries["json"].alias_of == "json_format"
    assert "Python attribute `json_format`" in render_reference()


def test_secrets_are_typed_as_secrets_and_their_defaults_never_shown() -> None:
    entries = {e.path: e for e in reference_entries()}
    assert entries["source.password"].type == "secret string (optional)"
    assert entries["source.password"].env == "CDC_SOURCE__PASSWORD"


def test_nested_sections_lists_of_sections_and_maps_of_any_model_are_walked() -> None:
    class Leaf(BaseModel):
        size: int = Field(default=3, ge=1, le=9, description="a | piped <b>value</b>")

    class Item(BaseModel):
        label: str
        leaf: Leaf = Field(default_factory=Leaf)

    class Settings(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="APP_", env_nested_delimiter="__")
        items: list[Item] = Field(min_length=1, description="things")
        inner: Leaf | None = None
        mode: Literal["a", "b"] = "a"
        options: dict[str, int] = Field(default_factory=dict)
        secret: SecretStr

    entries = {e.path: e for e in reference_entries(Settings)}
    assert list(entries) == [
        "items",
        "items[].label",
        "items[].leaf",
        "items[].leaf.size",
        "inner",
        "inner.size",
        "mode",
        "options",
        "secret",
    ]
    assert entries["items[].leaf.size"].env_note == "as part of `APP_ITEMS`"
    assert entries["inner.size"].env == "APP_INNER__SIZE"
    assert entries["inner.size"].type == "integer >= 1, <= 9"
    assert entries["mode"].type == "one of `a`, `b`"
    assert entries["options"].type == "map of string to integer"
    assert entries["options"].default == "{}"
    assert entries["secret"].required and entries["secret"].default is None
    text = render_reference(Settings)
    assert "## `items[]`" in text and "## `items[].leaf`" in text and "## `inner`" in text
    assert "a \\| piped \\<b>value\\</b>" in text  # a table cell stays one cell, no HTML


# -- every documented variable works ------------------------------------------------------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found = []
    for arg in [annotation, *get_args(annotation)]:
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            found.append(arg)
        elif get_origin(arg) in (list, tuple):
            found += [a for a in get_args(arg) if isinstance(a, type) and issubclass(a, BaseModel)]
    return found


def _field_annotation(attributes: tuple[str, ...]) -> Any:
    model: type[BaseModel] = Config
    annotation: Any = None
    for name in attributes:
        annotation = model.model_fields[name].annotation
        inner = _models_in(annotation)
        if inner:
            model = inner[0]
    return annotation


def _value_at(config: Config, attributes: tuple[str, ...]) -> Any:
    value: Any = config
    for name in attributes:
        value = getattr(value, name)
    return value


def _strip_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _sample(entry: Entry, current: Any) -> tuple[str, Any]:
    """(the environment value, what the key must then hold) for a change of this key."""
    annotation = _strip_optional(_field_annotation(entry.attributes))
    if entry.path == "tables":
        return json.dumps(["public.from_env", {"name": "public.keyed", "key": ["id"]}]), [
            "public.from_env",
            "public.keyed",
        ]
    if entry.path == "outbox.tables":
        return json.dumps([{"name": "public.events"}]), ["public.events"]
    if entry.path in ("spark", "spark.views"):
        view = {"name": "from_env", "sql": "SELECT id FROM public_orders", "key": ["id"]}
        if entry.path == "spark":
            return json.dumps({"views": [view]}), {"__child__": (("spark", "views"), ["from_env"])}
        return json.dumps([view]), ["from_env"]
    if entry.path == "spark.indexes":
        index = {"name": "from_env", "sql": "SELECT id, t FROM public_orders", "id": "id", "text": {"t": 1.0}}
        return json.dumps([index]), ["from_env"]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        child = next(
            e for e in reference_entries() if e.attributes[:-1] == entry.attributes and not e.section and e.env
        )
        child_value, expected = _sample(child, _value_at_default(child, current))
        key = child.path.rsplit(".", 1)[1]
        try:
            parsed: Any = json.loads(child_value)
        except ValueError:
            parsed = child_value
        return json.dumps({key: parsed}), {"__child__": (child.attributes, expected)}
    if annotation is bool:
        return ("false", False) if current else ("true", True)
    if annotation is int:
        return str((current or 0) + 1), (current or 0) + 1
    if annotation is float:
        return str((current or 0.0) + 1.5), (current or 0.0) + 1.5
    if annotation is str:
        value = f"{current}x" if current else "value"
        return value, value
    if annotation is SecretStr:
        return "s3cret-from-env", "s3cret-from-env"
    if annotation is Path:
        return "/run/secrets/from-env", Path("/run/secrets/from-env")
    if get_origin(annotation) is Literal:
        others = [a for a in get_args(annotation) if a != current]
        if others:
            return str(others[0]), others[0]
        return "surely-not-a-choice", ConfigError  # one choice: an invalid one proves the variable is read
    if get_origin(annotation) is dict:
        return json.dumps({"x.from.env": "1"}), {"x.from.env": "1"}
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return json.dumps(["from_env"]), ["from_env"]
    raise AssertionError(
        f"tests/unit/test_reference.py cannot make a sample value of {entry.path} ({annotation!r}): extend _sample"
    )


def _value_at_default(child: Entry, section_value: Any) -> Any:
    return getattr(section_value, child.attributes[-1]) if section_value is not None else None


ENV_ENTRIES = [e for e in reference_entries() if e.env]


@pytest.mark.parametrize("entry", ENV_ENTRIES, ids=[e.path for e in ENV_ENTRIES])
def test_every_documented_environment_variable_overrides_its_key(
    entry: Entry, tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    assert entry.env is not None
    path = base_file(tmp_path)
    if entry.path == "spark.file":  # names a declarations file, whose views then reach spark.views
        declarations = tmp_path / "declared.yaml"
        declarations.write_text("views: [{name: from_env, sql: SELECT 1 AS k, key: [k]}]\n")
        clean_env.setenv(entry.env, str(declarations))
        section = load_config(path).spark
        assert (section.file, [v.name for v in section.views]) == (str(declarations), ["from_env"])
        return
    current = _value_at(load_config(path), entry.attributes)
    value, expected = _sample(entry, current)
    clean_env.setenv(entry.env, value)
    if expected is ConfigError:
        with pytest.raises(ConfigError, match=re.escape(entry.path)):
            load_config(path)
        return
    got = _value_at(load_config(path), entry.attributes)
    if isinstance(expected, dict) and "__child__" in expected:
        attributes, child_expected = expected["__child__"]
        got = _value_at(load_config(path), attributes)
        expected = child_expected
    if isinstance(got, SecretStr):
        got = got.get_secret_value()
    if entry.path in ("tables", "outbox.tables"):
        got = [t.name for t in got]
    if entry.path.startswith("spark"):
        got = [d.name for d in got]
    assert got == expected, f"{entry.env}={value} did not reach {entry.path}"


# -- the example configuration ------------------------------------------------------------------


def test_the_example_configuration_validates(clean_env: pytest.MonkeyPatch) -> None:
    config = load_config(DOCS / "example.yaml")
    assert config.source.password is None, "the example must not carry a password"
    assert config.masking.salt is None, "the example must not carry the masking salt"
    assert {t.selector for t in config.tables} == {
        "public.customers",
        "public.products",
        "public.orders",
        "public.order_lines",
        "pattern 'public.audit_*'",
        "regex 'archive\\\\.orders_\\\\d{4}'",
    }


SECRETS_COMMENTED_OUT = {"source.password", "source.password_file", "masking.salt", "schema_registry.password"}


def _yaml_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path present in parsed YAML, list items as ``name[]`` (a bare string item counts as ``name``)."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.add(path)
            if isinstance(inner, dict) and not path.endswith(("producer", "topic_config", "mask")):
                paths |= _yaml_paths(inner, path)
            elif isinstance(inner, list):
                for item in inner:
                    if isinstance(item, dict):
                        paths |= _yaml_paths(item, f"{path}[]")
                    elif isinstance(item, str) and path == "tables":  # the shorthand of a table
                        paths.add(f"{path}[].name")
    return paths


def test_the_example_configuration_sets_every_key_and_shows_secrets_commented_out() -> None:
    text = (DOCS / "example.yaml").read_text()
    present = _yaml_paths(yaml.safe_load(text))
    missing = []
    for entry in reference_entries():
        if entry.path in SECRETS_COMMENTED_OUT:
            key = entry.path.rsplit(".", 1)[1]
            if entry.path in present or not re.search(rf"^\s*#\s*{re.escape(key)}:", text, re.MULTILINE):
                missing.append(f"{entry.path} (should be shown commented out)")
        elif entry.path not in present:
            missing.append(entry.path)
    assert not missing, f"docs/example.yaml does not show these keys: {missing}"


def test_the_json_list_shown_in_the_reference_is_accepted_as_written(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    match = re.search(r"`CDC_TABLES='(.+?)'`", render_reference())
    assert match is not None
    clean_env.setenv("CDC_TABLES", match.group(1))
    config = load_config(base_file(tmp_path))
    assert [t.name for t in config.tables] == ["public.customers", "public.orders"]
    assert config.tables[1].key == ["id"]


def test_a_stale_reference_fails_with_the_command_that_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "docs"
    stale.mkdir()
    (stale / "configuration.md").write_text("# old\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", stale)
    with pytest.raises(pytest.fail.Exception, match=re.escape("cdc config-reference > docs/configuration.md")):
        test_the_committed_configuration_reference_matches_the_model()


def test_a_json_map_in_the_environment_is_merged_into_the_files_map_as_the_reference_says(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    match = re.search(r"`(CDC_KAFKA__PRODUCER)='(.+?)'`", render_reference())
    assert match is not None
    path = tmp_path / "cdc.yaml"
    path.write_text(
        BASE.replace(
            "  bootstrap_servers: kafka:9092", "  bootstrap_servers: kafka:9092\n  producer:\n    linger.ms: 20"
        )
    )
    clean_env.setenv(match.group(1), match.group(2))
    assert load_config(path).kafka.producer == {"linger.ms": 20, "sasl.password": "..."}


def test_a_json_list_in_the_environment_replaces_the_files_list(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CDC_TABLES", '["public.orders"]')
    assert [t.name for t in load_config(base_file(tmp_path)).tables] == ["public.orders"]


def test_cdc_config_reference_prints_the_reference() -> None:
    from cdc.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command")
    assert "config-reference" in (commands.choices or {}), "`cdc config-reference` is not a subcommand of cdc.cli"
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "cdc.cli", "config-reference"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == render_reference()
