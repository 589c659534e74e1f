"""Reading a ``COPY ... TO STDOUT``'s lines with one call into libpq per line.

psycopg's ``Copy.read()`` runs four Python frames per line (``read``, the connection's ``wait``, two
generators) even when libpq has the line buffered already, which it nearly always has: it reads the
socket in blocks of many lines. ``lines`` asks libpq for a buffered line first
(``PGconn.get_copy_data(1)``, which never blocks) and leaves waiting for the socket, and the COPY's
end, to psycopg. When libpq itself reports the end (-1: the server's CopyDone was buffered too),
``lines`` reads the COPY's result as psycopg does (an error becomes the ``psycopg.Error`` psycopg
would raise) and marks the ``Copy`` finished, so that leaving its ``with`` block reads nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import pq

__all__ = ["line_calls", "lines"]


def lines(copy: psycopg.Copy) -> Iterator[Any]:
    """The COPY's lines (buffers ending in a newline, as ``copy.read()`` returns them), until its end."""
    get, read, end = line_calls(copy)
    while True:
        nbytes, data = get(1)
        if nbytes > 0:
            yield data
        elif nbytes == 0:  # nothing buffered: psycopg waits for the socket (and sees the end, if it is that)
            data = read()
            if not data:
                return
            yield data
        else:
            end()
            return


def line_calls(copy: psycopg.Copy) -> tuple[Callable[[int], tuple[int, Any]], Callable[[], Any], Callable[[], None]]:
    """``lines``'s three calls, for a loop that reads the lines itself (``cdc.snapshot.send``): libpq's buffered
    line (``(> 0, line)``, ``(0, ...)`` nothing buffered, ``(-1, ...)`` the end), psycopg's read that waits
    for the socket (empty at the end), and what follows libpq's end. A psycopg without the ``Copy``'s
    finished state: nothing is ever buffered, every line comes through its read."""
    if not isinstance(getattr(copy, "_finished", None), bool):
        return _nothing_buffered, copy.read, _never
    pgconn = copy.connection.pgconn
    return pgconn.get_copy_data, copy.read, lambda: _end(copy, pgconn)


def _nothing_buffered(_async: int) -> tuple[int, Any]:
    return 0, b""


def _never() -> None:
    raise AssertionError("only after libpq reported the end")


def _end(copy: psycopg.Copy, pgconn: Any) -> None:
    """libpq reported the COPY's end: its result decides, as in ``psycopg.generators.copy_from``."""
    results = []
    while (result := pgconn.get_result()) is not None:
        results.append(result)
    copy._finished = True
    if len(results) != 1:
        raise psycopg.ProgrammingError("you cannot mix COPY with other operations")
    if results[0].status != pq.ExecStatus.COMMAND_OK:
        raise psycopg.errors.error_from_result(results[0], encoding=copy.connection.info.encoding)
