"""A declared index without Spark: built from rows, searched with its boosts and facets, updated by ids;
``cdc search`` without --index takes the only index built, and names them when there are several."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cdc.cli import main as cdc_main
from cdc.declared import DeclaredIndex

pytest.importorskip("tantivy", reason="the spark extra is not installed (pip install -e '.[spark]')")
pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark"))

from cdc_views import declared

PLANETS = DeclaredIndex(
    name="planets", sql="SELECT 1", id="pid", text={"label": 2.0, "notes": 1.0}, stored=["mass"], facets=["kind"]
)
ROWS = [
    {"pid": 1, "label": "Mars", "notes": "red dust storms", "mass": "0.107", "kind": "rocky"},
    {"pid": 2, "label": "Jupiter", "notes": "storms bigger than Mars", "mass": "317.8", "kind": "giant"},
    {"pid": 3, "label": "Venus", "notes": None, "mass": "0.815", "kind": "rocky"},
]


def test_an_index_is_searched_with_its_boosts_and_facets_and_updated_by_ids(tmp_path: Path) -> None:
    path = declared.index_path(tmp_path, "planets")
    assert declared.build_index(PLANETS, ROWS, path) == 3

    assert [h["id"] for h in declared.search(path, "Mars")] == ["1", "2"]  # the label outweighs the notes
    assert {h["id"] for h in declared.search(path, "kind:rocky")} == {"1", "3"}
    (venus,) = declared.search(path, "Venus")
    assert venus.pop("score") > 0
    assert venus == {"id": "3", "label": "Venus", "notes": "", "mass": "0.815", "kind": "rocky"}  # stored fields too

    declared.update_index(
        PLANETS, [{**ROWS[0], "label": "Ares"}], [declared.document_id(1), declared.document_id(3)], path
    )
    assert [h["id"] for h in declared.search(path, "Ares")] == ["1"]
    assert declared.search(path, "Venus") == []
    assert sorted(d["_id"] for d in declared.documents(path)) == ["1", "2"]


def test_cdc_search_takes_the_only_index_and_names_them_when_there_are_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cdc_main(["search", "--warehouse", str(tmp_path), "Mars"]) == 1
    assert "no search index under" in capsys.readouterr().err

    declared.build_index(PLANETS, ROWS, declared.index_path(tmp_path, "planets"))
    assert cdc_main(["search", "--warehouse", str(tmp_path), "--json", "storms"]) == 0
    assert sorted(json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()) == ["1", "2"]

    declared.build_index(PLANETS.model_copy(update={"name": "moons"}), ROWS[:1], declared.index_path(tmp_path, "moons"))
    assert cdc_main(["search", "--warehouse", str(tmp_path), "Mars"]) == 1
    assert (
        "several search indexes under" in (err := capsys.readouterr().err)
        and "(moons, planets): name one with --index" in err
    )
    assert cdc_main(["search", "--warehouse", str(tmp_path), "--index", "moons", "--json", "Mars"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["1"]
