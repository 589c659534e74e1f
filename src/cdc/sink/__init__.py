"""From events to Kafka: serialize (events to records), kafka (producer, delivery, acknowledged LSN)."""
