"""Names on the wire that consumers match: record header names and the truncate marker's key field.

No imports from the rest of ``cdc``: the Spark jobs (``spark/cdc_views``) import it too. Changing a
value here changes what consumers already written against the topics read.
"""

from typing import Final

LSN_HEADER: Final = "cdc.lsn"
"""The event's LSN (decimal ASCII), on every record."""
COMMIT_LSN_HEADER: Final = "cdc.commit_lsn"
"""The LSN of the event's transaction's commit (decimal ASCII), when known."""
TXID_HEADER: Final = "cdc.txid"
"""The source transaction id (decimal ASCII), when known."""
ORDINAL_HEADER: Final = "cdc.ordinal"
"""The event's position within its transaction (decimal ASCII), on every record."""
TRUNCATE_HEADER: Final = "cdc.truncate"
"""``1`` on truncate markers, so consumers can skip them before decoding keys."""
NEW_KEY_HEADER: Final = "__debezium.newkey"
"""On the delete of an update that changed the key: the new key's JSON payload (Debezium's name)."""
OLD_KEY_HEADER: Final = "__debezium.oldkey"
"""On the create of an update that changed the key: the old key's JSON payload (Debezium's name)."""
DEAD_LETTER_REASON_HEADER: Final = "cdc.dead_letter.reason"
"""On a dead-letter record: why it is there (``record_too_large``, or an outbox ``MalformedReason``)."""

TRUNCATE_KEY_FIELD: Final = "__cdc_truncate_partition"
"""The one field of a truncate marker's key (``{"__cdc_truncate_partition": p}``); no row key has it."""
