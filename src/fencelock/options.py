"""Validated, frozen options. Every default is stated once here, next to its reason.

All validation happens at construction, before anything is sent to a server, and raises
:class:`~fencelock.errors.ConfigError` (a :class:`ValueError`) naming the offending argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import unquote, urlsplit, urlunsplit

from .errors import ConfigError

Seconds = float | int | timedelta
"""A duration: seconds as int/float, or a :class:`datetime.timedelta`."""

#: Lease length. Long enough for typical jobs; the watchdog renews it for longer ones.
DEFAULT_TTL = 30.0
#: How long ``acquire()`` waits by default. Finite on purpose: an infinite wait must be asked for
#: (``wait=math.inf``).
DEFAULT_WAIT = 10.0
#: Clock-drift allowance: ``ttl * DRIFT_FACTOR + DRIFT_MIN`` (the Redis documentation's figures).
DRIFT_FACTOR = 0.01
DRIFT_MIN = 0.002
#: First retry delay when no holder lease is known (split votes); doubled up to RETRY_CAP.
RETRY_BASE = 0.01
RETRY_CAP = 0.5
#: After a release wakes a waiter, newcomers step aside this long so the woken waiter gets it.
HANDOFF_WINDOW = 0.05
#: A fair lock's waiter keeps its place in line by refreshing a lease this long on its queue
#: entry (every third of it); a waiter that died is skipped about this long after its last
#: refresh. Seconds, not minutes; long enough that a busy process does not lose its place.
FAIR_HEARTBEAT = 3.0
#: A wake signal nobody picked up disappears after this long (seconds).
WAKE_LIFETIME = 5.0
#: One blocking wait on the wake list lasts at most this long before the waiter re-checks.
MAX_BLOCK = 2.0
#: Per-server timeout: ``ttl * SERVER_TIMEOUT_FRACTION`` clamped to [min, max]. A round must
#: finish well inside the lease; a hung server must not delay it beyond this.
SERVER_TIMEOUT_FRACTION = 0.1
SERVER_TIMEOUT_MIN = 0.05
SERVER_TIMEOUT_MAX = 1.0
#: The watchdog renews every ``ttl * RENEW_FRACTION`` seconds.
RENEW_FRACTION = 1.0 / 3.0
#: How long a fence register outlives its last write (s): a key used once costs its server
#: nothing after this. Long on purpose: once the register is gone, the next fence comes from
#: the server's TIME floor alone, which is larger only if the server's clock did not step back
#: by half of it (the scripts set the expiry only while the fence is at most half of it ahead
#: of the clock; see docs/fencing.md). None keeps registers for ever. A lock whose ttl is
#: longer gets its ttl as the default instead.
FENCE_RETENTION = 7 * 24 * 3600.0
#: The shortest retention allowed (s): above any clock step a server should see.
FENCE_RETENTION_MIN = 1.0
#: The longest finite duration any option takes (s, about 31.7 years). Servers store a PX of
#: up to about 2**63 ms less the time now, and the timers wait at most ``threading.TIMEOUT_MAX``
#: (about 9.2e9 s on Linux): beyond those a TTL failed inside a script (reported as servers
#: unavailable) or killed the process's timers thread (every lease stopped renewing). Use
#: renewal (``hold(renew=True)``) for work of unknown length, never a huge TTL.
MAX_DURATION_S = 1e9

_URL_SCHEMES = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "valkeys": "rediss"}


def seconds(
    value: object, name: str, *, allow_zero: bool = False, allow_inf: bool = False
) -> float:
    """Check a duration and return it in float seconds, or raise :class:`ConfigError`
    (negative, NaN, infinite unless ``allow_inf``, or above :data:`MAX_DURATION_S`)."""
    if type(value) is float and 0.0 < value <= MAX_DURATION_S:  # the common cases, at once
        return value
    if type(value) is int and 0 < value <= MAX_DURATION_S:
        return float(value)
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds or a timedelta, not {value!r}")
    else:
        result = float(value)
    if math.isnan(result):
        raise ConfigError(f"{name} must not be NaN")
    if math.isinf(result) and (result < 0 or not allow_inf):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    if result < 0 or (result == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be {bound} seconds, got {value!r}")
    if MAX_DURATION_S < result < math.inf:
        raise ConfigError(
            f"{name} must be at most {MAX_DURATION_S:g} seconds, got {value!r}"
            + (" (math.inf waits for ever)" if allow_inf else " (renew a shorter lease instead)")
        )
    return result


def fraction(value: object, name: str, *, upper: float = 1.0) -> float:
    """A number in [0, upper)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, not {value!r}")
    result = float(value)
    if not 0.0 <= result < upper:
        raise ConfigError(f"{name} must be in [0, {upper}), got {value!r}")
    return result


def check_key(key: object) -> str:
    """A lock name: a non-empty ``str`` that can be sent (UTF-8: no lone surrogate)."""
    if not isinstance(key, str):
        raise ConfigError(f"key must be a str, not {type(key).__name__}")
    if not key:
        raise ConfigError("key must not be empty")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"key {key!r} cannot be encoded as UTF-8: {exc.reason}") from None
    return key


def check_url(url: str) -> str:
    """Validate a server URL and return it in the form redis-py understands.

    Accepts ``redis://``, ``rediss://``, ``valkey://``, ``valkeys://`` (host required, optional
    port and ``/db``) and ``unix:///path``. Raises :class:`ConfigError` for anything else.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"malformed server URL {redact_url(url)!r}: {exc}") from None
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(f"unix URL needs a socket path: {redact_url(url)!r}")
        return url
    if parts.scheme not in _URL_SCHEMES:
        raise ConfigError(
            f"server URL must start with redis://, rediss://, valkey://, valkeys:// or unix://, "
            f"got {redact_url(url)!r}"
        )
    if not parts.hostname:
        raise ConfigError(f"server URL has no host: {redact_url(url)!r}")
    if parts.username and parts.password is None:
        # redis-py refuses it too: there is no AUTH with a user name alone, and sending none
        # would quietly run as the ``default`` user
        raise ConfigError(
            f"server URL names user {unquote(parts.username)!r} but gives no password: "
            f"{redact_url(url)!r} (redis://user:password@host)"
        )
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"server URL port out of range: {redact_url(url)!r}")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ConfigError(f"server URL database must be a number: {redact_url(url)!r}")
    return urlunsplit(parts._replace(scheme=_URL_SCHEMES[parts.scheme]))


#: Query options whose values are secrets (redis-py reads ``?password=`` as the password).
_SECRET_OPTIONS = frozenset({"password", "sentinel_password", "ssl_password"})


def redact_url(url: str) -> str:
    """The URL without its password, in the netloc or in a ``password`` query option (safe
    for logs, reprs and error messages)."""
    try:
        parts = original = urlsplit(url)
        if parts.password is not None:
            # the hosts as written: a Sentinel URL names several (``h1:p1,h2:p2``), which
            # ``parts.port`` cannot read
            userinfo, _, hosts = parts.netloc.rpartition("@")
            user = userinfo.partition(":")[0]
            parts = parts._replace(netloc=f"{user}:***@{hosts}")
        if parts.query:
            fields = parts.query.split("&")
            for index, one in enumerate(fields):
                name, eq, _ = one.partition("=")
                if eq and unquote(name).lower() in _SECRET_OPTIONS:
                    fields[index] = f"{name}=***"
            parts = parts._replace(query="&".join(fields))
        return url if parts == original else urlunsplit(parts)
    except ValueError:
        return "<malformed URL>"


def default_server_timeout(ttl: float) -> float:
    """``ttl/10`` within [0.05, 1.0] s, and never more than half the lease."""
    clamped = min(SERVER_TIMEOUT_MAX, max(SERVER_TIMEOUT_MIN, ttl * SERVER_TIMEOUT_FRACTION))
    return min(clamped, ttl / 2)


@dataclass(frozen=True, kw_only=True)
class LockOptions:
    """Everything a :class:`~fencelock.Lock` needs besides its servers and key (seconds)."""

    ttl: float = DEFAULT_TTL
    wait: float = DEFAULT_WAIT
    server_timeout: float = SERVER_TIMEOUT_MAX
    drift_factor: float = DRIFT_FACTOR
    drift_min: float = DRIFT_MIN
    retry_base: float = RETRY_BASE
    retry_cap: float = RETRY_CAP
    renew_every: float = DEFAULT_TTL * RENEW_FRACTION
    handoff_window: float = HANDOFF_WINDOW
    holder_info: bool = True
    purpose: str | None = None
    #: None: on for N > 1 servers (where a wiped restart could let a second majority form),
    #: off for one server (whose restart loses the lock whatever we do; fences keep growing)
    restart_delay: bool | None = None
    #: 0: a grant counts once the primary answered (replication is asynchronous); k > 0: only
    #: once ``WAIT k`` saw k replicas acknowledge it, so a failover keeps it
    replicas: int = 0
    #: seconds a fence register is kept after its last write (None: for ever)
    fence_retention: float | None = FENCE_RETENTION

    @classmethod
    def build(
        cls,
        *,
        ttl: object = DEFAULT_TTL,
        wait: object = DEFAULT_WAIT,
        server_timeout: object = None,
        drift_factor: object = DRIFT_FACTOR,
        drift_min: object = DRIFT_MIN,
        retry_base: object = RETRY_BASE,
        retry_cap: object = RETRY_CAP,
        renew_every: object = None,
        handoff_window: object = HANDOFF_WINDOW,
        holder_info: object = True,
        purpose: object = None,
        restart_delay: object = None,
        replicas: object = 0,
        fence_retention: object = FENCE_RETENTION,
    ) -> LockOptions:
        """Validate raw arguments; raises :class:`ConfigError` naming the first bad one."""
        ttl_s = seconds(ttl, "ttl")
        if ttl_s < 0.01:
            raise ConfigError(f"ttl must be at least 0.01 seconds, got {ttl!r}")
        wait_s = seconds(wait, "wait", allow_zero=True, allow_inf=True)
        timeout_s = (
            default_server_timeout(ttl_s)
            if server_timeout is None
            else seconds(server_timeout, "server_timeout")
        )
        if timeout_s >= ttl_s:
            raise ConfigError(
                f"server_timeout ({timeout_s} s) must be shorter than ttl ({ttl_s} s): "
                "a round that takes the whole lease can never produce a valid lease"
            )
        renew_s = (
            ttl_s * RENEW_FRACTION if renew_every is None else seconds(renew_every, "renew_every")
        )
        if renew_s >= ttl_s:
            raise ConfigError(f"renew_every ({renew_s} s) must be shorter than ttl ({ttl_s} s)")
        if not isinstance(holder_info, bool):
            raise ConfigError(f"holder_info must be a bool, not {holder_info!r}")
        if restart_delay is not None and not isinstance(restart_delay, bool):
            raise ConfigError(f"restart_delay must be a bool or None, not {restart_delay!r}")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigError(f"replicas must be an int >= 0, not {replicas!r}")
        if purpose is not None and not isinstance(purpose, str):
            raise ConfigError(f"purpose must be a str or None, not {purpose!r}")
        drift_min_s = seconds(drift_min, "drift_min", allow_zero=True)
        if drift_min_s >= ttl_s:
            raise ConfigError(
                f"drift_min ({drift_min_s} s) must be shorter than ttl ({ttl_s} s): "
                "no lease could ever be valid"
            )
        retention_s = None
        if fence_retention is not None:
            retention_s = seconds(fence_retention, "fence_retention")
            if retention_s == FENCE_RETENTION:  # the default: a lease may be even longer
                retention_s = max(retention_s, ttl_s)
            if retention_s < max(FENCE_RETENTION_MIN, ttl_s):
                raise ConfigError(
                    f"fence_retention ({retention_s} s) must be at least the ttl ({ttl_s} s) "
                    f"and {FENCE_RETENTION_MIN:g} s: the fence register must outlive the "
                    "lease it fenced and any clock step of the server"
                )
        base_s = seconds(retry_base, "retry_base")
        cap_s = seconds(retry_cap, "retry_cap")
        if cap_s < base_s:
            raise ConfigError(f"retry_cap ({cap_s}) must be >= retry_base ({base_s})")
        return cls(
            ttl=ttl_s,
            wait=wait_s,
            server_timeout=timeout_s,
            drift_factor=fraction(drift_factor, "drift_factor", upper=0.5),
            drift_min=drift_min_s,
            retry_base=base_s,
            retry_cap=cap_s,
            renew_every=renew_s,
            handoff_window=seconds(handoff_window, "handoff_window", allow_zero=True),
            holder_info=holder_info,
            purpose=purpose,
            restart_delay=restart_delay,
            replicas=replicas,
            fence_retention=retention_s,
        )
