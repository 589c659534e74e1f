"""The one error of the start-up checks."""

from __future__ import annotations


class StartupError(Exception):
    """The source is not ready for capture; the message names the problem and the fix."""
