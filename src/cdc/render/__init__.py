"""The row codec: a table's rows written straight in the sink format (JSON text, Avro binary) as the decoder
and the snapshot read them, skipping typed values.

What the bytes are is the sink's (``cdc.sink.rendering``: ``RowRendering``, ``RenderedRow``; each format's
``row_rendering``); this package only runs a ``RowRendering`` over pgoutput tuples and COPY lines, fast:

- ``rows``: the reference codec (a parser generated per table), and its COPY forms;
- ``codec``: ``TableRenderer``, the decoder's ``RowRenderer`` (``cdc.decoder.rows``), and the snapshot's
  ``copy_parser``/``copy_record``, each built with the codec ``cdc.compiled`` chose: the compiled one
  (``_compiled``, Cython) or the reference.

It depends on the sink and the decoder; neither imports it (docs/architecture.md).
"""
