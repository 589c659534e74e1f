"""Names on the wire that consumers match: record header names and marker keys.

No imports from the rest of ``cdc``: the Spark jobs (``spark/cdc_views``) import it too. Changing a
value here changes what consumers already written against the topics read.
"""

from typing import Final

LSN_HEADER: Final = "cdc.lsn"
"""The event's own LSN, decimal ASCII (every record)."""
COMMIT_LSN_HEADER: Final = "cdc.commit_lsn"
"""Its transaction's commit LSN (absent for a message outside a transaction)."""
TXID_HEADER: Final = "cdc.txid"
"""Its transaction's id, when known."""
ORDINAL_HEADER: Final = "cdc.ordinal"
"""Its position in its transaction, from 1."""
TRUNCATE_HEADER: Final = "cdc.truncate"
"""``1`` on a truncate marker (whose value has ``op`` ``"t"``), so consumers can skip it before
decoding its key."""
NEW_KEY_HEADER: Final = "__debezium.newkey"
"""On the delete of an update that changed the key: the new key's JSON payload (Debezium's name)."""
OLD_KEY_HEADER: Final = "__debezium.oldkey"
"""On the create of an update that changed the key: the old key's JSON payload (Debezium's name)."""
DEAD_LETTER_REASON_HEADER: Final = "cdc.dead_letter.reason"
"""On a dead-letter record: why it is there (``record_too_large``, or an outbox ``MalformedReason``)."""

LEGACY_TRUNCATE_KEY_FIELD: Final = "__cdc_truncate_partition"
"""The one key field of truncate markers written before they took the table's key fields (all null):
readers of older topics still recognise them by it."""
