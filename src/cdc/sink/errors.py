"""The sink's error: an event that cannot be written in the configured format."""


class SerializationError(Exception):
    """An event cannot be written in the configured format; the message says what to change."""
