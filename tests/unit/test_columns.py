import hashlib

import pytest

from cdc.columns import ColumnPolicyError, policies
from cdc.config import TableConfig
from cdc.event import ChangeEvent, Column, Op, PgType, TableSchema
from cdc.lsn import Lsn
from cdc.values import UNCHANGED_TOAST

INT4 = PgType(23, "int4")
TEXT = PgType(25, "text")
TABLE = TableSchema(
    "public",
    "people",
    (
        Column("id", INT4, key=True),
        Column("name", TEXT),
        Column("email", TEXT),
        Column("ssn", TEXT),
        Column("bio", TEXT),
    ),
)


def event(before=None, after=None, unchanged=frozenset()):
    return ChangeEvent(Op.UPDATE, TABLE, before, after, Lsn(10), Lsn(5), 7, 1, 0, False, unchanged)


ROW = {"id": 1, "name": "Ada", "email": "ada@example.org", "ssn": "123-45-6789", "bio": "long"}


def test_tables_without_column_settings_get_no_policy():
    assert policies([TableConfig(name="public.people")], "****", None) == {}


def test_excluded_columns_leave_schema_and_rows():
    p = policies([TableConfig(name="public.people", exclude_columns=["ssn", "bio"])], "****", None)["public.people"]
    out = p.apply(event(after=dict(ROW)))
    assert [c.name for c in out.table.columns] == ["id", "name", "email"]
    assert out.after == {"id": 1, "name": "Ada", "email": "ada@example.org"}


def test_an_include_list_keeps_the_key_columns_too():
    p = policies([TableConfig(name="public.people", columns=["name"])], "****", None)["public.people"]
    out = p.apply(event(before={"id": 1}, after=dict(ROW)))
    assert out.after == {"id": 1, "name": "Ada"}
    assert out.before == {"id": 1}
    assert out.key() == {"id": 1}


def test_fixed_masks_replace_values_but_keep_nulls_and_unchanged_toast():
    p = policies([TableConfig(name="public.people", mask={"ssn": "fixed", "bio": "fixed"})], "XXX", None)[
        "public.people"
    ]
    out = p.apply(event(after={**ROW, "ssn": None, "bio": UNCHANGED_TOAST}, unchanged=frozenset({"bio"})))
    assert out.after is not None
    assert out.after["ssn"] is None
    assert out.after["bio"] is UNCHANGED_TOAST
    assert out.unchanged == {"bio"}
    out = p.apply(event(after=dict(ROW)))
    assert out.after is not None
    assert out.after["ssn"] == "XXX" and out.after["name"] == "Ada"
    assert {c.name: c.type.name for c in out.table.columns}["ssn"] == "text"


def test_hash_masks_are_salted_sha256_of_the_text():
    p = policies([TableConfig(name="public.people", mask={"email": "hash"})], "****", "pepper")["public.people"]
    out = p.apply(event(after=dict(ROW)))
    assert out.after is not None
    assert out.after["email"] == hashlib.sha256(b"pepper" + b"ada@example.org").hexdigest()
    other = policies([TableConfig(name="public.people", mask={"email": "hash"})], "****", "salt2")["public.people"]
    other_after = other.apply(event(after=dict(ROW))).after
    assert other_after is not None
    assert other_after["email"] != out.after["email"]


def test_the_output_schema_is_computed_once_per_input_schema():
    p = policies([TableConfig(name="public.people", exclude_columns=["bio"])], "****", None)["public.people"]
    assert p.apply(event(after=dict(ROW))).table is p.apply(event(after=dict(ROW))).table


def test_unknown_column_names_are_refused():
    p = policies([TableConfig(name="public.people", exclude_columns=["sss"])], "****", None)["public.people"]
    with pytest.raises(ColumnPolicyError, match="does not have: sss"):
        p.check(["id", "name"])


def test_key_columns_cannot_be_masked_or_excluded():
    with pytest.raises(ValueError, match="key columns cannot be excluded or masked: id"):
        TableConfig(name="public.people", key=["id"], exclude_columns=["id"])
