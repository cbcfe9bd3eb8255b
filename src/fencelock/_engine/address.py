"""Where a server is and how to reach it: :class:`Address` and :class:`TLS` (pure; no I/O).

An :class:`Address` is a value: two Locks built from the same URL, or from a URL and a redis-py
client pointing at the same place, get equal addresses and so share one engine. It is built from
a URL (:func:`from_url`) or read off a redis-py / valkey-py client (:func:`from_client`); the
client itself is never used. Its :attr:`Address.name` never contains the password.

Why this module is longer than 600 lines: every way a user names a server (URL schemes,
redis-py and valkey-py clients, Cluster and Sentinel seeds, TLS options and their checks) must
end in one comparable :class:`Address`; splitting the parsers would split that one rule.
"""

from __future__ import annotations

import functools
import inspect
import ssl
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import ConfigError, InsecureTLSWarning
from ..options import check_url, redact_url

__all__ = [
    "TLS",
    "Address",
    "InsecureTLSWarning",
    "check_any_url",
    "cluster_seed_from_client",
    "cluster_seed_from_url",
    "from_client",
    "from_url",
    "insecure_tls",
    "is_client",
    "is_cluster_client",
    "is_cluster_url",
    "url_name",
    "url_tls",
]

_CERT_REQS: Final = {
    "required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
}
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class TLS:
    """TLS settings of one server (the ``ssl_*`` options of redis-py, same meanings).

    - ``ca_certs`` / ``ca_path``: a CA bundle file / directory to verify the server with; when
      neither is given and verification is on, the system's default CAs are used.
    - ``certfile`` / ``keyfile``: a client certificate, for servers that require one.
    - ``cert_reqs``: ``"required"`` (default: the server's certificate must verify),
      ``"optional"`` or ``"none"`` (no verification: encrypted, not authenticated).
    - ``check_hostname``: also match the certificate against the host name (not with
      ``cert_reqs="none"``). Off by default here; :func:`from_url` turns it on unless told
      otherwise, and :func:`from_client` copies the client's setting.
    """

    ca_certs: str | None = None
    ca_path: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    cert_reqs: str = "required"
    check_hostname: bool = False

    def __post_init__(self) -> None:
        if self.cert_reqs not in _CERT_REQS:
            raise ConfigError(
                f"ssl_cert_reqs must be 'required', 'optional' or 'none', not {self.cert_reqs!r}"
            )
        if self.check_hostname and self.cert_reqs == "none":
            raise ConfigError("ssl_check_hostname needs ssl_cert_reqs 'required' or 'optional'")
        if self.keyfile is not None and self.certfile is None:
            raise ConfigError("ssl_keyfile needs ssl_certfile")

    def context(self) -> ssl.SSLContext:
        """The client-side :class:`ssl.SSLContext` for these settings (built once per value).

        Raises:
            ConfigError: a CA or certificate file cannot be loaded.
        """
        return _context(self)


@functools.lru_cache(maxsize=64)
def _context(tls: TLS) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = tls.check_hostname
    ctx.verify_mode = _CERT_REQS[tls.cert_reqs]
    try:
        if tls.ca_certs is not None or tls.ca_path is not None:
            ctx.load_verify_locations(cafile=tls.ca_certs, capath=tls.ca_path)
        elif ctx.verify_mode != ssl.CERT_NONE:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if tls.certfile is not None:
            ctx.load_cert_chain(tls.certfile, tls.keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files of {tls!r}: {exc}") from exc
    return ctx


@dataclass(frozen=True)
class Address:
    """One server: a TCP ``host``/``port`` or a unix socket ``path``, its ``db`` and credentials.

    Equal addresses mean the same server to the engine. ``password`` is left out of the repr.
    ``cluster``: a node of a Cluster (the seed of a ``redis+cluster://`` URL or a cluster
    client, and every node reached through it): its handshake also asks the cluster's id.
    """

    host: str = "localhost"
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TLS | None = None
    cluster: bool = False

    def __post_init__(self) -> None:
        if self.path is not None and not self.path:
            raise ConfigError("a unix socket path must not be empty")
        if self.path is not None and self.tls is not None:
            raise ConfigError("TLS over a unix socket is not supported")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ConfigError(f"port must be an int, not {self.port!r}")
        if not 0 < self.port < 65536:
            raise ConfigError(f"port out of range: {self.port}")
        if isinstance(self.db, bool) or not isinstance(self.db, int) or self.db < 0:
            raise ConfigError(f"db must be an int >= 0, not {self.db!r}")

    @property
    def name(self) -> str:
        """``"host:port/db"`` or ``"unix:/path"``: how messages and votes name this server."""
        if self.path:
            return f"unix:{self.path}"
        return f"{self.host}:{self.port}/{self.db}"


# --------------------------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------------------------

_URL_OPTIONS: Final = frozenset(
    {"db", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile",
     "ssl_check_hostname"}
)  # fmt: skip


def _flag(value: str, name: str, url: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{name} must be true or false in {redact_url(url)!r}, not {value!r}")


def _int(value: str, name: str, url: str) -> int:
    if not value.isdigit():
        raise ConfigError(f"{name} must be a number in {redact_url(url)!r}, not {value!r}")
    return int(value)


def _verification(options: dict[str, str], url: str) -> tuple[str, bool]:
    """(``ssl_cert_reqs``, ``ssl_check_hostname``) of a TLS URL's options: the host name is
    checked unless ``ssl_cert_reqs=none`` or ``ssl_check_hostname=false`` (as redis-py >= 6
    does, whatever redis-py is installed); a warning when either turns checking off."""
    cert_reqs = options.get("ssl_cert_reqs", "required").lower()
    check_hostname = cert_reqs != "none"
    if "ssl_check_hostname" in options:
        check_hostname = _flag(options["ssl_check_hostname"], "ssl_check_hostname", url)
    weak = insecure_tls(cert_reqs, check_hostname)
    if weak:
        warnings.warn(
            f"{redact_url(url)}: {weak}: the connection is encrypted, but a machine in the "
            "path can pose as the server (and read the password and the tokens)",
            InsecureTLSWarning,
            stacklevel=4,
        )
    return cert_reqs, check_hostname


def _url_tls(options: dict[str, str], url: str) -> TLS:
    """The TLS options a URL's ``ssl_*`` query gives (a rediss:// server's, a Sentinel's)."""
    cert_reqs, check_hostname = _verification(options, url)
    return TLS(
        ca_certs=options.get("ssl_ca_certs") or None,
        ca_path=options.get("ssl_ca_path") or None,
        certfile=options.get("ssl_certfile") or None,
        keyfile=options.get("ssl_keyfile") or None,
        cert_reqs=cert_reqs,
        check_hostname=check_hostname,
    )


def insecure_tls(cert_reqs: str, check_hostname: bool) -> str | None:
    """What a TLS setting leaves unchecked, in words (None: the server is authenticated)."""
    if cert_reqs == "none":
        return "ssl_cert_reqs=none: the server's certificate is not verified"
    if cert_reqs == "optional":
        return "ssl_cert_reqs=optional: a server without a certificate is accepted"
    if not check_hostname:
        return "ssl_check_hostname=false: any certificate of the CA is accepted for this host"
    return None


def url_tls(url: str) -> tuple[str, bool] | None:
    """(``ssl_cert_reqs``, ``ssl_check_hostname``) for a ``rediss://`` / ``valkeys://`` URL
    as fencelock applies them on every path, plain redis-py clients included (None: no TLS).
    Options fencelock does not know are left to redis-py.

    Raises:
        ConfigError: ``ssl_check_hostname`` is not a boolean word.
    """
    scheme = url.partition("://")[0].lower().removesuffix("+cluster").removesuffix("+sentinel")
    if scheme not in ("rediss", "valkeys"):
        return None
    query = urlsplit(url).query
    options = {name: values[-1] for name, values in parse_qs(query).items()}
    return _verification(options, url)


def from_url(url: str) -> Address:
    """The address a server URL names.

    Accepts ``redis://``, ``rediss://`` (TLS), ``valkey://``, ``valkeys://`` (TLS) with an
    optional ``user:password@``, port and ``/db``, and ``unix:///path?db=N``. Query options:
    ``db``, and for TLS URLs ``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_ca_path``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname`` (default: on unless
    ``ssl_cert_reqs=none``, as redis-py >= 6 does).

    >>> from_url("valkey://app:secret@cache.internal:6380/2")
    Address(host='cache.internal', port=6380, path=None, db=2, username='app', tls=None)

    Raises:
        ConfigError: a malformed URL, an unknown query option, an ``ssl_*`` option on a URL
            without TLS, or conflicting values (the message never shows the password).
    """
    if not isinstance(url, str):
        raise ConfigError(f"a server URL must be a str, not {type(url).__name__}")
    normal = check_url(url)
    parts = urlsplit(normal)
    shown = redact_url(url)
    options = _query_options(parts.query, _URL_OPTIONS, f"server URL {shown!r}")

    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None

    db = 0
    if parts.scheme != "unix":
        path_db = parts.path.lstrip("/")  # check_url made sure it is digits or empty
        db = int(path_db) if path_db else 0
    if "db" in options:
        query_db = _int(options["db"], "db", url)
        if parts.scheme != "unix" and parts.path.lstrip("/") and query_db != db:
            raise ConfigError(f"server URL {shown!r} gives two different databases")
        db = query_db

    ssl_given = sorted(name for name in options if name.startswith("ssl_"))
    tls: TLS | None = None
    if parts.scheme == "rediss":
        tls = _url_tls(options, url)
    elif ssl_given:
        raise ConfigError(
            f"{', '.join(ssl_given)} given in a URL without TLS: {shown!r} "
            "(use rediss:// or valkeys://)"
        )

    if parts.scheme == "unix":
        return Address(path=unquote(parts.path), db=db, username=username, password=password)
    assert parts.hostname is not None  # check_url
    return Address(
        host=parts.hostname,
        port=parts.port if parts.port is not None else 6379,
        db=db,
        username=username,
        password=password,
        tls=tls,
    )


# --------------------------------------------------------------------------------------------
# redis-py / valkey-py clients
# --------------------------------------------------------------------------------------------


def _standalone_types() -> tuple[type, ...]:
    import redis
    import redis.asyncio

    types: list[type] = [redis.Redis, redis.asyncio.Redis]
    try:
        import valkey
        import valkey.asyncio
    except ImportError:
        pass
    else:
        types += [valkey.Valkey, valkey.asyncio.Valkey]
    return tuple(types)


def _cluster_types() -> tuple[type, ...]:
    import redis.asyncio.cluster
    import redis.cluster

    types: list[type] = [redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster]
    try:
        import valkey.asyncio.cluster
        import valkey.cluster
    except ImportError:
        pass
    else:
        types += [valkey.cluster.ValkeyCluster, valkey.asyncio.cluster.ValkeyCluster]
    return tuple(types)


@functools.cache
def _client_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    return _standalone_types(), _cluster_types()


#: The packages whose clients a server may be given as.
_CLIENT_PACKAGES: Final = frozenset({"redis", "valkey"})


def _maybe_client(obj: object) -> bool:
    """Whether a class of ``obj`` (its own or a base) comes from redis-py or valkey-py: false
    for a URL or a list of them without importing either package (tens of milliseconds, most
    of a ``fencelock run``'s start)."""
    return any(
        getattr(cls, "__module__", "").partition(".")[0] in _CLIENT_PACKAGES
        for cls in type(obj).__mro__
    )


def is_client(obj: object) -> bool:
    """True for a client :func:`from_client` reads: ``redis.Redis``, ``redis.asyncio.Redis``,
    and ``valkey.Valkey`` / ``valkey.asyncio.Valkey`` when valkey-py is installed."""
    return _maybe_client(obj) and isinstance(obj, _client_types()[0])


# connection kwargs fencelock cannot honour yet: refused when set to anything but these values
_UNSUPPORTED: Final[dict[str, object]] = {
    "credential_provider": None,
    "ssl_ca_data": None,
    "ssl_password": None,
    "ssl_ciphers": None,
    "ssl_min_version": None,
    "ssl_include_verify_flags": None,
    "ssl_exclude_verify_flags": None,
    "ssl_validate_ocsp": False,
    "ssl_validate_ocsp_stapled": False,
}


@functools.lru_cache(maxsize=16)
def _defaults(connection_class: type) -> dict[str, Any]:
    """The keyword defaults of a connection class's ``__init__`` (what a pool omits)."""
    defaults: dict[str, Any] = {}
    for cls in connection_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        for param in params:
            if param.default is not inspect.Parameter.empty:
                defaults.setdefault(param.name, param.default)
    return defaults


def _cert_reqs(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, ssl.VerifyMode):
        return {ssl.CERT_REQUIRED: "required", ssl.CERT_OPTIONAL: "optional"}.get(value, "none")
    if isinstance(value, str):
        lowered = value.lower().removeprefix("cert_")
        if lowered in _CERT_REQS:
            return lowered
    raise ConfigError(f"unknown ssl_cert_reqs {value!r} on the client")


def from_client(client: object) -> Address:
    """The address of the server a redis-py / valkey-py client talks to (no I/O).

    Reads ``client.connection_pool.connection_kwargs`` and ``connection_class``; the client is
    not used otherwise.

    Raises:
        ConfigError: not a supported client (cluster clients are not supported yet), or a
            client option fencelock cannot honour (a credential provider, ``ssl_ca_data``,
            an encrypted key, ...).
    """
    standalone, cluster = _client_types()
    if isinstance(client, cluster):
        raise ConfigError(
            f"cluster clients are not supported yet ({type(client).__name__}); "
            "give the URL or a client of each master instead"
        )
    if not isinstance(client, standalone):
        raise ConfigError(
            "a server must be a URL or a redis.Redis / redis.asyncio.Redis client "
            f"(or valkey's), not {type(client).__name__}"
        )
    pool: Any = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = dict(getattr(pool, "connection_kwargs", None) or {})
    connection_class: Any = getattr(pool, "connection_class", None)
    if not isinstance(connection_class, type):
        raise ConfigError(f"cannot tell how {type(client).__name__} connects (no pool)")
    settings = {**_defaults(connection_class), **kwargs}
    for name, allowed in _UNSUPPORTED.items():
        if name in settings and settings[name] is not allowed and settings[name] != allowed:
            raise ConfigError(f"the client option {name} is not supported by fencelock yet")

    username = settings.get("username") or None
    password = settings.get("password")
    db = settings.get("db") or 0
    path = settings.get("path") or None
    if isinstance(db, str) and db.isdigit():
        db = int(db)
    if path is not None:
        return Address(path=str(path), db=db, username=username, password=password)
    tls: TLS | None = None
    if "ssl" in connection_class.__name__.lower():
        cert_reqs = _cert_reqs(settings.get("ssl_cert_reqs", "required"))
        tls = TLS(
            ca_certs=settings.get("ssl_ca_certs"),
            ca_path=settings.get("ssl_ca_path"),
            certfile=settings.get("ssl_certfile"),
            keyfile=settings.get("ssl_keyfile"),
            cert_reqs=cert_reqs,
            # redis-py ignores the flag without verification
            check_hostname=cert_reqs != "none" and bool(settings.get("ssl_check_hostname")),
        )
        weak = insecure_tls(tls.cert_reqs, tls.check_hostname)
        if weak:
            warnings.warn(
                f"{type(client).__name__} for {settings.get('host')}:{settings.get('port')}: "
                f"{weak}: the connection is encrypted, but a machine in the path can pose as "
                "the server (and read the password and the tokens)",
                InsecureTLSWarning,
                stacklevel=3,
            )
    port = settings.get("port", 6379)
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    return Address(
        host=str(settings.get("host") or "localhost"),
        port=port,
        db=db,
        username=username,
        password=password,
        tls=tls,
    )


# --------------------------------------------------------------------------------------------
# Sentinel-managed masters
# --------------------------------------------------------------------------------------------

#: URL schemes of a Sentinel-managed master, and whether the master speaks TLS.
SENTINEL_SCHEMES: Final = {"redis+sentinel": False, "valkey+sentinel": False}


@dataclass(frozen=True)
class Sentinels:
    """A master found through Sentinels: ``hosts`` (host, port) asked in order for
    ``service``; ``master`` carries how to talk to the master once found (db, credentials,
    TLS; its host and port are not used). The sentinels themselves are asked with
    ``username``/``password`` (``AUTH``, when a password is given) over ``tls`` (when given,
    verified like a server's).

    Equal values mean the same lock server (one vote), whatever the master is at the time.
    """

    hosts: tuple[tuple[str, int], ...]
    service: str
    master: Address = field(default_factory=Address)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TLS | None = None

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ConfigError("a Sentinel-managed master needs at least one sentinel")
        if not self.service:
            raise ConfigError("a Sentinel-managed master needs a service name")

    @property
    def name(self) -> str:
        """``"sentinel:service@host:port,host:port/db"`` (never the password)."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.hosts)
        return f"sentinel:{self.service}@{hosts}/{self.master.db}"

    def at(self, host: str, port: int) -> Address:
        """The master's address once a sentinel named it."""
        return replace(self.master, host=host, port=port, path=None)


def is_sentinel_url(spec: object) -> bool:
    """True for a ``redis+sentinel://`` (or ``valkey+sentinel://``) URL."""
    return isinstance(spec, str) and spec.split("://", 1)[0].lower() in SENTINEL_SCHEMES


_SENTINEL_OPTIONS: Final = frozenset(
    {"sentinel_username", "sentinel_password", "sentinel_ssl", "ssl_cert_reqs", "ssl_ca_certs",
     "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)  # fmt: skip


def _query_options(query: str, allowed: Collection[str], where: str) -> dict[str, str]:
    """A URL's query as ``{option: value}``: each option known (in ``allowed``) and given once.

    Raises:
        ConfigError: a malformed query, an unknown option or one given twice (``where`` names
            the URL, its password redacted).
    """
    try:
        parsed = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"malformed query in {where}") from None
    options: dict[str, str] = {}
    for name, values in parsed.items():
        if name not in allowed:
            known = ", ".join(sorted(allowed))
            raise ConfigError(f"unknown option {name!r} in {where} (known: {known})")
        if len(values) != 1:
            raise ConfigError(f"option {name!r} is given twice in {where}")
        options[name] = values[0]
    return options


def _sentinel_options(query: str, url: str) -> tuple[str | None, str | None, TLS | None]:
    """(username, password, TLS) for asking the sentinels, from a Sentinel URL's query."""
    shown = redact_url(url)
    options = _query_options(query, _SENTINEL_OPTIONS, f"Sentinel URL {shown!r}")
    username = options.get("sentinel_username") or None
    password = options.get("sentinel_password")
    if username is not None and password is None:
        raise ConfigError(
            f"Sentinel URL names sentinel_username but no sentinel_password: {shown!r}"
        )
    use_tls = _flag(options.get("sentinel_ssl", "false"), "sentinel_ssl", url)
    ssl_given = sorted(name for name in options if name.startswith("ssl_"))
    if ssl_given and not use_tls:
        raise ConfigError(f"{', '.join(ssl_given)} need sentinel_ssl=true: {shown!r}")
    tls: TLS | None = None
    if use_tls:
        tls = _url_tls(options, url)
    return username, password, tls


def sentinels_from_url(url: str) -> Sentinels:
    """The master a ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
    URL names (port default 26379; ``valkey+sentinel://`` alike). The credentials are the
    master's. Query options for the sentinels themselves: ``sentinel_username`` and
    ``sentinel_password`` (sent with ``AUTH``), ``sentinel_ssl=true`` (TLS, with the ``ssl_*``
    options of :func:`from_url`; the host name is checked unless told otherwise).

    >>> sentinels_from_url("redis+sentinel://s1:26379,s2/locks/2").name
    'sentinel:locks@s1:26379,s2:26379/2'

    Raises:
        ConfigError: a malformed URL, no sentinel, no service name, a bad port or database,
            an unknown query option.
    """
    shown = redact_url(url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ConfigError(f"not a Sentinel URL: {shown!r}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if "#" in path or "#" in query:
        raise ConfigError(f"a Sentinel URL takes no fragment: {shown!r}")
    sentinel_user, sentinel_password, sentinel_tls = (
        _sentinel_options(query, url) if query else (None, None, None)
    )
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, colon, port_text = item.strip().rpartition(":")
        if not colon:
            host, port_text = port_text, "26379"
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"bad sentinel {item!r} in {shown!r} (host:port expected)")
        hosts.append((host.strip("[]"), int(port_text)))
    service, _, db_text = path.partition("/")
    if not service:
        raise ConfigError(f"a Sentinel URL names its service: {shown!r} (…/service)")
    if db_text and not db_text.isdigit():
        raise ConfigError(f"Sentinel URL database must be a number: {shown!r}")
    if username and password is None:
        raise ConfigError(f"Sentinel URL names a user but gives no password: {shown!r}")
    master = Address(db=int(db_text or 0), username=username, password=password)
    return Sentinels(
        tuple(hosts),
        unquote(service),
        master,
        username=sentinel_user,
        password=sentinel_password,
        tls=sentinel_tls,
    )


def sentinel_pool(client: object) -> Any:
    """The ``SentinelConnectionPool`` of a client made by ``Sentinel.master_for`` (else None)."""
    pool: Any = getattr(client, "connection_pool", None)
    if getattr(pool, "service_name", None) and getattr(pool, "sentinel_manager", None):
        return pool
    return None


def sentinels_from_client(client: object) -> Sentinels:
    """The master a ``redis.sentinel.Sentinel(...).master_for(service)`` client (sync or
    asyncio) talks to: its sentinels' addresses and the master's db, credentials and TLS
    (no I/O).

    Raises:
        ConfigError: not such a client, or an option fencelock cannot honour.
    """
    pool = sentinel_pool(client)
    if pool is None:
        raise ConfigError(f"{type(client).__name__} is not a Sentinel-managed master client")
    if getattr(pool, "is_master", True) is False:
        raise ConfigError("a Sentinel replica client (slave_for) cannot hold locks")
    asked = [from_client(s) for s in pool.sentinel_manager.sentinels]
    if not asked:
        raise ConfigError("a Sentinel client without sentinels")
    hosts = tuple((address.host, address.port) for address in asked)
    # redis-py gives every sentinel the same sentinel_kwargs: the first one's stand for all
    first = asked[0]
    return Sentinels(
        hosts,
        str(pool.service_name),
        from_client(client),
        username=first.username,
        password=first.password,
        tls=first.tls,
    )


# --------------------------------------------------------------------------------------------
# Redis / Valkey Cluster: the address of one node (the seed) stands for the whole cluster
# --------------------------------------------------------------------------------------------

_CLUSTER_SCHEMES: Final = {
    "redis+cluster": "redis",
    "rediss+cluster": "rediss",
    "valkey+cluster": "valkey",
    "valkeys+cluster": "valkeys",
}


def is_cluster_url(url: str) -> bool:
    """True for ``redis+cluster://``, ``rediss+cluster://`` and the ``valkey`` spellings."""
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.lower() in _CLUSTER_SCHEMES


def cluster_seed_from_url(url: str) -> Address:
    """The seed node of a ``redis+cluster://[user:password@]host[:port]`` URL (any node of
    the cluster; TLS with ``rediss+cluster://`` and the query options of :func:`from_url`).

    Raises:
        ConfigError: not a cluster URL, malformed, or a database other than 0 (a cluster has
            only database 0).
    """
    if not isinstance(url, str) or not is_cluster_url(url):
        raise ConfigError(f"not a cluster URL: {redact_url(str(url))!r}")
    scheme, _, rest = url.partition("://")
    address = from_url(f"{_CLUSTER_SCHEMES[scheme.lower()]}://{rest}")
    if address.db != 0:
        raise ConfigError(f"a cluster has only database 0: {redact_url(url)!r}")
    return replace(address, cluster=True)


def is_cluster_client(obj: object) -> bool:
    """True for ``redis.cluster.RedisCluster`` / ``redis.asyncio.cluster.RedisCluster`` (and
    valkey-py's cluster clients when installed)."""
    return _maybe_client(obj) and isinstance(obj, _client_types()[1])


def cluster_seed_from_client(client: object) -> Address:
    """The seed node of a redis-py / valkey-py cluster client: its first startup node, with
    the client's credentials and TLS settings (no I/O; the client is not used otherwise).

    Raises:
        ConfigError: not a cluster client, one without startup nodes, or an option fencelock
            cannot honour (as :func:`from_client`).
    """
    if not is_cluster_client(client):
        raise ConfigError(f"not a cluster client: {type(client).__name__}")
    manager: Any = getattr(client, "nodes_manager", None)
    startup = list((getattr(manager, "startup_nodes", None) or {}).values())
    if not startup:
        raise ConfigError(f"{type(client).__name__} has no startup node")
    node = startup[0]
    kwargs: dict[str, Any] = dict(getattr(manager, "connection_kwargs", None) or {})
    kwargs.update(host=node.host, port=int(node.port))
    connection_class = kwargs.pop("connection_class", None) or getattr(
        node, "connection_class", None
    )
    module = type(client).__module__
    pool_module: Any
    if module.startswith("valkey"):
        import valkey
        import valkey.asyncio

        pool_module = valkey.asyncio if ".asyncio" in module else valkey
        client_class: Any = pool_module.Valkey
    else:
        import redis
        import redis.asyncio

        pool_module = redis.asyncio if ".asyncio" in module else redis
        client_class = pool_module.Redis
    if connection_class is None:
        connection_class = pool_module.Connection
    known = set(_defaults(connection_class)) | {"host", "port"}
    kwargs = {name: value for name, value in kwargs.items() if name in known}
    # a standalone client with the same connection settings, never connected: read like one
    pool = pool_module.ConnectionPool(connection_class=connection_class, **kwargs)
    address = from_client(client_class(connection_pool=pool))
    if address.db != 0:
        raise ConfigError("a cluster has only database 0")
    return replace(address, cluster=True)


def check_any_url(url: str) -> str:
    """``url`` checked before any I/O: a server URL (:func:`~fencelock.options.check_url`, in
    the form redis-py reads), or a ``redis+cluster://`` / ``redis+sentinel://`` URL (the
    ``valkey`` spellings too) parsed as the Lock parses it and returned as given.

    Raises:
        ConfigError: a malformed URL of any kind.
    """
    if is_cluster_url(url):
        cluster_seed_from_url(url)
        return url
    if is_sentinel_url(url):
        sentinels_from_url(url)
        return url
    return check_url(url)


def url_name(url: str) -> str | None:
    """A password-free name for a cluster or Sentinel URL (None for a plain server URL):
    ``"cluster:host:port"`` (the seed) or ``"sentinel:service@host:port,.../db"``."""
    if is_cluster_url(url):
        seed = cluster_seed_from_url(url)
        return f"cluster:{seed.host}:{seed.port}"
    if is_sentinel_url(url):
        return sentinels_from_url(url).name
    return None
