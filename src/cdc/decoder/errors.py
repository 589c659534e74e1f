"""The decoder's error for a message that cannot become an event."""


class ChangeError(Exception):
    """A message that cannot become an event; the pipeline stops rather than skip it."""
