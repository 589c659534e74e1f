"""``spark: {file: ...}``: the views and indexes of a declarations file join those written in cdc.yaml; a file
that is missing, not YAML or not a mapping of views and indexes is a configuration error naming it and the fix.
The demo's declarations (docs/examples/shop-spark.yaml) load and pass the static check on the shop's tables."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cdc.config import ConfigError, load_config
from cdc.declared import DeclarationError, SparkSection, check_declarations, load_declarations

DOCS = Path(__file__).resolve().parents[2] / "docs"

BASE = """
source: {dsn: "postgresql://cdc@127.0.0.1:5432/library", slot: lib, publication: lib}
tables: [public.authors, public.books]
kafka: {bootstrap_servers: "127.0.0.1:9092"}
topic_prefix: lib
"""
VIEW = "{name: %s, sql: 'SELECT a.id FROM public_authors a', key: [id]}"


def config_with(tmp_path: Path, spark: str, declarations: str | None = None) -> Path:
    if declarations is not None:
        (tmp_path / "views").mkdir(exist_ok=True)
        (tmp_path / "views" / "library.yaml").write_text(textwrap.dedent(declarations))
    path = tmp_path / "cdc.yaml"
    path.write_text(BASE + spark)
    return path


def test_a_named_file_adds_its_views_and_indexes_to_those_written_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config_with(
        tmp_path,
        f"spark:\n  file: views/library.yaml\n  views: [{VIEW % 'inline'}]\n",
        f"""
        views: [{VIEW % "from_file"}]
        indexes:
          - {{name: books, sql: 'SELECT isbn, title FROM public_books', id: isbn, text: {{title: 1.0}}}}
        """,
    )
    monkeypatch.chdir("/")  # relative to cdc.yaml, not to the working directory

    section = load_config(path).spark

    assert [v.name for v in section.views] == ["inline", "from_file"]
    assert [i.name for i in section.indexes] == ["books"]
    assert section.file == str(tmp_path / "views" / "library.yaml")
    assert SparkSection.model_validate(section.model_dump()) == section  # validated again: not added twice


@pytest.mark.parametrize(
    ("declarations", "problem"),
    [
        (None, r"cannot read the declarations file .*views/library\.yaml named by spark\.file \(No such file"),
        ("views: [", r"declarations file .*library\.yaml \(spark\.file\) is not valid YAML"),
        ("- " + VIEW % "v", r"must be a mapping with the keys views and indexes .* not list"),
        ("spark:\n  views: []\n", r"must be a mapping with the keys views and indexes .* not \['spark'\]\. Fix: put"),
        ("views: {name: v}\n", r"views must be a list of declarations"),
    ],
)
def test_a_bad_declarations_file_is_a_configuration_error_naming_it(
    tmp_path: Path, declarations: str | None, problem: str
) -> None:
    path = config_with(tmp_path, "spark: {file: views/library.yaml}\n", declarations)

    with pytest.raises(ConfigError, match=problem):
        load_config(path)


def test_a_bad_declaration_in_the_file_names_its_key_and_the_file(tmp_path: Path) -> None:
    path = config_with(
        tmp_path,
        f"spark:\n  file: views/library.yaml\n  views: [{VIEW % 'inline'}]\n",
        f"views: [{VIEW % 'v'}, {{name: Bad}}]\n",
    )

    with pytest.raises(ConfigError) as refused:
        load_config(path)

    message = str(refused.value)
    assert "spark.views.2.name: Value error, must be a lower-case identifier" in message
    assert "spark.views.2.sql: required key is missing" in message
    assert f"(spark.views and spark.indexes include those of {tmp_path / 'views' / 'library.yaml'})" in message


def test_a_view_declared_inline_and_differently_in_the_file_is_declared_twice(tmp_path: Path) -> None:
    other = "{name: twice, sql: 'SELECT b.isbn FROM public_books b', key: [isbn]}"
    path = config_with(
        tmp_path, f"spark:\n  file: views/library.yaml\n  views: [{VIEW % 'twice'}]\n", f"views: [{other}]\n"
    )

    with pytest.raises(ConfigError, match="views: twice declared more than once"):
        load_config(path)


def test_load_declarations_reads_a_file_on_its_own_and_names_it_when_it_is_wrong(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(f"views: [{VIEW % 'v'}]\n")
    assert [v.name for v in load_declarations(good).views] == ["v"]

    with pytest.raises(DeclarationError, match=r"declarations in .*missing\.yaml are invalid:\n  cannot read"):
        load_declarations(tmp_path / "missing.yaml")


def test_the_demo_shops_declarations_pass_the_static_check_on_the_shop_tables() -> None:
    section = load_declarations(DOCS / "examples" / "shop-spark.yaml")
    shop = {
        "public.customers": ["id", "name", "email", "created_at"],
        "public.products": ["id", "sku", "title", "price", "tags"],
        "public.orders": ["id", "customer_id", "status", "placed_at"],
        "public.order_lines": ["order_id", "line_no", "product_id", "quantity", "unit_price"],
    }

    check_declarations(section, shop)

    assert ([v.name for v in section.views], [i.name for i in section.indexes]) == (
        ["orders_enriched"],
        ["shop_search"],
    )
    with pytest.raises(DeclarationError, match="view orders_enriched: .*unit_price"):
        check_declarations(section, {**shop, "public.order_lines": ["order_id", "line_no", "product_id", "quantity"]})
