"""Row rendering: writing a table's rows straight in the sink format (JSON text, Avro binary) as the
decoder reads them, skipping typed values.

- ``rows``: the rendered row, the per-table ``RowRendering`` and the reference codec (a generated parser);
  the decoder sees only its ``RowRenderer`` protocol (``cdc.decoder.rows``);
- ``codec``: the one place that chooses the compiled codec (``_compiled``, Cython) or the reference, and
  ``TableRenderer``, the decoder's ``RowRenderer`` (``CDC_PURE_PYTHON=1`` forces the reference); with it,
  the JSON serializer's envelope around rendered rows (``_envelope``, Cython) or its reference ``records``;
- ``text``: pgoutput column text straight to its JSON or Avro encoding, per type;
- ``json``, ``avro``: each format's ``RowRendering`` of a table.
"""
