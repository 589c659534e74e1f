"""Which row codec writes the decoder's rendered rows, chosen once, here: the compiled one
(``cdc.render._compiled``, built from Cython when the package is installed on a machine with a C
compiler) or the reference (``cdc.render.rows.render_parser``, pure Python). Both write the same bytes
(``tests/unit/test_codec.py`` holds them to it), so the choice changes speed only. The same choice covers
the JSON format's envelope around those rows (``json_records``: ``cdc.render._envelope``, or the
serializer's own ``records``; ``tests/unit/test_envelope_codec.py``), and the Avro format's (``avro_records``:
``cdc.render._envelope.AvroRecords``; ``tests/unit/test_avro_envelope_codec.py``). ``TableRenderer`` is the
decoder's ``RowRenderer`` built from a choice of which tables may be rendered at all
(``cdc.pipeline.wiring.rendering_of`` derives it from the stages), with the chosen codec's parsers.

Set ``CDC_PURE_PYTHON=1`` to run on the reference although the compiled codec is installed (what the
reference's run of the tests does). When the compiled codec is missing, the daemon runs on the
reference and says so at start-up (``log_choice``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Literal

import structlog

from cdc.compiled import FORCE_REFERENCE_ENV, reference_forced
from cdc.decoder.rows import Decline, RowParser
from cdc.event import TableSchema
from cdc.render.rows import (
    CopyRecord,
    CopyRowParser,
    RenderedRow,
    RowRendering,
    render_copy_parser,
    render_copy_record,
    render_parser,
)

if TYPE_CHECKING:
    from cdc.event import ChangeEvent, MessageEvent, TruncateEvent
    from cdc.sink.record import Record

    Records = Callable[[ChangeEvent | TruncateEvent | MessageEvent], list[Record]]
    """A serializer's ``records``."""


BUILD_FIX: Final = (
    "reinstall the package where a C compiler and Python's headers are present (pip install -e . builds "
    "cdc.render._compiled with Cython; e.g. apt-get install gcc python3-dev), or ignore this: the reference "
    "writes the same records, more slowly"
)


def _load() -> tuple[ModuleType | None, str]:
    """The compiled module, or None and why not."""
    if reference_forced():
        return None, f"{FORCE_REFERENCE_ENV} is set"
    try:
        from cdc.render import _compiled
    except ImportError as exc:
        return None, f"cdc.render._compiled is not built: {exc}"
    return _compiled, ""


_COMPILED, _WHY_NOT = _load()


def _load_envelope() -> ModuleType | None:
    """The compiled JSON envelope, or None (the reference forced, or not built: an older build of the package
    may hold the row codec alone)."""
    if _COMPILED is None:
        return None
    try:
        from cdc.render import _envelope
    except ImportError:
        return None
    return _envelope


_ENVELOPE = _load_envelope()

IMPLEMENTATION: Final[Literal["compiled", "reference"]] = "compiled" if _COMPILED is not None else "reference"


def format_pieces(fmt: bytes) -> tuple[bytes, ...]:
    """A bytes format of ``%b`` slots only (``RowRendering.row_format``/``key_format``) split at its slots,
    ``%%`` unescaped: ``fmt % values == pieces[0] + values[0] + pieces[1] + ... + pieces[-1]``."""
    pieces: list[bytes] = []
    current = bytearray()
    i = 0
    while i < len(fmt):
        if fmt[i] == 0x25:  # '%'
            following = fmt[i + 1 : i + 2]
            if following == b"%":
                current.append(0x25)
            elif following == b"b":
                pieces.append(bytes(current))
                current.clear()
            else:
                raise ValueError(f"a row format holds a conversion other than %b or %%: {fmt!r}")
            i += 2
            continue
        current.append(fmt[i])
        i += 1
    pieces.append(bytes(current))
    return tuple(pieces)


def compiled_parser(
    rendering: RowRendering,
    converters: Sequence[Callable[[bytes], Any]],
    unescape: Callable[[bytes], bytes] | None = None,
) -> RowParser:
    """The compiled codec's parser of one relation's tuples (ImportError when it is not built); ``unescape``
    is for its ``copy_row`` (``compiled_copy_parser``)."""
    from cdc.render import _compiled

    parser: RowParser = _compiled.RowCodec(
        rendering,
        tuple(converters),
        format_pieces(rendering.row_format),
        format_pieces(rendering.key_format),
        RenderedRow,
        Decline,
        unescape,
    )
    return parser


def row_parser(rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]]) -> RowParser:
    """The chosen codec's parser of one relation's tuples into ``RenderedRow``s."""
    if _COMPILED is not None:
        return compiled_parser(rendering, converters)
    return render_parser(rendering, converters)


def compiled_copy_parser(
    rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRowParser:
    """The compiled codec's parser of one table's ``COPY ... TO STDOUT`` text lines (ImportError when it is not
    built); ``unescape`` removes COPY's escapes from a field holding a backslash."""
    copy_row: CopyRowParser = compiled_parser(rendering, converters, unescape).copy_row  # type: ignore[attr-defined]
    return copy_row


def copy_parser(
    rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRowParser:
    """The chosen codec's parser of one table's ``COPY ... TO STDOUT`` text lines into ``RenderedRow``s (the
    snapshot's): the same bytes as ``row_parser`` writes for the same values in a pgoutput tuple."""
    if _COMPILED is not None:
        return compiled_copy_parser(rendering, converters, unescape)
    return render_copy_parser(rendering, converters, unescape)


def compiled_copy_record(
    rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRecord:
    """The compiled codec's record of one COPY line (``RowCodec.copy_record``; ImportError when it is not built)."""
    record: CopyRecord = compiled_parser(rendering, converters, unescape).copy_record  # type: ignore[attr-defined]
    return record


def copy_record(
    rendering: RowRendering, converters: Sequence[Callable[[bytes], Any]], unescape: Callable[[bytes], bytes]
) -> CopyRecord:
    """The chosen codec's record of one table's ``COPY ... TO STDOUT`` lines (the snapshot's JSON path): the key
    and row of ``copy_parser``'s ``RenderedRow`` between the record's constant parts, made in one call."""
    if _COMPILED is not None:
        return compiled_copy_record(rendering, converters, unescape)
    return render_copy_record(rendering, converters, unescape)


EnvelopeClasses = tuple[
    type[Any],
    type[Any],
    type[Any],
    tuple[Any, Any, Any, Any],
    Callable[..., tuple[tuple[str, bytes], ...]],
    tuple[str, str, str, str],
]
"""The first arguments of ``_envelope.JsonRecords`` and ``AvroRecords`` after the serializer and reference."""


def _envelope_classes() -> EnvelopeClasses:
    """What both compiled envelopes take first after the serializer and its reference: the event, row and
    record classes, the ops they write (create, read, update, delete), the position headers' writer outside
    a transaction, and the headers' names."""
    from cdc.event import ChangeEvent, Op
    from cdc.sink.record import Record
    from cdc.sink.records import position_headers
    from cdc.sink.wire import COMMIT_LSN_HEADER, LSN_HEADER, ORDINAL_HEADER, TXID_HEADER

    return (
        ChangeEvent,
        RenderedRow,
        Record,
        (Op.CREATE, Op.READ, Op.UPDATE, Op.DELETE),
        position_headers,
        (LSN_HEADER, COMMIT_LSN_HEADER, TXID_HEADER, ORDINAL_HEADER),
    )


def compiled_json_records(
    serializer: Any,
    reference: Records,
    *,
    schemas: bool,
    clock_ns: Callable[[], int],
) -> Records:
    """The compiled envelope's ``records`` of a JSON serializer (ImportError when it is not built): a row change
    of rendered rows in one call (its transaction block, when there is one, through ``orjson`` as the reference
    writes it), every other event handed to ``reference``, the serializer's own
    ``EventSerializer.records``; ``schemas`` and ``clock_ns`` are the serializer's."""
    import orjson

    from cdc.render import _envelope

    records: Records = _envelope.JsonRecords(
        serializer,
        reference,
        *_envelope_classes(),
        schemas,
        clock_ns,
        orjson.dumps,
    )
    return records


def json_records(
    serializer: Any,
    reference: Records,
    *,
    schemas: bool,
    clock_ns: Callable[[], int],
) -> Records:
    """The chosen ``records`` of a JSON serializer: the compiled envelope's, or ``reference`` itself."""
    if _ENVELOPE is None:
        return reference
    return compiled_json_records(serializer, reference, schemas=schemas, clock_ns=clock_ns)


_AVRO_ENVELOPE_FIELDS: Final = ("before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns")


def avro_envelope_pieces(plan: Any) -> tuple[Any, ...] | None:
    """The constant pieces of the Avro envelope of one table's plan (``cdc.sink.avro._AvroPlan``) for
    ``_envelope.AvroRecords``, taken from the plan's own compiled field writers: (topic, key wire prefix,
    value wire prefix, before null, before branch, after null, after branch, no transaction, the transaction
    field's writer, op ``c``, ``r``, ``u``, ``d``, ts_ms, ts_us and ts_ns before their varints). None (the
    reference takes the table's events) when the table has no key, the envelope is not compiled, or a field
    is not written as a prefix and the varint that ``AvroRecords`` writes."""
    from cdc.sink.avro_write import COMPILED_ERRORS, Encoded, write_long

    if plan.key is None or not plan.key_fields or plan.envelope is None:
        return None
    from cdc.sink.avro_schema import avro_name

    fields = plan.value.fields.get(avro_name(f"{plan.topic}.Envelope"))
    if fields is None or tuple(fields) != _AVRO_ENVELOPE_FIELDS:
        return None
    try:
        rows = []
        for name in ("before", "after"):
            write = fields[name]
            rows += [write(None), write(Encoded(b""))]
        ops = tuple(fields["op"](op) for op in "crud")
        times = tuple(_long_prefix(fields[name], write_long) for name in ("ts_ms", "ts_us", "ts_ns"))
        no_transaction = fields["transaction"](None)
    except COMPILED_ERRORS:
        return None
    if None in times:
        return None
    return (plan.topic, plan.key.prefix, plan.value.prefix, *rows, no_transaction, fields["transaction"], *ops, *times)


_LONG_SAMPLES: Final = (0, 1, -1, 63, 64, 2**31, 2**40 + 12345, 2**62 + 7, 2**63 - 1, -(2**63))


def _long_prefix(write: Callable[[Any], bytes], write_long: Callable[[int], bytes]) -> bytes | None:
    """What ``write`` (a long field's writer, or a union's) puts before the long's varint; None when it is not
    that for every sample."""
    prefix = write(0)[:-1]
    if any(write(n) != prefix + write_long(n) for n in _LONG_SAMPLES):
        return None
    return prefix


def _string_prefix(write: Callable[[Any], bytes], write_long: Callable[[int], bytes]) -> bytes | None:
    """What ``write`` (a string field's writer, or a union's) puts before the string's length and text."""
    prefix = write("")[:-1]
    if any(write(t) != prefix + write_long(len(t.encode())) + t.encode() for t in ("", '[null,"0"]', "x" * 200)):
        return None
    return prefix


def compiled_avro_records(serializer: Any, reference: Records, *, clock_ns: Callable[[], int]) -> Records:
    """The compiled envelope's ``records`` of an Avro serializer (ImportError when it is not built): a row
    change of rendered rows in one call, every other event handed to ``reference``, the serializer's own
    ``EventSerializer.records`` (also every event, when its source block is not compiled)."""
    from cdc.render import _envelope
    from cdc.sink.avro_write import COMPILED_ERRORS, write_long

    source_fields = dict(serializer._source_fields or ())
    try:
        seq_prefix = _string_prefix(source_fields["sequence"], write_long)
        lsn_prefix = _long_prefix(source_fields["lsn"], write_long)
    except (*COMPILED_ERRORS, KeyError):
        seq_prefix = lsn_prefix = None
    if seq_prefix is None or lsn_prefix is None:
        return reference
    records: Records = _envelope.AvroRecords(
        serializer,
        reference,
        *_envelope_classes(),
        clock_ns,
        avro_envelope_pieces,
        seq_prefix,
        lsn_prefix,
    )
    return records


def avro_records(serializer: Any, reference: Records, *, clock_ns: Callable[[], int]) -> Records:
    """The chosen ``records`` of an Avro serializer: the compiled envelope's, or ``reference`` itself."""
    if _ENVELOPE is None or not hasattr(_ENVELOPE, "AvroRecords"):
        return reference
    return compiled_avro_records(serializer, reference, clock_ns=clock_ns)


def log_choice(log: Any = None, **others: str) -> None:
    """Say at start-up which codec runs: an info event, or a warning naming the fix when the compiled one is
    missing (not when ``CDC_PURE_PYTHON`` asked for the reference)."""
    log = log if log is not None else structlog.get_logger(__name__)
    if _COMPILED is not None:
        log.info(
            "row_codec",
            implementation="compiled",
            module=_COMPILED.__file__,
            json_envelope="compiled" if _ENVELOPE is not None else "reference",
            avro_envelope="compiled" if _ENVELOPE is not None and hasattr(_ENVELOPE, "AvroRecords") else "reference",
            **others,  # the other compiled modules' choices (the decoder's fast path, the delivery's sender)
        )
    elif reference_forced():
        log.info("row_codec", implementation="reference", reason=_WHY_NOT, **others)
    else:
        log.warning("row_codec_not_compiled", implementation="reference", reason=_WHY_NOT, fix=BUILD_FIX, **others)


class TableRenderer:
    """The decoder's ``RowRenderer``: a rendered-row parser for each table ``rendering`` gives a
    ``RowRendering`` for, typed rows for the others. ``make_parser`` writes the parsers: by default the
    codec ``cdc.render.codec`` chose (compiled or reference); the tests name one."""

    def __init__(
        self,
        rendering: Callable[[TableSchema], RowRendering | None],
        make_parser: Callable[[RowRendering, Sequence[Callable[[bytes], Any]]], RowParser] | None = None,
    ) -> None:
        self._rendering = rendering
        self._make_parser = make_parser

    def parser(self, table: TableSchema, converters: Sequence[Callable[[bytes], Any]]) -> RowParser | None:
        rendering = self._rendering(table)
        if rendering is None:
            return None
        return (self._make_parser or row_parser)(rendering, converters)
