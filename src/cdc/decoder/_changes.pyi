"""Type stub of the compiled fast path of the decoder (``_changes.pyx``); see ``cdc.decoder.fast``."""

from collections.abc import Callable

from cdc.decoder.state import DecodedRelation, TxState
from cdc.event import AnyRow, ChangeEvent, Op
from cdc.lsn import Lsn

class FastChanges:
    def __init__(
        self,
        tx: TxState,
        reference: Callable[[int, bytes, int, Lsn], ChangeEvent | None],
        change_class: type[ChangeEvent],
        ops: tuple[Op, Op, Op],
        key_of: Callable[[AnyRow, DecodedRelation], AnyRow],
        declines: tuple[type[BaseException], ...],
        nothing_unchanged: frozenset[str],
    ) -> None: ...
    def __call__(self, kind: int, buffer: bytes, at: int, lsn: Lsn, /) -> ChangeEvent | None: ...
