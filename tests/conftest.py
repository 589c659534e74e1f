"""Fixture modules, listed once (as quix-streams' tests/conftest.py does): each test asks for fixtures by name.

`make test` runs the suite on pytest-xdist workers (three unless CDC_TEST_WORKERS says). The scheduler below hands out whole groups: a
module's tests go to one worker (its module-scoped fixtures are built once), every Spark module to one
worker (one Spark JVM at a time), and every podman module to one worker (the image builds share
build/). Tests run beside each other against the session's servers, so a test that stops or reconfigures
a server uses one of its own (test_broker_outage.py starts its own broker; the failover and slot
invalidation tests their own PostgreSQL).

The two longest groups go first (``pytest_collection_modifyitems``): the Spark modules take about a third
of the suite's test time on one worker, so a group handed out late would end the run alone.

xdist's own ``--dist loadgroup`` is not used: with pytest 9 it leaves the node ids alone (xdist 3.8
renames ``_nodeid``, pytest 9 reads ``_id``), so its groups are silently ignored.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest_plugins = ["tests.support.services", "tests.support.pg18", "tests.support.roles"]


def group_of(nodeid: str) -> str:
    """The worker group of a test, from its node id."""
    module = nodeid.split("::", 1)[0]
    if module.startswith("tests/container/"):
        return "podman"
    if module.startswith("tests/integration/test_spark"):
        return "spark"
    return module


FIRST = ("spark", "podman")
"""Groups that run before all others, longest first."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {group: i for i, group in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only when xdist runs the session

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
