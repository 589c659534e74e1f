"""The decoder with row rendering alone, compiled codec against the reference: CPU and Python calls a row.

One command (after ``rowpath.py`` captured its frames)::

    .venv/bin/python bench/codec.py --format json --processes 2

Offline over ``rowpath.py``'s capture (``--capture``, default its 200,000-row one): ``ChangeDecoder.feed``
with the format's ``row_rendering`` (as ``cdc run`` decodes), no Kafka, no serializer beyond the
rendering. Each process runs the capture 5 times (the fastest and the median are printed) and once more
under cProfile (Python function calls a row); processes alternate between the compiled codec and the
reference (``CDC_PURE_PYTHON=1``). Every row must come out rendered, or the run stops.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COLUMNS = ("id", "name", "amount", "code", "created", "ref")  # bench/decoder.py's bench_rows


def measure(capture: Path, fmt: str) -> dict[str, Any]:
    import cProfile
    import pstats

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    from cdc.decoder.changes import ChangeDecoder
    from cdc.event import TableInfo
    from cdc.lsn import Lsn
    from cdc.render.codec import IMPLEMENTATION, TableRenderer
    from cdc.sink.avro import AvroSerializer, AvroSettings
    from cdc.sink.json import JsonSerializer, JsonSettings
    from cdc.sink.rendering import RenderedRow

    sys.path.insert(0, str(HERE.parent))
    from tests.unit.test_avro import FakeRegistry  # an in-memory registry

    data = pickle.loads(capture.read_bytes())
    frames = [(Lsn(lsn), payload) for lsn, payload in data["frames"]]
    rows = data["rows"]
    table = TableInfo("public", "bench_rows", 0, "d", ("id",), COLUMNS, frozenset({"id"}))

    def decoder() -> Any:
        if fmt == "json":
            serializer: Any = JsonSerializer(JsonSettings(topic_prefix="p", database="db"), lambda topic: 3)
        else:
            serializer = AvroSerializer(AvroSettings(topic_prefix="p", database="db"), lambda topic: 3, FakeRegistry())
        return ChangeDecoder({"public.bench_rows": table}, {}, renderer=TableRenderer(serializer.row_rendering))

    def run(dec: Any) -> int:
        rendered = 0
        for lsn, payload in frames:
            for event in dec.feed(payload, lsn):
                rendered += type(getattr(event, "after", None)) is RenderedRow
        return rendered

    times = []
    for _ in range(5):
        dec = decoder()
        start = time.thread_time()
        if run(dec) != rows:
            raise SystemExit("not every row was rendered")
        times.append((time.thread_time() - start) / rows * 1e6)
    profiler = cProfile.Profile()
    dec = decoder()
    profiler.enable()
    run(dec)
    profiler.disable()
    stats: dict[Any, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    calls = sum(v[1] for k, v in stats.items() if k[0] != "~") / rows
    times.sort()
    return {"codec": IMPLEMENTATION, "fastest": times[0], "median": times[2], "calls": calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", default="json", choices=["json", "avro"])
    parser.add_argument("--processes", type=int, default=2, help="processes per codec, alternated")
    parser.add_argument(
        "--capture", type=Path, default=Path(tempfile.gettempdir()) / "cdc-bench-rowpath" / "frames-200000.pickle"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.capture, args.format)))
        return 0
    if not args.capture.exists():
        parser.error(f"no capture at {args.capture}: run bench/rowpath.py first (or give --capture)")
    for i in range(2 * args.processes):
        env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
        env.pop("CDC_PURE_PYTHON", None)
        if i % 2 == 1:
            env["CDC_PURE_PYTHON"] = "1"
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--measure",
            "--format",
            args.format,
            "--capture",
            str(args.capture),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{args.format} {r['codec']:9}: CPU a row fastest {r['fastest']:.2f} µs, median {r['median']:.2f} µs; "
            f"Python calls a row {r['calls']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
