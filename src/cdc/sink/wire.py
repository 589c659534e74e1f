"""Names on the wire that consumers match: record header names and the marker key field.

No imports from the rest of ``cdc``: the Spark jobs (``spark/cdc_views``) import it too.
"""

from typing import Final

TRUNCATE_KEY_FIELD: Final = "__cdc_truncate_partition"
"""The one field of a truncate marker's key; no row key has it."""
