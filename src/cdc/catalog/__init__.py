"""Start-up checks and catalog facts, read on an ordinary connection before streaming starts.

Every check runs before anything is created, so a refused start leaves nothing
half-made behind: no publication, no slot, no topic.

By concern: ``server`` (wal_level, the role, failover slots, the publication-race warning),
``tables`` (patterns expanded, each table checked and its key resolved), ``publication``
(planned, applied, read back) and ``types`` (non-built-in column types). Callers import from
here.
"""

from __future__ import annotations

from cdc.catalog.errors import StartupError
from cdc.catalog.publication import (
    PUBLICATION_LOCK_ATTEMPTS,
    PUBLICATION_LOCK_TIMEOUT_S,
    PublicationPlan,
    apply_publication,
    plan_publication,
    publication_members,
    publication_shape,
)
from cdc.catalog.server import (
    PUBLICATION_RACE_FIXED,
    check_server,
    check_slot_failover,
    publication_race_fix,
    warn_publication_race,
)
from cdc.catalog.tables import (
    candidate_tables,
    describe_outbox_tables,
    describe_tables,
    expand_config,
    resolve_tables,
    table_partitions,
)
from cdc.catalog.types import column_type_oids, load_types
from cdc.event import TableInfo  # the catalog builds it (describe_tables)

__all__ = [
    "PUBLICATION_LOCK_ATTEMPTS",
    "PUBLICATION_LOCK_TIMEOUT_S",
    "PUBLICATION_RACE_FIXED",
    "PublicationPlan",
    "StartupError",
    "TableInfo",
    "apply_publication",
    "candidate_tables",
    "check_server",
    "check_slot_failover",
    "column_type_oids",
    "describe_outbox_tables",
    "describe_tables",
    "expand_config",
    "load_types",
    "plan_publication",
    "publication_members",
    "publication_race_fix",
    "publication_shape",
    "resolve_tables",
    "table_partitions",
    "warn_publication_race",
]
