import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.lsn import Lsn


def test_lsn_prints_as_postgres_does():
    assert str(Lsn(0x16_B374D848)) == "16/B374D848"
    assert str(Lsn(0)) == "0/0"


def test_lsn_parses_postgres_text():
    assert Lsn.parse("16/B374D848") == 0x16_B374D848
    assert Lsn.parse(" 0/1a ") == 0x1A


@pytest.mark.parametrize("text", ["", "16", "/1", "1/", "x/1", "1/2/3", "100000000/0"])
def test_lsn_rejects_malformed_text(text):
    with pytest.raises(ValueError, match="LSN"):
        Lsn.parse(text)


def test_lsn_rejects_out_of_range_values():
    with pytest.raises(ValueError):
        Lsn(-1)
    with pytest.raises(ValueError):
        Lsn(1 << 64)


@given(st.integers(min_value=0, max_value=Lsn.MAX))
def test_lsn_round_trips_through_text(value):
    assert Lsn.parse(str(Lsn(value))) == value
