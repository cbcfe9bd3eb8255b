"""A batch e-mail job whose lock is lost mid-batch: the lock alone sends duplicates, a unique
constraint on (batch_id, recipient) sends none.

Run it with ``python examples/batch_email.py``: it starts its own Redis/Valkey server (through
``fencelock.testing``) and a SQLite file in a temporary directory, runs the job twice (without,
then with the constraint) and prints what each recipient received. Exit code 0 when the run
without the constraint showed duplicates and the run with it showed none.

The story, the same in both runs:

1. Worker A takes the lock (renewal off), lists the recipients not yet recorded, and sends to
   the first few. Before each send it checks ``lease.ensure_valid()``.
2. Right after such a check A stops (a GC pause, swap, a stopped VM) for longer than its lease.
   Its lease expires on the server (``--lose expire``, the default) or is deleted behind its
   back (``--lose delete``: as if the server lost the key; A's own clock still says "valid").
3. Worker B takes the lock, lists the recipients not yet recorded and sends to all of them.
4. A resumes, still inside its loop with its old list, and sends the e-mail it had checked
   for. With ``expire`` its next check fails and it stops: one duplicate. With ``delete`` every
   check passes and it re-sends the rest of its list: many duplicates.

Each worker records a send *before* sending (the record is the claim). Without a unique
constraint the record always succeeds and A re-sends what B sent. With the constraint A's
insert fails for each recipient B already has, and A skips it: exactly one e-mail each.

(Record-then-send is at-most-once: a crash between the two loses that e-mail. Pair the
constraint with the mail provider's idempotency key if you need exactly-once.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from fencelock import Lock, LockLost
from fencelock.testing import Server

PAUSE_DEADLINE_S = 30.0  # generous bound on every wait between the two workers


class Mailer:
    """Stands in for the mail provider: the outside world, where a duplicate cannot be undone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: list[tuple[str, str]] = []  # (worker, recipient) in send order

    def send(self, worker: str, recipient: str) -> None:
        with self._lock:
            self.sent.append((worker, recipient))


@dataclass
class Pause:
    """Where worker A stops: after ``after`` sends, until ``resume`` is set."""

    after: int
    paused: threading.Event = field(default_factory=threading.Event)
    resume: threading.Event = field(default_factory=threading.Event)


@dataclass
class WorkerReport:
    name: str
    fence: int = 0
    sent: int = 0
    skipped: int = 0  # recipients someone else had already recorded
    stopped_by_check: bool = False  # ensure_valid() raised LockLost before a send
    lost_at_release: bool = False  # release() raised LockLost: the lease had been lost


@dataclass
class Outcome:
    unique: bool
    lose: str
    recipients: list[str]
    sent: list[tuple[str, str]]
    workers: dict[str, WorkerReport]

    @property
    def per_recipient(self) -> Counter[str]:
        return Counter(recipient for _, recipient in self.sent)

    @property
    def duplicates(self) -> int:
        """E-mails beyond the first for each recipient."""
        return sum(n - 1 for n in self.per_recipient.values())

    @property
    def missed(self) -> list[str]:
        return [r for r in self.recipients if self.per_recipient[r] == 0]


def make_table(metadata: sa.MetaData, unique: bool) -> sa.Table:
    """The send log. ``unique=True`` adds the constraint that makes a send claimable once."""
    constraints = [sa.UniqueConstraint("batch_id", "recipient")] if unique else []
    return sa.Table(
        "email_sends",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("recipient", sa.String(200), nullable=False),
        sa.Column("worker", sa.String(20), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        *constraints,
    )


def pending(engine: sa.Engine, table: sa.Table, batch_id: str, recipients: list[str]) -> list[str]:
    """Recipients of the batch with no recorded send yet."""
    with engine.connect() as conn:
        done = set(
            conn.execute(sa.select(table.c.recipient).where(table.c.batch_id == batch_id)).scalars()
        )
    return [r for r in recipients if r not in done]


def claim(
    engine: sa.Engine, table: sa.Table, batch_id: str, recipient: str, worker: str, fence: int
) -> bool:
    """Record the send; False if the constraint says it was already recorded (by anyone)."""
    row = {
        "batch_id": batch_id,
        "recipient": recipient,
        "worker": worker,
        "fence": fence,
    }
    try:
        with engine.begin() as conn:
            conn.execute(table.insert().values(**row))
    except IntegrityError:
        return False
    return True


def send_batch(
    name: str,
    lock: Lock,
    engine: sa.Engine,
    table: sa.Table,
    mailer: Mailer,
    batch_id: str,
    recipients: list[str],
    report: WorkerReport,
    pause: Pause | None = None,
) -> None:
    """One worker's run: take the lock, send to every recipient not yet recorded, release."""
    lease = lock.acquire()
    report.fence = lease.fence
    for recipient in pending(engine, table, batch_id, recipients):
        try:
            lease.ensure_valid()  # a check narrows the window, it cannot close it:
        except LockLost:  # the pause below comes right after a check that passed
            report.stopped_by_check = True
            break
        if pause is not None and report.sent == pause.after and not pause.paused.is_set():
            pause.paused.set()
            if not pause.resume.wait(PAUSE_DEADLINE_S):
                raise TimeoutError("never resumed")
        if claim(engine, table, batch_id, recipient, name, lease.fence):
            mailer.send(name, recipient)
            report.sent += 1
        else:
            report.skipped += 1
    try:
        lease.release()
    except LockLost:
        report.lost_at_release = True


def run_batch(
    server_url: str,
    *,
    unique: bool,
    recipients: int = 20,
    pause_after: int = 8,
    lose: str = "delete",
    ttl: float = 1.0,
    db_url: str | None = None,
) -> Outcome:
    """Run the story once and return what was sent.

    ``lose``: ``"delete"`` deletes A's lock key while A is paused (instant); ``"expire"``
    lets A's lease (``ttl`` seconds, renewal off) run out while B waits for it.
    ``db_url``: a SQLAlchemy URL (default: a SQLite file in a temporary directory).
    """
    if lose not in ("delete", "expire"):
        raise ValueError(f"lose must be 'delete' or 'expire', not {lose!r}")
    if not 0 < pause_after < recipients:
        raise ValueError("pause_after must be between 1 and recipients - 1")
    batch_id = f"batch-{uuid.uuid4().hex[:8]}"
    key = f"email:{batch_id}"
    people = [f"user{i:03d}@example.com" for i in range(recipients)]
    with tempfile.TemporaryDirectory() as tmp:
        url = db_url or f"sqlite:///{Path(tmp) / 'emails.db'}"
        engine = sa.create_engine(
            url, connect_args={"timeout": 30} if url.startswith("sqlite") else {}
        )
        metadata = sa.MetaData()
        table = make_table(metadata, unique)
        metadata.drop_all(engine)
        metadata.create_all(engine)
        mailer = Mailer()
        reports = {"A": WorkerReport("A"), "B": WorkerReport("B")}
        lock_a = Lock(server_url, key, ttl=ttl, wait=PAUSE_DEADLINE_S)
        lock_b = Lock(server_url, key, ttl=ttl, wait=PAUSE_DEADLINE_S)
        pause = Pause(after=pause_after)
        errors: list[BaseException] = []

        def run(*args: Any, **kwargs: Any) -> None:
            try:
                send_batch(*args, **kwargs)
            except BaseException as exc:  # reported by the caller
                errors.append(exc)

        common = (engine, table, mailer, batch_id, people)
        a = threading.Thread(target=run, args=("A", lock_a, *common, reports["A"], pause))
        try:
            a.start()
            if not pause.paused.wait(PAUSE_DEADLINE_S):
                raise TimeoutError(f"worker A did not reach its pause: {errors}")
            if lose == "delete":
                with redis.Redis.from_url(server_url, socket_timeout=5) as client:
                    client.delete(f"fencelock:{{{key}}}")  # A's lease is gone; A does not know
            # B waits for the lock: at once after "delete", up to ``ttl`` s for "expire"
            b = threading.Thread(target=run, args=("B", lock_b, *common, reports["B"]))
            b.start()
            b.join(PAUSE_DEADLINE_S * 2)
        finally:
            pause.resume.set()  # A wakes up, still believing it holds the lock
            a.join(PAUSE_DEADLINE_S * 2)
            lock_a.close()
            lock_b.close()
            metadata.drop_all(engine)
            engine.dispose()
        if errors:
            raise RuntimeError(f"a worker failed: {errors[0]!r}") from errors[0]
    return Outcome(unique, lose, people, list(mailer.sent), reports)


def describe(outcome: Outcome) -> str:
    a, b = outcome.workers["A"], outcome.workers["B"]
    label = "with" if outcome.unique else "without"
    lines = [
        f"{label} UNIQUE(batch_id, recipient): {len(outcome.recipients)} recipients, "
        f"{len(outcome.sent)} e-mails sent, {outcome.duplicates} duplicates, "
        f"{len(outcome.missed)} missed",
        f"  A (fence {a.fence}): sent {a.sent}, skipped {a.skipped}, "
        f"stopped by ensure_valid(): {a.stopped_by_check}, "
        f"release found the lease lost: {a.lost_at_release}",
        f"  B (fence {b.fence}): sent {b.sent}, skipped {b.skipped}",
    ]
    doubled = sorted(r for r, n in outcome.per_recipient.items() if n > 1)
    if doubled:
        lines.append(
            f"  received twice: {', '.join(doubled[:3])}{' ...' if len(doubled) > 3 else ''}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--server", help="a Redis/Valkey URL (default: start an embedded server)")
    parser.add_argument("--recipients", type=int, default=20)
    parser.add_argument("--pause-after", type=int, default=8)
    parser.add_argument("--lose", choices=["expire", "delete"], default="expire")
    args = parser.parse_args(argv)

    def both(url: str) -> tuple[Outcome, Outcome]:
        return tuple(  # type: ignore[return-value]
            run_batch(
                url,
                unique=unique,
                recipients=args.recipients,
                pause_after=args.pause_after,
                lose=args.lose,
            )
            for unique in (False, True)
        )

    if args.server:
        without, with_ = both(args.server)
    else:
        with Server() as server:
            without, with_ = both(server.url)
    print(f"lease lost by: {args.lose}; worker A pauses after {args.pause_after} sends\n")
    print(describe(without))
    print(describe(with_))
    ok = without.duplicates > 0 and with_.duplicates == 0 and not with_.missed
    print("\nok: the constraint prevented every duplicate" if ok else "\nUNEXPECTED outcome")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
