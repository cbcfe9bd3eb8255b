"""Finding a Sentinel-managed master: ``SENTINEL get-master-addr-by-name`` asked of each
sentinel in turn, each within a short timeout, over a blocking socket (TLS and ``AUTH`` when
the :class:`~.address.Sentinels` say so), so the whole look-up is bounded by
``len(sentinels) * timeout_s`` (give or take the TLS handshake, within the same timeout)."""

from __future__ import annotations

import socket
import ssl

from .address import TLS, Sentinels
from .resp import INCOMPLETE, Parser, ReplyError, command


class NoMaster(ConnectionError):
    """No sentinel named the master (none answered, or none knows the service)."""


def _reply(sock: socket.socket, parser: Parser, host: str, port: int) -> object:
    while True:
        reply = parser.get()
        if reply is not INCOMPLETE:
            return reply
        data = sock.recv(4096)
        if not data:
            raise ConnectionResetError(f"sentinel {host}:{port} closed the connection")
        parser.feed(data)


def ask(
    host: str,
    port: int,
    service: str,
    timeout_s: float,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: TLS | None = None,
) -> tuple[str, int] | None:
    """What the sentinel at ``host:port`` names as ``service``'s master (None: unknown),
    asked over TLS when ``tls`` is given, after ``AUTH`` when ``password`` is.

    Raises:
        OSError: the sentinel could not be reached, refused the credentials, failed the TLS
            handshake or did not answer within ``timeout_s``.
    """
    parser = Parser()
    with socket.create_connection((host, port), timeout=timeout_s) as raw:
        sock: socket.socket = raw
        if tls is not None:
            sock = tls.context().wrap_socket(raw, server_hostname=host)
        try:
            if password is not None:
                auth = ("AUTH", username, password) if username else ("AUTH", password)
                sock.sendall(command(*auth))
                said = _reply(sock, parser, host, port)
                if isinstance(said, ReplyError):
                    # the sentinel's refusal, never the password
                    raise ConnectionError(f"sentinel {host}:{port} refused AUTH: {said}")
            sock.sendall(command("SENTINEL", "get-master-addr-by-name", service))
            reply = _reply(sock, parser, host, port)
        finally:
            if sock is not raw:
                sock.close()
    if isinstance(reply, ReplyError):
        raise ConnectionError(f"sentinel {host}:{port}: {reply}")
    if not isinstance(reply, list) or len(reply) != 2:
        return None  # a nil reply: the sentinel does not monitor this service
    name, port_text = (v.decode() if isinstance(v, bytes) else str(v) for v in reply)
    return name, int(port_text)


def find_master(sentinels: Sentinels, timeout_s: float) -> tuple[str, int]:
    """The master's host and port, from the first sentinel that names it.

    Raises:
        NoMaster: every sentinel failed or did not know the service (the causes listed).
    """
    causes: list[str] = []
    for host, port in sentinels.hosts:
        try:
            found = ask(
                host,
                port,
                sentinels.service,
                timeout_s,
                username=sentinels.username,
                password=sentinels.password,
                tls=sentinels.tls,
            )
        except (OSError, ValueError, ssl.SSLError) as exc:
            causes.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
            continue
        if found is not None:
            return found
        causes.append(f"{host}:{port}: does not know {sentinels.service!r}")
    raise NoMaster(f"{sentinels.name}: no sentinel named the master ({'; '.join(causes)})")
