"""Row rendering: writing a table's rows straight in the sink format (JSON text, Avro binary) as the
decoder reads them, skipping typed values. ``rows`` holds the rendered row, the per-table plan and the
parser generation; the decoder sees only its ``RowRenderer`` protocol (``cdc.decoder.rows``)."""
