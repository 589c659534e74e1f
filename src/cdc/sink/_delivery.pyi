"""Type stub of the compiled at-least-once sender (``_delivery.pyx``); see ``cdc.sink.delivery``."""

from collections.abc import Callable
from typing import Any

class Sender:
    inflight_bytes: int
    inflight_records: int
    delivered: int
    entry: Any
    failed: Callable[[Any, Any], None] | None
    def __init__(
        self,
        produce: Callable[..., None],
        poll: Callable[[float], int],
        max_bytes: int,
        slow: Callable[[Any, str], None],
        classify: Callable[[Any, str], Exception],
        kafka_exception: type[BaseException],
        sink_error: type[Exception],
        any_partition: int,
    ) -> None: ...
    def send(self, record: Any, describe: str) -> None: ...
