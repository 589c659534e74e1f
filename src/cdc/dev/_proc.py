"""Process, port, lock and download helpers shared by the local dev services.

Everything here is deliberately small and synchronous: the services are started by
`cdc dev up` and by the pytest fixtures, never by the daemon itself.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

from cdc.dev.cache import cache_dir, file_lock

JAVA_INSTALL_HINT = "apt-get install openjdk-17-jre-headless"
MAVEN_INSTALL_HINT = "apt-get install maven"


class DevServiceError(RuntimeError):
    """A local dev service could not be prepared, started or stopped."""


PORT_IN_USE_MARKERS = ("Address already in use", "seems to be in use by another process")


def port_in_use(exc: DevServiceError) -> bool:
    """Whether a failed start looks like a lost race for the port (then: retry on another one)."""
    return any(marker in str(exc) for marker in PORT_IN_USE_MARKERS)


class FetchError(DevServiceError):
    """Maven could not fetch a service's artifacts."""


def logger(log: FilteringBoundLogger | None) -> FilteringBoundLogger:
    if log is not None:
        return log
    bound: FilteringBoundLogger = structlog.get_logger("cdc.dev")
    return bound


# --------------------------------------------------------------------------- files


START_HEADER = "===== "


def start_header(args: Sequence[str]) -> str:
    """The line written to a service log before each start; tail() reads from the last one."""
    return f"\n{START_HEADER}{time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(args)}\n"


def tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file since the latest start header, or a note that there is none."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log file at {path})"
    last_start = data.rfind("\n" + START_HEADER)
    if last_start >= 0:
        data = data[last_start + 1 :]
    text = "\n".join(data.splitlines()[-lines:])
    return f"--- last lines of {path} ---\n{text}"


def tails(paths: Sequence[Path], lines: int = 40) -> str:
    return "\n".join(tail(path, lines) for path in paths)


def read_json(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DevServiceError(f"corrupt state file {path}: {exc}; delete it to start afresh") from exc
    if not isinstance(value, dict):
        raise DevServiceError(f"corrupt state file {path}: expected a JSON object")
    return value


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def ensure_traversable(path: Path, log: FilteringBoundLogger) -> None:
    """Make every ancestor of `path` searchable by other users (o+x), as root only.

    PostgreSQL runs as an unprivileged user and must reach its data directory; a repository
    checked out under a 0700 home directory would otherwise make initdb fail obscurely.
    """
    if os.geteuid() != 0:
        return
    for parent in [path, *path.parents]:
        try:
            mode = parent.stat().st_mode
        except FileNotFoundError:
            continue
        if not mode & stat.S_IXOTH:
            os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXOTH)
            log.warning("dev.chmod_traversable", path=str(parent), reason="postgres runs as a non-root user")


# --------------------------------------------------------------------------- ports


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on the port now (as servers do, with SO_REUSEADDR, so a
    port held only by TIME_WAIT connections of a dead server of ours counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


# Ports handed out by this process in the last minutes, with the service they went to: services
# start side by side, and two bind(0) probes may otherwise return the same port before either
# server has bound it.
_handed_out: dict[int, tuple[str, float]] = {}
_handed_out_lock = threading.Lock()
_RESERVATION_S = 180.0


def _reserved_by_other(port: int, service: str) -> bool:
    entry = _handed_out.get(port)
    return entry is not None and entry[0] != service and time.monotonic() - entry[1] < _RESERVATION_S


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(service: str, host: str = "127.0.0.1", avoid: Sequence[int] = ()) -> int:
    """A free port, preferably below the kernel's ephemeral range.

    A port from bind(0) lies in the ephemeral range, where any outgoing connection on the
    machine (the tests open many) may take it before our server binds it.
    """
    low, high = _ephemeral_range()
    candidates: list[int] = []
    if low > 12000:
        candidates = random.sample(range(10000, low), min(100, low - 10000))
    elif high < 64000:
        candidates = random.sample(range(high + 1, 65535), min(100, 65535 - high - 1))
    with _handed_out_lock:
        for port in candidates:
            if port not in avoid and not _reserved_by_other(port, service) and port_is_free(port, host):
                _handed_out[port] = (service, time.monotonic())
                return port
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in avoid and not _reserved_by_other(port, service):
                _handed_out[port] = (service, time.monotonic())
                return port
    raise DevServiceError("could not find a free TCP port on 127.0.0.1")


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def choose_port(saved: object, log: FilteringBoundLogger, service: str, avoid: Sequence[int] = ()) -> int:
    """Reuse a saved port if it is still free, otherwise pick a new free one."""
    if isinstance(saved, int) and saved not in avoid and port_is_free(saved):
        with _handed_out_lock:
            if not _reserved_by_other(saved, service):
                _handed_out[saved] = (service, time.monotonic())
                return saved
    port = free_port(service, avoid=avoid)
    if isinstance(saved, int):
        log.warning("dev.port_changed", service=service, old_port=saved, new_port=port, reason="old port is taken")
    return port


# --------------------------------------------------------------------------- processes


def cmdline(pid: int) -> list[str] | None:
    """The command line of a live (non-zombie) process, or None."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # Field 3 of /proc/PID/stat is the state; it follows the parenthesised command name.
    state = status.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        reap(pid)
        return None
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


def reap(pid: int) -> None:
    """Collect the exit status of a child of ours, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def exact_arg(arg: str) -> str:
    """A marker that matches only a whole command-line argument."""
    return f"\0{arg}\0"


def process_matches(pid: int, markers: Sequence[str]) -> bool:
    """True when `pid` is alive and its command line contains every marker (see exact_arg)."""
    args = cmdline(pid)
    if args is None:
        return False
    joined = "\0" + "\0".join(args) + "\0"
    return all(marker in joined for marker in markers)


def read_pid(path: Path) -> int | None:
    try:
        first = path.read_text().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return None
    return int(first) if first.isdigit() else None


def find_by_markers(markers: Sequence[str]) -> list[int]:
    """Live processes whose command line contains every marker (a scan of /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and process_matches(int(entry.name), markers):
            found.append(int(entry.name))
    return sorted(found)


def peek_pid(pid_file: Path, markers: Sequence[str]) -> int | None:
    """Like live_pid, but read-only (for status)."""
    pid = read_pid(pid_file)
    if pid is not None and process_matches(pid, markers):
        return pid
    found = find_by_markers(markers)
    return found[0] if found else None


def live_pid(pid_file: Path, markers: Sequence[str], log: FilteringBoundLogger, service: str) -> int | None:
    """The pid of our live process: the one in `pid_file`, else one found by its command line.

    A stale pid file is removed; a process of ours that lost its pid file (an interrupted
    start) is adopted again, so that up() does not start a second one and down() stops it.
    """
    pid = read_pid(pid_file)
    if pid is not None and process_matches(pid, markers):
        return pid
    if pid is not None or pid_file.exists():
        log.info("dev.stale_pid_file", service=service, pid=pid, pid_file=str(pid_file))
        pid_file.unlink(missing_ok=True)
    found = find_by_markers(markers)
    if not found:
        return None
    if not pid_file.parent.is_dir():
        # Ours by its command line, but its state folder was deleted under it (a removed checkout):
        # it cannot be reused, and left running it would hold ports and memory. Stop it.
        for orphan in found:
            log.warning("dev.orphan_stopped", service=service, pid=orphan, state=str(pid_file.parent))
            stop_pid(orphan, markers, log, service)
        return None
    log.warning("dev.adopted_process", service=service, pid=found[0], others=found[1:])
    pid_file.write_text(f"{found[0]}\n")
    return found[0]


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cmdline(pid) is None:
            return True
        time.sleep(0.1)
    return cmdline(pid) is None


def stop_pid(
    pid: int,
    markers: Sequence[str],
    log: FilteringBoundLogger,
    service: str,
    *,
    sig: signal.Signals = signal.SIGTERM,
    timeout: float = 60.0,
    kill_sig: signal.Signals = signal.SIGKILL,
) -> None:
    """Stop a process we started, after checking its command line is the one we expect."""
    if not process_matches(pid, markers):
        log.info("dev.not_ours_or_gone", service=service, pid=pid)
        return
    log.info("dev.stopping", service=service, pid=pid, signal=sig.name)
    os.kill(pid, sig)
    if wait_exit(pid, timeout):
        log.info("dev.stopped", service=service, pid=pid)
        return
    if not process_matches(pid, markers):
        return
    log.warning("dev.stop_timeout", service=service, pid=pid, timeout_s=timeout, signal=kill_sig.name)
    os.kill(pid, kill_sig)
    if not wait_exit(pid, 15.0):
        raise DevServiceError(f"{service} (pid {pid}) did not exit after {kill_sig.name}")


# Starts "$@" in the background with its output appended to $1, and prints its pid. The shell
# exits at once, so the service is not our child: it is reparented to init, never lingers as
# our zombie, and outlives us without a Popen object to complain about it.
_SPAWN_SH = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'


def spawn(
    args: Sequence[str],
    *,
    log_file: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> int:
    """Start a long-running process detached from our session; stdout/stderr go to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as out:
        out.write(start_header(args).encode())
    proc = subprocess.run(
        ["/bin/sh", "-c", _SPAWN_SH, "sh", str(log_file), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=False,
        timeout=60,
    )
    pid = proc.stdout.strip()
    if proc.returncode != 0 or not pid.isdigit():
        raise DevServiceError(f"could not start {args[0]}: {proc.stderr.strip() or proc.stdout.strip()}")
    return int(pid)


def wait_ready(
    check: Callable[[], bool],
    *,
    pid: int,
    markers: Sequence[str],
    timeout: float,
    service: str,
    logs: Sequence[Path],
    interval: float = 0.25,
) -> None:
    """Poll `check` until it is true; fail early, with the log tails, if the process dies."""
    deadline = time.monotonic() + timeout
    while True:
        if not process_matches(pid, markers):
            raise DevServiceError(f"{service} (pid {pid}) exited during start-up\n{tails(logs)}")
        if check():
            return
        if time.monotonic() > deadline:
            raise DevServiceError(f"{service} (pid {pid}) not ready after {timeout:.0f}s\n{tails(logs)}")
        time.sleep(interval)


# --------------------------------------------------------------------------- java / maven


def find_java() -> str:
    """A Java 17+ executable (JAVA_HOME first, then PATH)."""
    candidates: list[str] = []
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidates.append(str(Path(java_home) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    for java in candidates:
        if not os.access(java, os.X_OK):
            continue
        major = java_major_version(java)
        if major >= 17:
            return java
    raise DevServiceError(
        f"Java 17 or newer is needed for Kafka and the schema registry; none found "
        f"(looked at {candidates or 'JAVA_HOME and PATH'}). Install it: {JAVA_INSTALL_HINT}"
    )


def java_major_version(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return 0
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_x" style
        major = int(match.group(2))
    return major


def find_maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevServiceError(
            f"Maven (mvn) is needed to fetch the Kafka jars from Maven Central. Install it: {MAVEN_INSTALL_HINT}"
        )
    return mvn


def package_text(name: str) -> str:
    return resources.files("cdc.dev").joinpath(name).read_text(encoding="utf-8")


def maven_fetch(
    pom_name: str,
    kind: str,
    label: str,
    log: FilteringBoundLogger,
    *,
    goal: Sequence[str] = ("dependency:copy-dependencies", "-DincludeScope=runtime"),
    postprocess: Callable[[Path], None] | None = None,
) -> Path:
    """Run a maven-dependency-plugin goal for a packaged pom into the cache, once.

    Returns `<cache>/<kind>/<label>-<hash of pom>/`, holding `libs/` with the artifacts (and
    whatever `postprocess` made of them). The directory appears atomically when complete, so an
    interrupted download is simply redone; a lock serialises concurrent callers.
    """
    pom = package_text(pom_name)
    digest = hashlib.sha256(pom.encode()).hexdigest()[:12]
    root = cache_dir() / kind
    target = root / f"{label}-{digest}"
    if (target / ".complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".lock"):
        if (target / ".complete").exists():
            return target
        mvn = find_maven()
        find_java()
        work = Path(tempfile.mkdtemp(prefix=f".{label}-", dir=root))
        try:
            (work / "pom.xml").write_text(pom)
            started = time.monotonic()
            log.info("dev.maven_fetch", artifact=label, cache=str(target))
            cmd = [
                mvn,
                "-B",
                "-q",
                "-Dstyle.color=never",
                "-f",
                str(work / "pom.xml"),
                *goal,
                f"-DoutputDirectory={work / 'libs'}",
            ]
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False, timeout=1800)
            if proc.returncode != 0:
                output = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                raise FetchError(f"Maven could not fetch {label} (exit {proc.returncode}):\n{output}")
            if postprocess is not None:
                postprocess(work)
            (work / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
            os.chmod(work, 0o755)  # mkdtemp made it 0700
            if target.exists():
                shutil.rmtree(target)
            os.replace(work, target)
            log.info("dev.maven_fetched", artifact=label, seconds=round(time.monotonic() - started, 1))
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return target
