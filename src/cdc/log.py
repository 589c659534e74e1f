"""structlog set-up: JSON lines for machines, a readable renderer on a terminal."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog


class MultilineBelow:
    """Console only: the ConsoleRenderer, with each value of several lines (an error naming several
    problems and their fixes) printed below the event line, its lines indented, instead of one quoted
    string with literal \\n in it."""

    def __init__(self) -> None:
        self._inner = structlog.dev.ConsoleRenderer()

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        below = {k: v for k, v in event_dict.items() if k != "event" and isinstance(v, str) and "\n" in v}
        for key in below:
            del event_dict[key]
        line = str(self._inner(logger, method, event_dict))
        for key, value in below.items():
            line += f"\n    {key}: " + value.replace("\n", "\n      ")
        return line


class _Stderr:
    """``sys.stderr`` as it is at each write, not as it was at ``configure``: loggers are cached on first
    use, and a test's captured stream (or a redirected one) is closed and replaced after them."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(fmt: Literal["auto", "json", "console"] = "auto", level: str = "info") -> None:
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if fmt == "console" or (fmt == "auto" and sys.stderr.isatty()):
        processors.append(MultilineBelow())
    else:
        processors.append(structlog.processors.JSONRenderer())
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
