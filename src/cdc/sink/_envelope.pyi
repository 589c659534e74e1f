"""Type stub of the compiled JSON and Avro envelopes (``_envelope.pyx``); see ``cdc.sink.envelopes``."""

from collections.abc import Callable
from typing import Any

from cdc.event import ChangeEvent, MessageEvent, TruncateEvent
from cdc.sink.record import Record
from cdc.sink.records import EventSerializer

class JsonRecords:
    def __init__(
        self,
        serializer: EventSerializer[Any],
        reference: Callable[[ChangeEvent | TruncateEvent | MessageEvent], list[Record]],
        change_class: type[Any],
        row_class: type[Any],
        record_class: type[Record],
        ops: tuple[Any, Any, Any, Any],
        position_headers: Callable[..., tuple[tuple[str, bytes], ...]],
        header_names: tuple[str, str, str, str],
        schemas: bool,
        clock: Callable[[], int],
        dumps: Callable[[Any], bytes],
    ) -> None: ...
    def __call__(self, event: ChangeEvent | TruncateEvent | MessageEvent) -> list[Record]: ...

class AvroRecords:
    def __init__(
        self,
        serializer: EventSerializer[Any],
        reference: Callable[[ChangeEvent | TruncateEvent | MessageEvent], list[Record]],
        change_class: type[Any],
        row_class: type[Any],
        record_class: type[Record],
        ops: tuple[Any, Any, Any, Any],
        position_headers: Callable[..., tuple[tuple[str, bytes], ...]],
        header_names: tuple[str, str, str, str],
        clock: Callable[[], int],
        clock_error: Callable[[int], Exception],
        seq_prefix: bytes,
        lsn_prefix: bytes,
    ) -> None: ...
    def __call__(self, event: ChangeEvent | TruncateEvent | MessageEvent) -> list[Record]: ...
