"""Server addresses from URLs and from redis-py / valkey-py clients (no network)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.credentials import UsernamePasswordCredentialProvider

import fencelock
from fencelock._engine.address import (
    TLS,
    Address,
    from_client,
    from_url,
    is_client,
    is_cluster_client,
)
from fencelock._engine.plain_clients import describe
from fencelock.errors import ConfigError
from fencelock.options import check_url

NAMED_URLS = [
    "redis://localhost",
    "redis://127.0.0.1:7001",
    "redis://127.0.0.1:7001/0",
    "redis://127.0.0.1:7001/15",
    "redis://user:pw@cache.internal:6380/2",
    "redis://:only-pw@10.0.0.1/3",
    "rediss://secure.example:6390/1",
    "valkey://h:1/4",
    "valkeys://h/5",
    "redis://[::1]:7000/1",
    "unix:///tmp/redis.sock",
    "unix:///var/run/valkey/v.sock?db=7",
]


@pytest.mark.parametrize("url", NAMED_URLS)
def test_an_address_is_named_as_the_v01_nodes_named_the_same_url(url: str) -> None:
    kwargs = redis.ConnectionPool.from_url(check_url(url)).connection_kwargs
    assert from_url(url).name == describe(kwargs)


@pytest.mark.parametrize("url", [u for u in NAMED_URLS if not u.startswith(("rediss", "valkeys"))])
def test_a_client_built_from_a_url_has_the_address_of_the_url(url: str) -> None:
    normal = check_url(url)
    assert from_client(redis.Redis.from_url(normal)) == from_url(url)
    assert from_client(redis.asyncio.Redis.from_url(normal)) == from_url(url)


def test_url_parts_land_in_their_fields() -> None:
    address = from_url("redis://app:s%40cret@cache.internal:6380/2")
    assert address == Address(
        host="cache.internal", port=6380, db=2, username="app", password="s@cret"
    )
    assert from_url("redis://:pw@h").username is None
    assert from_url("redis://:pw@h").password == "pw"
    assert from_url("redis://h").password is None
    assert from_url("redis://h") == Address(host="h")
    assert from_url("unix:///tmp/s.sock?db=3") == Address(path="/tmp/s.sock", db=3)
    assert from_url("redis://h?db=4").db == 4
    assert from_url("redis://h/4?db=4").db == 4


def test_valkey_schemes_are_the_redis_schemes() -> None:
    assert from_url("valkey://h:1/2") == from_url("redis://h:1/2")
    assert from_url("valkeys://h:1/2") == from_url("rediss://h:1/2")


def test_the_password_appears_in_no_name_and_no_repr() -> None:
    address = from_url("redis://u:hunter2-secret@h:1/0")
    assert "hunter2" not in repr(address)
    assert "hunter2" not in address.name
    assert address.name == "h:1/0"
    assert Address(path="/x.sock", password="hunter2").name == "unix:/x.sock"


def test_a_tls_url_carries_its_ssl_options() -> None:
    address = from_url(
        "rediss://h:6390/1?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
        "&ssl_cert_reqs=optional&ssl_check_hostname=false&ssl_ca_path=/cas"
    )
    assert address.tls == TLS(
        ca_certs="/ca.pem",
        ca_path="/cas",
        certfile="/c.pem",
        keyfile="/k.pem",
        cert_reqs="optional",
        check_hostname=False,
    )
    assert address.name == "h:6390/1"


def test_a_tls_url_checks_the_host_name_unless_verification_is_off() -> None:
    tls = from_url("rediss://h").tls
    assert tls is not None and tls.cert_reqs == "required" and tls.check_hostname
    tls = from_url("rediss://h?ssl_cert_reqs=none").tls
    assert tls is not None and tls.cert_reqs == "none" and not tls.check_hostname
    assert from_url("redis://h").tls is None


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("http://u:topsecret@h", "must start with"),
        ("redis://", "no host"),
        ("redis://u:topsecret@h/abc", "database must be a number"),
        ("redis://u:topsecret@h:99999", "Port out of range"),
        ("redis://u:topsecret@h:0", "port out of range"),
        ("unix://", "socket path"),
        ("redis://u:topsecret@h?socket_timeout=1", "unknown option 'socket_timeout'"),
        ("redis://u:topsecret@h?ssl_ca_certs=/x", "without TLS"),
        ("redis://u:topsecret@h?db=x", "db must be a number"),
        ("redis://u:topsecret@h/1?db=2", "two different databases"),
        ("redis://u:topsecret@h?db=1&db=2", "given twice"),
        ("rediss://u:topsecret@h?ssl_cert_reqs=sometimes", "ssl_cert_reqs"),
        ("rediss://u:topsecret@h?ssl_check_hostname=maybe", "true or false"),
        ("rediss://h?ssl_cert_reqs=none&ssl_check_hostname=true", "ssl_check_hostname"),
        ("rediss://h?ssl_keyfile=/k.pem", "ssl_keyfile needs ssl_certfile"),
    ],
)
def test_a_bad_url_raises_config_error_without_the_password(url: str, complaint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_url(url)
    assert complaint in str(caught.value)
    assert "topsecret" not in str(caught.value)


def test_a_url_that_is_not_a_string_raises_config_error() -> None:
    with pytest.raises(ConfigError):
        from_url(b"redis://h")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"port": 0}, {"port": 70000}, {"db": -1}, {"path": ""}, {"path": "/s", "tls": TLS()}],
)
def test_an_impossible_address_raises_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Address(**kwargs)  # type: ignore[arg-type]


# ---- TLS contexts --------------------------------------------------------------------------------


def test_a_tls_context_is_built_once_per_setting_and_follows_it() -> None:
    required = TLS(check_hostname=True)
    ctx = required.context()
    assert ctx is TLS(check_hostname=True).context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    off = TLS(cert_reqs="none").context()
    assert off is not ctx
    assert off.verify_mode == ssl.CERT_NONE and not off.check_hostname
    assert TLS(cert_reqs="optional").context().verify_mode == ssl.CERT_OPTIONAL


def test_a_tls_file_that_cannot_be_loaded_raises_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(ConfigError, match="TLS files"):
        TLS(ca_certs=str(bogus)).context()
    with pytest.raises(ConfigError, match="TLS files"):
        TLS(ca_certs=str(tmp_path / "missing.pem")).context()


# ---- clients ------------------------------------------------------------------------------------


def test_a_tcp_client_gives_host_port_db_and_credentials() -> None:
    client = redis.Redis(host="10.1.2.3", port=7000, db=5, username="app", password="pw")
    assert from_client(client) == Address(
        host="10.1.2.3", port=7000, db=5, username="app", password="pw"
    )
    assert from_client(redis.Redis()) == Address()


def test_a_unix_socket_client_gives_its_path() -> None:
    for client in (
        redis.Redis(unix_socket_path="/tmp/r.sock", db=2, password="pw"),
        redis.asyncio.Redis(unix_socket_path="/tmp/r.sock", db=2, password="pw"),
    ):
        assert from_client(client) == Address(path="/tmp/r.sock", db=2, password="pw")
        assert from_client(client).name == "unix:/tmp/r.sock"


def test_an_ssl_client_gives_its_tls_settings() -> None:
    client = redis.Redis(
        host="h",
        ssl=True,
        ssl_ca_certs="/ca.pem",
        ssl_certfile="/c.pem",
        ssl_keyfile="/k.pem",
        ssl_cert_reqs="optional",
        ssl_check_hostname=True,
    )
    assert from_client(client).tls == TLS(
        ca_certs="/ca.pem",
        certfile="/c.pem",
        keyfile="/k.pem",
        cert_reqs="optional",
        check_hostname=True,
    )
    asyncio_client = redis.asyncio.Redis(host="h", ssl=True, ssl_cert_reqs=ssl.CERT_NONE)
    assert from_client(asyncio_client).tls == TLS(cert_reqs="none", check_hostname=False)
    url_client = redis.Redis.from_url("rediss://h:1/2?ssl_cert_reqs=none")
    assert from_client(url_client) == from_url("rediss://h:1/2?ssl_cert_reqs=none")


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"ssl": True, "ssl_ca_data": "-----BEGIN CERTIFICATE-----"}, "ssl_ca_data"),
        ({"ssl": True, "ssl_password": "keypass"}, "ssl_password"),
        (
            {"credential_provider": UsernamePasswordCredentialProvider("u", "p")},
            "credential_provider",
        ),
    ],
)
def test_a_client_option_fencelock_cannot_honour_raises_config_error(
    kwargs: dict[str, object], option: str
) -> None:
    with pytest.raises(ConfigError, match=option):
        from_client(redis.Redis(**kwargs))  # type: ignore[arg-type]


def test_valkey_clients_are_read_like_redis_clients() -> None:
    pytest.importorskip("valkey")
    import valkey
    import valkey.asyncio

    assert from_client(valkey.Valkey(host="h", port=2, db=3, password="pw")) == Address(
        host="h", port=2, db=3, password="pw"
    )
    assert from_client(valkey.asyncio.Valkey.from_url("unix:///tmp/v.sock?db=4")) == Address(
        path="/tmp/v.sock", db=4
    )
    tls = from_client(valkey.Valkey(ssl=True, ssl_ca_certs="/ca.pem")).tls
    assert tls == TLS(ca_certs="/ca.pem", check_hostname=False)  # valkey-py's default
    assert is_client(valkey.Valkey())


def test_a_cluster_client_is_refused_as_not_supported_yet() -> None:
    # the sync RedisCluster connects in __init__: an instance without __init__ is enough here
    sync_cluster = object.__new__(redis.cluster.RedisCluster)
    async_cluster = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=1)
    for cluster in (sync_cluster, async_cluster):
        assert not is_client(cluster)
        with pytest.raises(ConfigError, match="cluster clients are not supported yet"):
            from_client(cluster)


@pytest.mark.parametrize("thing", ["redis://h", object(), None, 42])
def test_something_that_is_not_a_client_is_refused(thing: object) -> None:
    assert not is_client(thing)
    with pytest.raises(ConfigError, match="must be a URL or a redis"):
        from_client(thing)


def test_redis_clients_of_both_kinds_are_clients() -> None:
    assert is_client(redis.Redis())
    assert is_client(redis.asyncio.Redis())


def test_a_subclass_of_a_client_defined_elsewhere_is_a_client() -> None:
    """is_client looks for redis-py / valkey-py among the classes of the object (so that a URL
    needs neither imported): a user's subclass, defined in the user's module, is found too."""

    class AppRedis(redis.Redis):
        pass

    class AppCluster(redis.cluster.RedisCluster):
        def __init__(self) -> None:  # no I/O: only its type is looked at
            pass

    assert AppRedis.__module__ == __name__
    assert is_client(AppRedis(host="h", port=7001))
    assert from_client(AppRedis(host="h", port=7001)) == from_url("redis://h:7001/0")
    assert is_cluster_client(AppCluster())
    assert not is_client(AppCluster())


# -- Sentinel-managed masters ------------------------------------------------------------------


def test_a_sentinel_url_names_its_sentinels_service_db_and_the_masters_credentials() -> None:
    from fencelock._engine.address import sentinels_from_url

    found = sentinels_from_url("redis+sentinel://app:pw@s1:26380,s2/locks/3")
    assert found.hosts == (("s1", 26380), ("s2", 26379))
    assert found.service == "locks"
    assert (found.master.db, found.master.username, found.master.password) == (3, "app", "pw")
    assert "pw" not in found.name and "pw" not in repr(found)
    assert found.at("10.0.0.9", 6390).port == 6390


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s1:26379",  # no service
        "redis+sentinel://s1:26379/",
        "redis+sentinel:///svc",  # no sentinel
        "redis+sentinel://s1:99999/svc",
        "redis+sentinel://s1:x/svc",
        "redis+sentinel://s1/svc/db",
        "redis+sentinel://s1/svc?db=1",
    ],
)
def test_a_bad_sentinel_url_is_a_config_error_before_any_io(url: str) -> None:
    with pytest.raises(fencelock.ConfigError):
        fencelock.Lock(url, "k")


def test_a_sentinel_client_is_read_without_io() -> None:
    import redis.sentinel

    from fencelock._engine.address import sentinels_from_client

    client = redis.sentinel.Sentinel([("127.0.0.1", 1), ("h", 2)]).master_for(
        "svc", password="pw", db=2
    )
    found = sentinels_from_client(client)
    assert found.hosts == (("127.0.0.1", 1), ("h", 2)) and found.service == "svc"
    assert (found.master.db, found.master.password) == (2, "pw")
    replica = redis.sentinel.Sentinel([("127.0.0.1", 1)]).slave_for("svc")
    with pytest.raises(fencelock.ConfigError, match="replica"):
        sentinels_from_client(replica)


def test_a_sentinel_url_carries_its_tls_options() -> None:
    """``doctor``'s tls check reads a Sentinel URL's options as it reads a server URL's."""
    from fencelock._engine.address import url_tls

    with pytest.warns(fencelock.InsecureTLSWarning):
        weak = url_tls("rediss+sentinel://h:26379/locks?ssl_cert_reqs=none")
    assert weak == ("none", False)
    assert url_tls("rediss+sentinel://h:26379/locks") == ("required", True)
    assert url_tls("redis+sentinel://h:26379/locks") is None
