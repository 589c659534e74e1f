"""The daemon's main thread per row, over WAL captured once: CPU µs and Python calls a row, no server noise.

One command: ``.venv/bin/python bench/rowpath.py --rows 200000 --runs 6``

``e2e.py`` times the whole system, so on a 2-core machine the walsender, the broker and whatever
else runs take turns with the daemon and its figures spread by 10-20% from run to run. This
benchmark holds everything but the daemon's own work still:

1. once: a workload of ``--rows`` inserts (the 6-column row of ``decoder.py``) is written and its
   pgoutput frames are read from a slot of their own into memory (a pickle in the work directory);
2. per run, in a fresh process: the real daemon (``cdc.pipeline.daemon.Daemon``: wiring, chain,
   serializer, delivery to the dev Kafka, 3 partitions) runs on that configuration with its
   replication transport swapped for one that hands out the captured frames, and the main thread's
   CPU time (``time.thread_time``) is taken from the first frame to the last;
3. ``--calls`` adds one run under cProfile: Python function calls per row (a count, not a time,
   so it is the same on any machine) and the functions with the most own time.

``--instructions N`` counts the instructions the daemon's process executes per row under valgrind
(callgrind), from runs over the first N and 2N rows of the capture: a count, so two versions can be
told apart by a few percent even when the machine's speed is not steady (needs valgrind; slow).

``--perf`` adds one run under Linux ``perf record`` (sampling, monotonic clock) and prints where the main
thread's samples fall between the first frame and the last: the interpreter, the compiled codec and
envelopes, confluent-kafka and librdkafka, libc, the kernel; and the busiest C functions. It tells the
Python glue around the compiled parts from the work they do (needs ``perf``; apt-get install linux-perf).

``--compare SRC`` alternates every run with another checkout's ``src`` (one with the same wiring
API, e.g. a git worktree of an earlier commit) and prints the pairwise ratio, so two versions are
measured in the same machine state. The runs are ABBA-ordered. ``--compare-reference`` does the
same with this checkout on its pure-Python row codec (``CDC_PURE_PYTHON=1``) as the other side.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DRIVE_SLOT = "bench_rowpath"
DB = "cdc_bench_decoder"  # bench/decoder.py's database, where the capture's slot is


def capture(rows: int, path: Path) -> None:
    """Write the workload and keep its frames (and where the daemon finds the services) in ``path``."""
    import psycopg
    import structlog

    from cdc import dev
    from cdc.lsn import Lsn
    from cdc.replication import ReplicationStream, protocol_for
    from decoder import PUBLICATION, create_slots, setup_database, write_rows  # bench/decoder.py

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    endpoints = dev.up(dev.default_state_dir())
    dsn = setup_database(endpoints.postgres_dsn)
    create_slots(dsn, ["bench_rowpath_capture", DRIVE_SLOT])
    target = write_rows(dsn, rows, 1000)
    stream = ReplicationStream(dsn)
    stream.connect()
    proto, options = protocol_for(stream.server_version, streaming=False)
    stream.start("bench_rowpath_capture", PUBLICATION, Lsn(0), proto_version=proto, options=options, messages=True)
    frames: list[tuple[int, bytes]] = []
    try:
        while True:
            frame = stream.read(5.0)
            if frame is None:
                raise SystemExit("the stream went quiet before the workload's end")
            frames.append((int(frame[0]), bytes(frame[1])))
            # Commit: b"C", flags, commit LSN, end LSN, timestamp
            if frame[1][0] == 0x43 and struct.unpack_from(">Q", frame[1], 10)[0] >= int(target):
                break
    finally:
        stream.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('bench_rowpath_capture')")
    inserts = sum(1 for _, payload in frames if payload[:1] == b"I")
    if inserts != rows:
        raise SystemExit(f"captured {inserts} inserts, expected {rows}")
    path.write_bytes(pickle.dumps({"server": endpoints.postgres_dsn, "frames": frames, "rows": rows}))


def captured_on(path: Path) -> str | None:
    """The dev server a capture was taken on (its database and slot live there), or None."""
    try:
        return str(pickle.loads(path.read_bytes())["server"])
    except (OSError, EOFError, KeyError, pickle.UnpicklingError):
        return None


def first_rows(frames: list[tuple[int, bytes]], rows: int) -> list[tuple[int, bytes]]:
    """The frames up to the commit of the transaction holding the ``rows``-th insert."""
    seen = 0
    for at, (_, payload) in enumerate(frames):
        seen += payload[:1] == b"I"
        if seen >= rows and payload[:1] == b"C":
            return frames[: at + 1]
    raise SystemExit(f"the capture holds {seen} rows, fewer than {rows}")


def drive(path: Path, fmt: str, profile: Path | None, rows: int | None = None) -> dict[str, Any]:
    """One run of the real daemon over the captured frames, in this process; its figures."""
    import psycopg
    import structlog

    from cdc import dev
    from cdc.config import load_config
    from cdc.lsn import Lsn
    from cdc.pipeline import wiring
    from cdc.pipeline.daemon import Daemon
    from cdc.process import tune_gc

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    data = pickle.loads(path.read_bytes())
    if rows is not None:
        data["frames"], data["rows"] = first_rows(data["frames"], rows), rows
    frames = [(Lsn(lsn), memoryview(payload)) for lsn, payload in data["frames"]]
    endpoints = dev.up(dev.default_state_dir(), registry=fmt == "avro")
    dsn = psycopg.conninfo.make_conninfo(endpoints.postgres_dsn, dbname=DB)
    clock: dict[str, float] = {}
    daemon: Daemon | None = None

    class Captured:
        """The replication transport's interface, over the captured frames."""

        server_version = 150000

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.flushed = Lsn(0)
            self.at = 0

        def connect(self) -> None: ...
        def start(self, *args: Any, **kwargs: Any) -> None: ...
        def send_status_if_due(self) -> None: ...
        def send_status(self, **kwargs: Any) -> None: ...
        def close(self) -> None: ...

        def confirm(self, lsn: Lsn) -> None:
            self.flushed = max(self.flushed, lsn)

        def read(self, timeout: float) -> tuple[Lsn, memoryview] | None:
            at = self.at
            if at == 0:
                clock["cpu0"], clock["wall0"] = time.thread_time(), time.perf_counter()
                clock["mono0"] = time.monotonic()
            if at < len(frames):
                self.at = at + 1
                return frames[at]
            if "cpu1" not in clock:
                clock["cpu1"], clock["wall1"] = time.thread_time(), time.perf_counter()
                clock["mono1"] = time.monotonic()
                assert daemon is not None
                daemon.stop()
            return None

    work = Path(tempfile.mkdtemp(prefix="rowpath-"))
    config: dict[str, Any] = {
        "source": {"dsn": dsn, "slot": DRIVE_SLOT, "publication": "bench_decoder_pub"},
        "tables": ["public.bench_rows"],
        "kafka": {"bootstrap_servers": endpoints.kafka_bootstrap, "partitions": 3},
        "topic_prefix": f"bench_rowpath_{os.getpid()}",
        "http": {"enabled": False},
        "snapshot": {"mode": "no_data"},
        "format": fmt,
    }
    if fmt == "avro":
        config["schema_registry"] = {"url": endpoints.schema_registry_url}
    (work / "cdc.yaml").write_text(json.dumps(config))  # JSON is YAML
    setattr(wiring, "ReplicationStream", Captured)  # noqa: B010  (the transport the wiring builds)
    tune_gc()  # as cdc run has it
    daemon = Daemon(load_config(work / "cdc.yaml"))
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        daemon.run()
        profiler.disable()
        profiler.dump_stats(profile)
    else:
        daemon.run()
    rows = data["rows"]
    from cdc.render import codec

    return {
        "us_cpu": (clock["cpu1"] - clock["cpu0"]) / rows * 1e6,
        "us_wall": (clock["wall1"] - clock["wall0"]) / rows * 1e6,
        "rows": rows,
        "codec": codec.IMPLEMENTATION,
        "window": [clock["mono0"], clock["mono1"]],  # time.monotonic(): for --perf's samples
        "pid": os.getpid(),
    }


REFERENCE = "reference"  # --compare-reference: this checkout with CDC_PURE_PYTHON=1 (cdc.render.codec)


def one_run(
    src: str | None,
    path: Path,
    fmt: str,
    profile: Path | None = None,
    rows: int | None = None,
    callgrind: Path | None = None,
    perf: Path | None = None,
) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("CDC_PURE_PYTHON", None)
    if src == REFERENCE:
        env["CDC_PURE_PYTHON"], src = "1", None
    env["PYTHONPATH"] = src if src is not None else str(HERE.parent / "src")
    command = [sys.executable, str(Path(__file__).resolve()), "--drive", str(path), "--format", fmt]
    if profile is not None:
        command += ["--profile-to", str(profile)]
    if rows is not None:
        command += ["--drive-rows", str(rows)]
    if callgrind is not None:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", *command]
    if perf is not None:
        command = ["perf", "record", "--quiet", "-k", "CLOCK_MONOTONIC", "-F", "1999", "-o", str(perf), "--", *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a run failed ({src or 'this checkout'}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    result = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    if callgrind is not None:
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise SystemExit(f"valgrind printed no instruction count:\n{done.stderr[-2000:]}")
        result["instructions"] = int(found.group(1))
    return result


def instructions_per_row(src: str | None, path: Path, fmt: str, rows: int, work: Path) -> float:
    """Instructions the whole daemon process executes per row (valgrind's count, the same on any machine state):
    the difference between ``rows`` and ``2 * rows`` of the same capture, so start-up and stop cancel out."""
    counts = [
        int(one_run(src, path, fmt, rows=n, callgrind=work / "callgrind.out")["instructions"]) for n in (rows, 2 * rows)
    ]
    return (counts[1] - counts[0]) / rows


def calls_per_row(profile: Path, rows: int) -> tuple[float, list[tuple[float, str]]]:
    import pstats

    stats: dict[Any, Any] = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    python = sum(v[1] for k, v in stats.items() if k[0] != "~")
    top = sorted(((v[2] / rows * 1e6, f"{Path(k[0]).name}:{k[2]}") for k, v in stats.items()), reverse=True)[:12]
    return python / rows, top


# --perf: the shared objects of the main thread's samples, by what they are
PERF_GROUPS = (
    ("the interpreter (libpython: bytecode, objects, allocation)", ("libpython",)),
    ("the compiled row codec and envelopes (cdc.render._compiled, _envelope)", ("_compiled.", "_envelope.")),
    ("confluent-kafka and librdkafka (produce, delivery reports)", ("cimpl.", "librdkafka")),
    ("libc (malloc, memcpy)", ("libc.so", "libc-")),
    ("the kernel and vdso (syscalls, page faults, clock reads)", ("[kernel", "[vdso")),
)


def perf_breakdown(
    data: Path, pid: int, window: list[float]
) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """The main thread's (tid == pid) samples between the first frame and the last: their count, the share of each
    group of shared objects, and the busiest symbols."""
    out = subprocess.run(
        ["perf", "script", "-i", str(data), "--tid", str(pid), "-F", "time,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line_re = re.compile(r"\s*([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")
    groups: dict[str, int] = {}
    symbols: dict[str, int] = {}
    n = 0
    for line in out.splitlines():
        m = line_re.match(line)
        if m is None or not window[0] <= float(m.group(1)) <= window[1]:
            continue
        n += 1
        dso = Path(m.group(3)).name
        group = next((name for name, marks in PERF_GROUPS if any(mark in dso for mark in marks)), "other")
        groups[group] = groups.get(group, 0) + 1
        symbol = f"{m.group(2) or '?'} ({dso.split('.cpython')[0]})"
        symbols[symbol] = symbols.get(symbol, 0) + 1
    if n == 0:
        raise SystemExit("perf recorded no sample of the main thread in the run's window")
    shares = sorted(((g, c / n) for g, c in groups.items()), key=lambda x: -x[1])
    top = sorted(((sym, c / n) for sym, c in symbols.items()), key=lambda x: -x[1])[:15]
    return n, shares, top


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--format", default="json", choices=["json", "avro"])
    parser.add_argument("--compare", metavar="SRC", help="another checkout's src directory, run alternately")
    parser.add_argument(
        "--compare-reference",
        action="store_true",
        help=(
            "alternate with this checkout on its pure-Python row codec (CDC_PURE_PYTHON=1) instead of another checkout"
        ),
    )
    parser.add_argument("--calls", action="store_true", help="one more run under cProfile: Python calls per row")
    parser.add_argument(
        "--perf", action="store_true", help="one more run under perf record: where the main thread's time goes"
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "cdc-bench-rowpath")
    parser.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="also count instructions per row under valgrind: runs of N and 2N rows (slow: ~2 minutes a run at 20000)",
    )
    parser.add_argument("--drive", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--drive-rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive is not None:  # a child run
        print(json.dumps(drive(args.drive, args.format, args.profile_to, args.drive_rows)))
        return 0
    if args.compare_reference:
        if args.compare:
            parser.error("--compare and --compare-reference are exclusive")
        args.compare = REFERENCE

    if args.perf and shutil.which("perf") is None:
        parser.error("--perf needs perf: apt-get install linux-perf")
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind: apt-get install valgrind")
    if args.instructions and 2 * args.instructions > args.rows:
        parser.error(f"--instructions {args.instructions} needs --rows of at least {2 * args.instructions}")
    args.work.mkdir(parents=True, exist_ok=True)
    frames = args.work / f"frames-{args.rows}.pickle"
    import structlog

    from cdc import dev

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    if captured_on(frames) != dev.up(dev.default_state_dir()).postgres_dsn:  # none yet, or another server's
        capture(args.rows, frames)
    print(f"{args.rows:,} captured rows ({frames}); {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
    here: list[float] = []
    other: list[float] = []
    codecs: dict[str, str] = {}
    for i in range(args.runs):
        order = ["here", "other"] if i % 4 in (0, 3) else ["other", "here"]
        for who in order:
            if who == "other" and args.compare is None:
                continue
            result = one_run(None if who == "here" else args.compare, frames, args.format)
            (here if who == "here" else other).append(result["us_cpu"])
            codecs[who] = str(result.get("codec", "?"))
        line = f"run {i + 1}: this checkout ({codecs['here']} codec) {here[-1]:.2f} µs a row"
        if args.compare:
            line += f", {args.compare} ({codecs['other']} codec) {other[-1]:.2f}"
        print(line)
    print(f"median main-thread CPU a row ({args.format}): this checkout {statistics.median(here):.2f} µs")
    if args.compare:
        ratios = [a / b for a, b in zip(here, other, strict=True)]
        print(
            f"median {args.compare}: {statistics.median(other):.2f} µs; this / that: median of pairs "
            f"{statistics.median(ratios):.3f} (each pair run back to back)"
        )
    if args.instructions:
        for who, src in [("this checkout", None), (args.compare, args.compare)]:
            if who is None:
                continue
            per_row = instructions_per_row(src, frames, args.format, args.instructions, args.work)
            print(
                f"{who}: {per_row:,.0f} instructions a row (valgrind, {args.instructions:,} and "
                f"{2 * args.instructions:,} rows)"
            )
    if args.perf:
        for who, src in [("this checkout", None), (args.compare, args.compare)]:
            if who is None:
                continue
            data = args.work / "perf.data"
            result = one_run(src, frames, args.format, perf=data)
            n, shares, busiest = perf_breakdown(data, int(result["pid"]), list(result["window"]))
            print(
                f"{who}: {n} perf samples of the main thread over the rows ({result['us_cpu']:.2f} µs a row in "
                "this run):"
            )
            for group, share in shares:
                print(f"  {100 * share:5.1f}%  {group}")
            print("  busiest functions:")
            for symbol, share in busiest:
                print(f"  {100 * share:5.1f}%  {symbol}")
    if args.calls:
        for who, src in [("this checkout", None), (args.compare, args.compare)]:
            if who is None:
                continue
            profile = args.work / "profile.pstats"
            one_run(src, frames, args.format, profile)
            calls, top = calls_per_row(profile, args.rows)
            print(f"{who}: {calls:.2f} Python function calls a row; most own time (µs a row, under cProfile):")
            for micros, name in top:
                print(f"  {micros:7.2f}  {name}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
