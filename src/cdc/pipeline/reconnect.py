"""Replication sessions until stop, reconnecting after a lost connection, one outage at a time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import structlog
import tenacity

from cdc.replication import ConnectionLost, SlotBusy
from cdc.sink.delivery import RetryableSinkError

log = structlog.get_logger("cdc.pipeline")

# A replication session that has streamed this long ends an outage (or reconnect_timeout_s, when shorter):
# the next loss starts a new one, with the whole timeout and the backoff from its start. Sessions that
# fail sooner belong to the outage they came out of, so a flapping connection backs off and gives up.
STABLE_SESSION_S: Final = 30.0
RECONNECTABLE: Final = (ConnectionLost, SlotBusy, RetryableSinkError)


class _OutageOver(Exception):
    """A session that had streamed stably was lost: the retries of the outage before it are over."""

    def __init__(self, streamed_s: float) -> None:
        super().__init__(f"lost after streaming for {streamed_s:.1f}s")
        self.streamed_s = streamed_s


def stream_with_retries(
    session: Callable[[], None],
    streaming_since: Callable[[], float | None],
    reconnect_timeout_s: float,
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Run ``session`` until it returns, again after each reconnectable failure.

    ``reconnect_timeout_s`` bounds one outage. tenacity's clock and backoff run from the first
    attempt of its loop, so each outage gets a loop of its own: one loop for the daemon's life
    would stop at the first loss after ``reconnect_timeout_s`` of healthy streaming. A stop asked for
    (SIGTERM) during an outage ends it at once: the backoff's sleep is cut short and nothing is retried
    (nothing was lost: the slot keeps the position for the next start).
    """
    stable_s = min(STABLE_SESSION_S, reconnect_timeout_s)

    def nap(seconds: float) -> None:
        end = time.monotonic() + seconds
        while not stopping() and time.monotonic() < end:
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))

    def session_of_outage() -> None:
        """One session; its loss after ``stable_s`` of streaming ends the outage it came out of."""
        try:
            session()
        except RECONNECTABLE as exc:
            since = streaming_since()
            if since is not None and time.monotonic() - since >= stable_s:
                raise _OutageOver(time.monotonic() - since) from exc
            raise

    while True:
        retry = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, RECONNECTABLE) and not stopping()),
            sleep=nap,
            wait=tenacity.wait_exponential(multiplier=0.5, max=30),
            stop=tenacity.stop_after_delay(reconnect_timeout_s),
            before_sleep=lambda rs: log.warning(
                "replication_retry",
                attempt=rs.attempt_number,
                error=str(rs.outcome.exception()) if rs.outcome else None,
            ),
            reraise=True,
        )
        try:
            for attempt in retry:
                with attempt:
                    session_of_outage()
            return
        except RECONNECTABLE as exc:
            if stopping():
                log.info("stopped_during_outage", error=str(exc))
                return
            raise
        except _OutageOver as over:
            log.warning("replication_lost", error=str(over.__cause__), streamed_s=round(over.streamed_s, 1))
