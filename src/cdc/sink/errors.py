"""The sink's error: an event that cannot be written in the configured format."""


class SerializationError(Exception):
    """An event cannot be written in the configured format; the message says what to change."""


AVRO_LONG_MIN = -(2**63)
AVRO_LONG_MAX = 2**63 - 1


def clock_beyond_avro_long(now_ns: int) -> SerializationError:
    """The serializer's clock read a time an Avro long cannot hold (the envelope's ``ts_ns``). The reference
    and the compiled envelope raise this same error."""
    return SerializationError(
        f"the clock read {now_ns} ns since the epoch, beyond what an Avro long holds (the envelope's ts_ns): "
        "check the system clock of the daemon's host"
    )
