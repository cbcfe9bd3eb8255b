"""The result of a chaos run: the JSON object of ``fencelock chaos --json`` and the final table.

:class:`ChaosResult` holds exactly the fields DESIGN.md names (``acquisitions``,
``fenced_writes_accepted``, ``stale_writes_rejected``, ``stale_writes_accepted``,
``lost_updates``, ``unfenced_overlaps``, ``availability``, ``faults``, ``duration_s``) and, in
``details``, extra figures (the canary's lost updates, double grants, fence order, recovery
times, the fault log) that :meth:`ChaosResult.to_json` adds after them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JSON_FIELDS", "ChaosResult", "availability"]

JSON_FIELDS = (
    "acquisitions",
    "fenced_writes_accepted",
    "stale_writes_rejected",
    "stale_writes_accepted",
    "lost_updates",
    "unfenced_overlaps",
    "availability",
    "faults",
    "duration_s",
)


@dataclass
class ChaosResult:
    """One run's figures.

    - ``acquisitions``: leases granted;
    - ``fenced_writes_accepted`` / ``stale_writes_rejected``: fenced register writes the store
      accepted / refused for an older fence (advance or write);
    - ``stale_writes_accepted``: fenced writes accepted although the store had acknowledged a
      newer fence before they were sent (must be 0);
    - ``lost_updates``: acknowledged increments of the *fenced* register missing from its final
      value (must be 0);
    - ``unfenced_overlaps``: canary writes acknowledged after a newer holder had acquired (what
      fencing refuses; expected > 0 under pauses);
    - ``availability``: fraction of 1-second buckets of the run with at least one acquisition;
    - ``faults``: faults injected, by name; ``duration_s``: wall time of the workload, seconds.
    """

    acquisitions: int
    fenced_writes_accepted: int
    stale_writes_rejected: int
    stale_writes_accepted: int
    lost_updates: int
    unfenced_overlaps: int
    availability: float
    faults: dict[str, int]
    duration_s: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def safe(self) -> bool:
        """No safety violation on the fenced register (the exit-code rule)."""
        return (
            self.stale_writes_accepted == 0
            and self.lost_updates == 0
            and not self.details.get("phantom_writes", 0)
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON object: DESIGN.md's fields first, then the details."""
        data: dict[str, Any] = {name: getattr(self, name) for name in JSON_FIELDS}
        for key, value in self.details.items():
            data.setdefault(key, value)
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=False)

    def table(self) -> str:
        """The human summary (several lines, no trailing newline)."""
        d = self.details
        rows: list[tuple[str, str, str]] = [
            ("acquisitions", str(self.acquisitions), ""),
            ("fenced writes accepted", str(self.fenced_writes_accepted), ""),
            ("stale writes rejected", str(self.stale_writes_rejected), "fencing at work"),
            (
                "stale writes accepted",
                str(self.stale_writes_accepted),
                _verdict(self.stale_writes_accepted == 0),
            ),
            ("lost updates (fenced)", str(self.lost_updates), _verdict(self.lost_updates == 0)),
            ("unfenced overlaps (canary)", str(self.unfenced_overlaps), "what fencing prevents"),
            (
                "lost updates (canary)",
                str(d.get("canary_lost_updates", "-")),
                _rate(d.get("canary_lost_updates"), d.get("canary_writes_acknowledged")),
            ),
            (
                "double grants",
                str(d.get("double_grants", "-")),
                "two valid leases at once (fault-induced)",
            ),
            ("holders outliving their lease", str(d.get("outlived_leases", "-")), ""),
            ("fence order violations", str(d.get("fence_violations", "-")), ""),
            ("availability", f"{self.availability:.1%}", "1-s buckets with an acquisition"),
            (
                "recovery after heal (max)",
                _seconds(d.get("recovery_max_s")),
                f"bound {_seconds(d.get('recovery_bound_s'))}, late: {d.get('liveness_late', '-')}",
            ),
            ("duration", f"{self.duration_s:.1f} s", ""),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"{name:<{width}}  {value:>10}  {note}".rstrip() for name, value, note in rows]
        faults = ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"
        lines.append(f"{'faults':<{width}}  {faults}")
        lines.append(
            "result: "
            + (
                "SAFE (no violation on the fenced register)"
                if self.safe
                else "VIOLATION on the fenced register"
            )
        )
        return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "ok" if ok else "VIOLATION"


def _rate(part: object, whole: object) -> str:
    if isinstance(part, int) and isinstance(whole, int) and whole > 0:
        return f"{part / whole:.1%} of acknowledged canary writes"
    return ""


def _seconds(value: object) -> str:
    return f"{value:.2f} s" if isinstance(value, int | float) else "-"


def availability(
    acquired_ns: list[int], start_ns: int, end_ns: int, bucket_s: float = 1.0
) -> float:
    """Fraction of ``bucket_s``-second buckets in ``[start_ns, end_ns)`` with at least one
    acquisition (1.0 for an empty interval)."""
    width = int(bucket_s * 1e9)
    buckets = max((end_ns - start_ns) // width, 0)
    if buckets == 0:
        return 1.0
    hit = {
        (t - start_ns) // width for t in acquired_ns if start_ns <= t < start_ns + buckets * width
    }
    return round(len(hit) / buckets, 4)
