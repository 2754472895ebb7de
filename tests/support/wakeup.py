"""How long an idle Dispatcher takes to lease a job scheduled due-now."""

from __future__ import annotations

import asyncio
import threading
import time

from pgstore import PgJobStore
from pgstore.runtime.dispatcher import Dispatcher


def wake_up_latency(dispatcher: Dispatcher, producer: PgJobStore, got: threading.Event) -> float:
    """Run ``dispatcher`` until its listener listens and it sits idle in its poll wait,
    schedule a due-now job with ``producer``, and return the seconds until ``got`` (set
    by the dispatch) is set, at most 10; then stop the dispatcher."""

    async def main() -> float:
        runner = asyncio.ensure_future(dispatcher.run())
        while dispatcher._wakeups.wakeups is None:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(dispatcher._wakeups.wakeups.listening.wait(), 10)
        await asyncio.sleep(0.3)  # the dispatcher is idle in its poll wait
        started = time.monotonic()
        await asyncio.to_thread(producer.schedule, "now", producer.now_ms())
        await asyncio.to_thread(got.wait, 10)
        latency = time.monotonic() - started
        dispatcher.stop()
        await runner
        return latency

    return asyncio.run(main())
