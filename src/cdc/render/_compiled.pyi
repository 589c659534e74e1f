"""Type stub of the compiled row codec (``_compiled.pyx``); see ``cdc.render.codec``."""

from collections.abc import Callable
from typing import Any

from cdc.sink.rendering import RowRendering

class RowCodec:
    rendered: bool
    def __init__(
        self,
        rendering: RowRendering,
        parsers: tuple[Callable[[bytes], Any], ...],
        pieces: tuple[bytes, ...],
        key_pieces: tuple[bytes, ...],
        row_class: type[Any],
        decline: type[BaseException],
        unescape: Callable[[bytes], bytes] | None = None,
    ) -> None: ...
    def __call__(self, buffer: bytes | bytearray | memoryview, pos: int) -> tuple[Any, int]: ...
    def copy_row(self, buffer: bytes | bytearray | memoryview) -> Any: ...
    def copy_record(
        self,
        buffer: bytes | bytearray | memoryview,
        key_head: bytes,
        key_end: bytes,
        value_head: bytes,
        value_end: bytes,
    ) -> tuple[bytes, bytes]: ...
