"""Scale check: many leases held at once by one process, renewed by the shared watchdog.

    .venv/bin/python benchmarks/scale.py [--leases 10000] [--ttl 30] [--every 10] [--hold 25]

Reports client memory (tracemalloc peak and RSS delta), server memory (``INFO memory``
``used_memory`` delta), renewal traffic (``INFO commandstats`` ``cmdstat_evalsha`` calls per
second while holding), then releases every lease and checks that only fence registers remain.
Uses one embedded server (``$FENCELOCK_SERVER_BIN`` picks the engine).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
from typing import Any

from fencelock import Lease, Lock
from fencelock.testing import Server


def _evalsha_calls(client: Any) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def _rss_kib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="hold many leases, renewed by the watchdog")
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--hold", type=float, default=25.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    # Locks on one server share its connections now; the raised client cap is kept only as a
    # margin for the renewal pool's parallel calls
    with Server(extra_args=("--maxclients", str(args.leases + 1000))) as server:
        admin = server.client()
        info = admin.info("server")
        used0 = int(admin.info("memory")["used_memory"])
        rss0 = _rss_kib()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        t0 = time.monotonic()
        # one Lock per key (a Lock is a key's definition); they share the watchdog
        locks = [Lock(server.url, f"scale:{i}", ttl=args.ttl) for i in range(args.leases)]
        leases: list[Lease] = []
        for lock in locks:
            lease = lock.acquire(wait=1.0)
            lease.keep_alive(every=args.every)
            leases.append(lease)
        acquire_s = time.monotonic() - t0
        traced_now, traced_peak = tracemalloc.get_traced_memory()
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        top = snap1.compare_to(snap0, "filename")[:5]
        rss1 = _rss_kib()
        used1 = int(admin.info("memory")["used_memory"])
        calls0 = _evalsha_calls(admin)
        h0 = time.monotonic()
        time.sleep(args.hold)
        held_s = time.monotonic() - h0
        calls1 = _evalsha_calls(admin)
        lost = sum(1 for lease in leases if lease.lost.is_set())
        valid = sum(1 for lease in leases if lease.valid)
        r0 = time.monotonic()
        for lease in leases:
            lease.release()
        release_s = time.monotonic() - r0
        keys = [k.decode() for k in admin.scan_iter(match="fencelock:*", count=5000)]
        non_fence = [k for k in keys if not k.endswith(":fence")]
        used2 = int(admin.info("memory")["used_memory"])
        for lock in locks:
            lock.close()
    renewals = calls1 - calls0
    result = {
        "leases": args.leases,
        "ttl_s": args.ttl,
        "renew_every_s": args.every,
        "held_s": round(held_s, 1),
        "acquire_all_s": round(acquire_s, 2),
        "release_all_s": round(release_s, 2),
        "client_traced_bytes_per_lease": round(traced_now / args.leases),
        "client_traced_peak_mib": round(traced_peak / 2**20, 1),
        "client_rss_delta_mib": round((rss1 - rss0) / 1024, 1),
        "client_top_allocators": [str(s) for s in top],
        "server_used_memory_delta_bytes_per_lease": round((used1 - used0) / args.leases),
        "server_used_memory_after_release_bytes_per_lock": round((used2 - used0) / args.leases),
        "renewal_evalsha_per_s": round(renewals / held_s, 1),
        "expected_renewals_per_s": round(args.leases / args.every, 1),
        "renewals_per_lease": round(renewals / args.leases, 2),
        "lost_while_held": lost,
        "valid_at_end_of_hold": valid,
        "keys_after_release": len(keys),
        "non_fence_keys_after_release": len(non_fence),
        "engine": (info.get("valkey_version") and f"valkey {info['valkey_version']}")
        or f"redis {info.get('redis_version')}",
    }
    if args.json:
        print(json.dumps(result))
    else:
        for name, value in result.items():
            print(f"{name:<50} {value}")
    ok = lost == 0 and not non_fence and result["renewals_per_lease"] >= 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
