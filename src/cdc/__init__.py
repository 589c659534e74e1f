"""Change data capture from PostgreSQL logical replication to compacted Kafka topics."""

__version__ = "0.1.0"
