"""CPU seconds of the processes a benchmark depends on, from ``/proc`` (Linux).

The benchmarks run everything on one machine: the Postgres server, the Kafka broker and the
connector share its cores. Where a throughput target is a ratio between two measurements, the
CPU each side spends per row says whether a design can reach it at all: on ``n`` cores no
pipeline goes faster than ``n / (CPU seconds per row, all processes together)``.
"""

from __future__ import annotations

import os
from pathlib import Path

from cdc import dev

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int, tid: int | None = None) -> tuple[int, float, float] | None:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of a live process (or one of its threads)."""
    try:
        text = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return ppid, (utime + stime) / _TICK, (cutime + cstime) / _TICK


def process_cpu(pid: int) -> float:
    """CPU seconds of one process, all its threads, so far (0.0 once it is gone)."""
    stat = _stat(pid)
    return stat[1] if stat else 0.0


def main_thread_cpu(pid: int) -> float:
    """CPU seconds of a process's main thread (where a Python program runs its Python code)."""
    stat = _stat(pid, pid)
    return stat[1] if stat else 0.0


def tree_cpu(root: int) -> float:
    """CPU seconds of a process and of every process it started, live or exited (exited children are
    in the root's reaped-children time once the root waited for them, as a postmaster does at once).
    The difference of two readings is what the tree spent between them."""
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    if root not in stats:
        return 0.0
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total = stats[root][1] + stats[root][2]
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        total += stats[pid][1] + stats[pid][2]
        todo.extend(children.get(pid, []))
    return total


def self_cpu() -> float:
    """CPU seconds of this process so far (all threads; librdkafka's included)."""
    t = os.times()
    return t.user + t.system


class Services:
    """CPU seconds so far of the development services: the Postgres server (the postmaster's tree,
    exited backends and walsenders included) and the Kafka broker."""

    def __init__(self) -> None:
        status = dev.status(dev.default_state_dir())
        self._server = int(status["postgres"]["pid"])
        self._broker = int(status["kafka"]["pid"])

    def read(self) -> dict[str, float]:
        return {"server": tree_cpu(self._server), "broker": process_cpu(self._broker)}


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each process spent between two readings."""
    return {name: after[name] - before[name] for name in before}
