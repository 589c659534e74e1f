"""The outbox: applications publish their own events through the log, with no dual write.

- ``publish`` (``cdc.outbox.publish``): the application helper; writes an outbox row (or a
  transactional logical message) inside the caller's psycopg transaction.
- ``route`` (``cdc.outbox.route``): the daemon side, a pure transform from outbox rows and
  logical messages to Kafka records (or the reason they are malformed).
- ``config`` (``cdc.outbox.config``): the ``outbox`` configuration section.

The pipeline (``cdc.pipeline``) feeds INSERTs on the configured outbox tables and messages
with ``outbox.message_prefix`` to the router, creates each aggregate type's topic before its
first record, and produces the records through the same delivery (ack tracker or Kafka
transaction) as change events, so the confirmed LSN never passes an undelivered event.
"""

from cdc.outbox.publish import PublishError, publish

__all__ = ["PublishError", "publish"]
