"""Fixture modules, listed once (as quix-streams' tests/conftest.py does): each test asks for fixtures by name.

`make test` runs the suite on pytest-xdist workers (three unless CDC_TEST_WORKERS says). The scheduler below
hands out whole groups: a module's tests go to one worker (its module-scoped fixtures are built once), every
Spark module to one worker (one Spark JVM at a time), and every podman module to one worker (the image
builds share build/). Tests run beside each other against the session's servers, so a test
that stops or reconfigures a server uses one of its own (test_broker_outage.py starts its own broker; the
failover and slot invalidation tests their own PostgreSQL).

The longest groups go first (``FIRST``, in the collection's order, which ``pytest_collection_modifyitems``
sets): the Spark modules are most of one worker's time, so a Spark group handed out late ends the run
alone. xdist's own reordering of groups by their number of tests (on by default) would put the unit
modules first: the scheduler turns it off. The Spark modules are not split
over two workers: two Spark JVMs beside the podman builds made the run slower on two cores, the machine's
CPU being the limit, not the workers (the figures: bench/README.md, "Figures behind the code's choices").

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


def pytest_report_header(config: pytest.Config) -> str:
    """Which row codec and envelopes this session's processes (the daemons it starts included) run on:
    the compiled ones, or the pure-Python reference (CDC_PURE_PYTHON=1, or the compiled module not built)."""
    from cdc.compiled import CHOSEN, ROLES

    chosen = ", ".join(f"{role} {CHOSEN.implementation(role)}" for role in ROLES)
    return f"compiled extensions (cdc.compiled): {chosen}" + "".join(f"; {why}" for why in set(CHOSEN.missing.values()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {group: i for i, group in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type hints: its base is Any
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # the collection's order: FIRST's groups first
    return GroupScheduling(config, log)
