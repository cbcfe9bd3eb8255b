"""Hand-off over one server and over N, the bench's way (issue 24).

Eight threads take turns on one key, with ``fencelock bench``'s hand-off threads (acquire, waiting;
1 ms of work; release), for ``--seconds`` per round, on one embedded server and on ``--servers``
of them (``$FENCELOCK_SERVER_BIN`` or the test kit's default binary), and prints the bench's
hand-off figures for each round: acquisitions per second, the release -> another worker's
acquire p50 in µs, and the rounds a woken waiter ran before it held the lock (0: one server
hands the lock over in its release; 1: over N servers a release wakes a waiter, which then
acquires).

Usage: ``python benchmarks/handoff_servers.py [--servers N] [--seconds S] [--rounds N]``.
"""

from __future__ import annotations

import argparse

from fencelock.cli.bench import _handoff_figures, _handoff_threads
from fencelock.testing import ServerGroup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=3, help="N for the second case")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each case")
    args = parser.parse_args()
    with ServerGroup(args.servers) as group:
        urls = list(group.urls)
        print(f"{'servers':<9}{'acq/s':>8}{'release->other p50 us':>24}{'claim rounds':>14}")
        for index in range(args.rounds):
            for servers in (urls[0], urls):
                n = 1 if isinstance(servers, str) else len(servers)
                key = f"handoff-servers:{n}:{index}"
                figures = _handoff_figures(
                    _handoff_threads(servers, key, args.seconds), args.seconds
                )
                print(
                    f"{n:<9}{figures['acquisitions_per_s']:>8.0f}"
                    f"{figures['other_worker_p50_us']:>24.0f}{figures['claim_rtts']:>14.2f}"
                )


if __name__ == "__main__":
    main()
