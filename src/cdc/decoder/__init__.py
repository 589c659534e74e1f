"""From replication payloads to ChangeEvents: pgoutput (codec), changes (values); the transport is cdc.replication."""
