"""From the replication connection to ChangeEvents: stream (transport), pgoutput (codec), changes (values)."""
