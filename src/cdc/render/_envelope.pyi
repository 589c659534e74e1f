"""Type stub of the compiled JSON and Avro envelopes (``_envelope.pyx``); see ``cdc.render.codec``."""

from collections.abc import Callable
from typing import Any

class JsonRecords:
    def __init__(
        self,
        serializer: Any,
        reference: Callable[[Any], list[Any]],
        change_class: type[Any],
        row_class: type[Any],
        record_class: type[Any],
        ops: tuple[Any, Any, Any, Any],
        position_headers: Callable[..., tuple[tuple[str, bytes], ...]],
        header_names: tuple[str, str, str, str],
        schemas: bool,
        clock: Callable[[], int],
        dumps: Callable[[Any], bytes],
    ) -> None: ...
    def __call__(self, event: Any) -> list[Any]: ...

class AvroRecords:
    def __init__(
        self,
        serializer: Any,
        reference: Callable[[Any], list[Any]],
        change_class: type[Any],
        row_class: type[Any],
        record_class: type[Any],
        ops: tuple[Any, Any, Any, Any],
        position_headers: Callable[..., tuple[tuple[str, bytes], ...]],
        header_names: tuple[str, str, str, str],
        clock: Callable[[], int],
        pieces: Callable[[Any], tuple[Any, ...] | None],
        seq_prefix: bytes,
        lsn_prefix: bytes,
    ) -> None: ...
    def __call__(self, event: Any) -> list[Any]: ...
