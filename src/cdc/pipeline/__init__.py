"""The daemon: start-up checks, then Postgres -> decoder -> stages -> serializer -> Kafka, with the
acknowledged LSN going back.

- ``wiring``: every start-up check, then the frozen ``Components`` the loop runs with;
- ``stages``: the layers between decoder and serializer (snapshot hook, column policies, transaction
  metadata) and the chain that runs them; ``routing``: the outbox and messages outside transactions;
- ``loop``: one replication session (read, decode, chain, deliver, keep up);
- ``reconnect``: sessions until stop, one outage at a time; ``reload``: SIGHUP and table rescans;
- ``daemon``: ``cdc run`` (health endpoint, wiring, loop, signals).
"""

from cdc.pipeline.daemon import FATAL, Daemon, run
from cdc.pipeline.loop import Pipeline
from cdc.pipeline.wiring import Components, make_serializer, wire

__all__ = ["FATAL", "Components", "Daemon", "Pipeline", "make_serializer", "run", "wire"]
