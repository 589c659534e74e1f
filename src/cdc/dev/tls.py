"""Throw-away TLS material for the local services: a CA and a server certificate, made with the openssl CLI.

Development and tests only: the keys are unencrypted and the CA signs whatever asks. The server
certificate names ``localhost`` and ``127.0.0.1`` (where the dev services listen), so clients can
verify the host name (libpq ``sslmode=verify-full``, librdkafka's default endpoint identification).
Made once per directory and reused; P-256 keys, so making them takes a few milliseconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cdc.dev._proc import DevServiceError

__all__ = ["Tls", "available", "ensure"]

DAYS = "3650"


@dataclass(frozen=True, slots=True)
class Tls:
    """Files of a CA and of one server certificate it signed."""

    ca_cert: Path
    server_cert: Path  # the server certificate followed by the CA's: the chain
    server_key: Path  # PKCS#8, unencrypted, mode 0600
    server_pem: Path  # key and chain in one file (Kafka's PEM keystore)


def available() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise DevServiceError(f"openssl {args[0]} failed (exit {proc.returncode}): {proc.stderr.strip()}")


def ensure(directory: Path, *, common_name: str = "cdc-dev") -> Tls:
    """The CA and server files in ``directory``, made if missing. DevServiceError when openssl fails."""
    directory.mkdir(parents=True, exist_ok=True)
    tls = Tls(directory / "ca.crt", directory / "server.crt", directory / "server.key", directory / "server.pem")
    if all(p.exists() for p in (tls.ca_cert, tls.server_cert, tls.server_key, tls.server_pem)):
        return tls
    if not available():
        raise DevServiceError(
            "openssl is not installed; it makes the dev services' TLS certificates (apt-get install openssl)"
        )
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        DAYS,
        "-subj",
        f"/CN={common_name} CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=directory)
    (directory / "server.ext").write_text(
        "subjectAltName = DNS:localhost, IP:127.0.0.1\nextendedKeyUsage = serverAuth\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "leaf.crt",
        "-days",
        DAYS,
        "-extfile",
        "server.ext",
        cwd=directory,
    )
    os.chmod(tls.server_key, 0o600)
    leaf = (directory / "leaf.crt").read_text()
    tls.server_cert.write_text(leaf + tls.ca_cert.read_text())
    fd = os.open(tls.server_pem, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as pem:
        pem.write(tls.server_key.read_text() + tls.server_cert.read_text())
    return tls
