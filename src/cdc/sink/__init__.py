"""From events to Kafka: records (event -> records, per format in json/avro), kafka (producer, delivery,
acknowledged LSN)."""
