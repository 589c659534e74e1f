"""cdc.failover: the hosts a DSN names, paired with their ports as libpq pairs them, and what 'ready' means."""

from __future__ import annotations

from cdc.failover import HostSlot, hosts


def test_hosts_pair_ports_one_to_one_or_one_for_all() -> None:
    assert hosts("host=a,b port=5432,5433 dbname=x") == [("a", "5432"), ("b", "5433")]
    assert hosts("host=a,b port=6000 dbname=x") == [("a", "6000"), ("b", "6000")]
    assert hosts("postgresql://u@a:1,b:2/x?target_session_attrs=primary") == [("a", "1"), ("b", "2")]
    assert hosts("host=a dbname=x") == [("a", "5432")]


def test_only_a_synchronized_persistent_copy_on_a_standby_is_ready() -> None:
    assert HostSlot("b", "1", "standby", synced=True, temporary=False).ready
    assert not HostSlot("b", "1", "standby", synced=True, temporary=True).ready  # dropped at promotion
    assert not HostSlot("b", "1", "standby", synced=False, temporary=None).ready
    assert not HostSlot("a", "1", "primary").ready
