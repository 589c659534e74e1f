"""stream_with_retries: a stop asked for during an outage ends it at once, instead of retrying (and
sleeping up to 30 s between tries) until reconnect_timeout_s, which kept a SIGTERMed daemon alive for
minutes while its primary was down."""

from __future__ import annotations

import threading
import time

import pytest

from cdc.pipeline.reconnect import stream_with_retries
from cdc.replication import ConnectionLost


def test_a_stop_during_an_outage_ends_the_retries_at_once() -> None:
    stop = threading.Event()
    attempts = 0

    def session() -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionLost("the primary is gone")

    threading.Timer(2.0, stop.set).start()  # SIGTERM two seconds into the outage, mid-backoff
    started = time.monotonic()
    stream_with_retries(session, lambda: None, reconnect_timeout_s=300, stopping=stop.is_set)
    assert time.monotonic() - started < 3.0
    assert 2 <= attempts <= 4  # 0.5 s, 1 s, 2 s backoff: a few tries, then the stop


def test_without_a_stop_an_outage_still_ends_at_the_reconnect_timeout() -> None:
    def session() -> None:
        raise ConnectionLost("the primary is gone")

    with pytest.raises(ConnectionLost):
        stream_with_retries(session, lambda: None, reconnect_timeout_s=1.0)
