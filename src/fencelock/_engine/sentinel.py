"""Finding a Sentinel-managed master: ``SENTINEL get-master-addr-by-name`` asked of each
sentinel in turn, each within a short timeout, over a plain blocking socket (so the whole
look-up is bounded by ``len(sentinels) * timeout_s``)."""

from __future__ import annotations

import socket

from .address import Sentinels
from .resp import INCOMPLETE, Parser, ReplyError, command


class NoMaster(ConnectionError):
    """No sentinel named the master (none answered, or none knows the service)."""


def ask(host: str, port: int, service: str, timeout_s: float) -> tuple[str, int] | None:
    """What the sentinel at ``host:port`` names as ``service``'s master (None: unknown).

    Raises:
        OSError: the sentinel could not be reached or did not answer within ``timeout_s``.
    """
    parser = Parser()
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(command("SENTINEL", "get-master-addr-by-name", service))
        while True:
            data = sock.recv(4096)
            if not data:
                raise ConnectionResetError(f"sentinel {host}:{port} closed the connection")
            parser.feed(data)
            reply = parser.get()
            if reply is not INCOMPLETE:
                break
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
            found = ask(host, port, sentinels.service, timeout_s)
        except (OSError, ValueError) as exc:
            causes.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
            continue
        if found is not None:
            return found
        causes.append(f"{host}:{port}: does not know {sentinels.service!r}")
    raise NoMaster(f"{sentinels.name}: no sentinel named the master ({'; '.join(causes)})")
