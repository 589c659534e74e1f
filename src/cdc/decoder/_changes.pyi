"""Type stub of the compiled fast path of the decoder (``_changes.pyx``); see ``cdc.decoder.changes``."""

from collections.abc import Callable
from typing import Any

class FastChanges:
    def __init__(
        self,
        decoder: Any,
        reference: Callable[[int, bytes, int, Any], Any],
        change_class: type[Any],
        ops: tuple[Any, Any, Any],
        key_of: Callable[[Any, Any], Any],
        declines: tuple[type[BaseException], ...],
        nothing_unchanged: frozenset[str],
    ) -> None: ...
    def __call__(self, kind: int, buffer: bytes, at: int, lsn: Any) -> Any: ...
