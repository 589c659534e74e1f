"""Process-wide settings of the daemon and its snapshot workers."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """The daemon allocates a few short-lived, acyclic objects per row (dicts, tuples, records) which
    reference counting frees; the cyclic collector's default thresholds made it walk the heap every
    700 of them. Everything alive at start-up (modules, configuration) is frozen out of its walks and
    collections run every 50,000 allocations, which takes decoding and JSON serialization each a
    good part less CPU on the benchmark row (bench/README.md, "Figures behind the code's choices")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
