"""Row rendering: writing a table's rows straight in the sink format (JSON text, Avro binary) as the
decoder reads them, skipping typed values.

- ``rows``: the rendered row, the per-table ``RowRendering`` and the parser generation; the decoder sees
  only its ``RowRenderer`` protocol (``cdc.decoder.rows``);
- ``text``: pgoutput column text straight to its JSON or Avro encoding, per type;
- ``json``, ``avro``: each format's ``RowRendering`` of a table.
"""
