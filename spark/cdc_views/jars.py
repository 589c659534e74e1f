"""The jars the jobs put on ``spark.jars``: fetched once by the set-up script, never at run time.

``fetch()`` runs Maven (``dependency:copy-dependencies``) on ``spark/jars-pom.xml`` with the Spark
and Delta versions of the installed ``pyspark`` and ``delta-spark`` packages, into
``$CDC_CACHE_DIR/spark-jars/spark-<v>-delta-<v>-<pom hash>/libs`` (default ``~/.cache/cdc``).
The directory appears atomically when complete (a ``.complete`` file marks it), so an interrupted
download is simply redone; a lock serialises concurrent callers.

``job_jars()`` only looks: it returns the cached jars or raises ``JarsMissing`` naming the command
that fetches them. Jobs call that one, so a job never reaches the network.

Command line: ``python -m cdc_views.jars fetch`` (what ``scripts/fetch-spark-jars.sh`` runs),
``python -m cdc_views.jars list``, ``python -m cdc_views.jars submit-args`` (``--jars a.jar,b.jar``
for ``spark-submit``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import structlog

from cdc.dev.cache import cache_dir, file_lock

log = structlog.get_logger("cdc_views.jars")

POM = Path(__file__).resolve().parent.parent / "jars-pom.xml"
FETCH_COMMAND = "bash scripts/fetch-spark-jars.sh"
REQUIRED_PREFIXES = (
    "spark-sql-kafka-0-10_",
    "spark-token-provider-kafka-0-10_",
    "kafka-clients-",
    "commons-pool2-",
    "spark-avro_",
    "delta-spark_",
    "delta-storage-",
)


class JarsMissing(RuntimeError):
    """The jar cache for the installed pyspark/delta-spark is absent or incomplete."""


class FetchFailed(RuntimeError):
    """Maven could not fetch the jars."""


@dataclass(frozen=True, slots=True)
class Versions:
    spark: str
    delta: str

    @classmethod
    def installed(cls) -> Versions:
        try:
            return cls(spark=metadata.version("pyspark"), delta=metadata.version("delta-spark"))
        except metadata.PackageNotFoundError as exc:
            raise JarsMissing(
                f"the Python package {exc.name} is not installed: install the spark extra (pip install -e '.[spark]')"
            ) from None


def pyspark_jackson_version() -> str:
    """The version of the jackson-databind jar the installed pyspark ships (``pyspark/jars``).

    Delta Kernel needs one Jackson module pyspark lacks (``jackson-datatype-jdk8``); the POM fetches
    it at this version, so that Jackson on the class path is one version, pyspark's.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise JarsMissing(
            "the Python package pyspark is not installed: install the spark extra (pip install -e '.[spark]')"
        )
    jars_dir = Path(next(iter(spec.submodule_search_locations))) / "jars"
    found = sorted(jars_dir.glob("jackson-databind-*.jar"))
    if len(found) != 1:
        raise FetchFailed(f"expected one jackson-databind jar in {jars_dir}, found {[j.name for j in found]}")
    return found[0].name.removeprefix("jackson-databind-").removesuffix(".jar")


def cache_root() -> Path:
    """``$CDC_CACHE_DIR/spark-jars`` (default ``$XDG_CACHE_HOME/cdc`` or ``~/.cache/cdc``), as the dev services do."""
    return cache_dir() / "spark-jars"


def target_dir(versions: Versions | None = None) -> Path:
    v = versions or Versions.installed()
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return cache_root() / f"spark-{v.spark}-delta-{v.delta}-{digest}"


def job_jars(versions: Versions | None = None) -> list[Path]:
    """The cached jars for the installed versions; ``JarsMissing`` (with the fix) when not fetched."""
    target = target_dir(versions)
    libs = target / "libs"
    if not (target / ".complete").exists():
        raise JarsMissing(
            f"the Spark job jars are not in {target}: run `{FETCH_COMMAND}` once (it needs Maven Central)"
        )
    jars = sorted(libs.glob("*.jar"))
    names = [j.name for j in jars]
    missing = [p for p in REQUIRED_PREFIXES if not any(n.startswith(p) for n in names)]
    if missing:
        raise JarsMissing(f"the jar cache {libs} lacks {', '.join(missing)}: delete {target} and run `{FETCH_COMMAND}`")
    return jars


def _maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchFailed(
            "Maven (mvn) is not on PATH: install it (apt-get install maven) or run scripts/system-deps.sh"
        )
    return mvn


def fetch(versions: Versions | None = None) -> list[Path]:
    """Fetch the jars into the cache unless already there; returns them."""
    v = versions or Versions.installed()
    target = target_dir(v)
    if (target / ".complete").exists():
        return job_jars(v)
    root = target.parent
    with file_lock(root / ".lock"):
        if (target / ".complete").exists():
            return job_jars(v)
        work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=root))
        try:
            shutil.copyfile(POM, work / "pom.xml")
            started = time.monotonic()
            log.info("spark_jars.fetching", spark=v.spark, delta=v.delta, cache=str(target))
            cmd = [
                _maven(),
                "-B",
                "-q",
                "-Dstyle.color=never",
                "-f",
                str(work / "pom.xml"),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-Dspark.version={v.spark}",
                f"-Ddelta.version={v.delta}",
                f"-Djackson.version={pyspark_jackson_version()}",
                f"-DoutputDirectory={work / 'libs'}",
            ]
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False, timeout=1800)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                raise FetchFailed(f"Maven could not fetch the Spark job jars (exit {proc.returncode}):\n{tail}")
            (work / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
            os.chmod(work, 0o755)
            if target.exists():
                shutil.rmtree(target)
            os.replace(work, target)
            log.info("spark_jars.fetched", seconds=round(time.monotonic() - started, 1), cache=str(target))
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return job_jars(v)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "fetch"
    try:
        if command == "fetch":
            jars = fetch()
            total = sum(j.stat().st_size for j in jars)
            print(f"{len(jars)} jars, {total / 1e6:.1f} MB, in {jars[0].parent}")
        elif command == "list":
            for jar in job_jars():
                print(jar)
        elif command == "submit-args":
            print("--jars " + ",".join(str(j) for j in job_jars()))
        else:
            print(f"unknown command {command!r}: use fetch, list or submit-args", file=sys.stderr)
            return 2
    except (JarsMissing, FetchFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
