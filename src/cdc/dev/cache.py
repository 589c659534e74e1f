"""The download cache the dev services and the Spark jobs' jars share, and the lock around filling it.

Public: ``spark/cdc_views/jars.py`` fetches its jars into the same cache with the same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """``$CDC_CACHE_DIR``, else ``$XDG_CACHE_HOME/cdc``, else ``~/.cache/cdc``."""
    env = os.environ.get("CDC_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "cdc").resolve()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
