/**
 * agentos' meeting dispatcher on pgstore: a PgJobStore as its IJobStore.
 *
 * The app schedules a bot for each meeting (schedule). A dispatcher loop leases the
 * next due job (lease), asks the provider for a bot, and records the dispatch with
 * the lease's sequence as a fence (markDispatched): if a cancel arrived meanwhile it
 * answers cancelled, and the bot is told to leave at once. A failed provider call
 * gives the lease back for a retry, with the error kept (release).
 *
 * A lease takes any due job of the schema: give each fleet of dispatchers a schema
 * of its own (pgstore migrate --schema ...), never share one with unrelated jobs.
 *
 *     PGSTORE_DSN=postgresql://app@127.0.0.1/app PGSTORE_SCHEMA=meetings \
 *       node build-test/examples/dispatcher.js
 *
 * One JSON line per step on stdout.
 */

import pg from "pg";

import { PgJobStore } from "@pgstore/client";

const HOLDER = `dispatcher-${process.pid}`;
const TTL_MS = 30_000;

function log(step: string, fields: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ step, ...fields })}\n`);
}

/** The provider: joins a bot to the meeting; the first call for "flaky" fails. */
const failedOnce = new Set<string>();
async function joinBot(runId: string, idempotencyKey: string): Promise<string> {
  if (runId.startsWith("flaky") && !failedOnce.has(runId)) {
    failedOnce.add(runId);
    throw new Error("provider timeout");
  }
  return `bot-for-${runId}-${idempotencyKey}`;
}

/** One pass of the dispatch loop: every job due now, one lease at a time. */
async function dispatchDue(jobs: PgJobStore): Promise<void> {
  for (;;) {
    const job = await jobs.lease(HOLDER, null, TTL_MS);
    if (job === undefined) return; // nothing leasable right now
    // (runId, leaseSequence) names this lease: the provider call's idempotency key.
    const key = `${job.runId}:${job.leaseSequence}`;
    let workerId: string;
    try {
      workerId = await joinBot(job.runId, job.leaseSequence.toString());
    } catch (error) {
      const now = await jobs.nowMs();
      const released = await jobs.release(job.runId, HOLDER, now, {
        leaseSequence: job.leaseSequence,
        error: (error as Error).message,
      });
      log("release", { runId: job.runId, key, released, attempts: job.attempts });
      continue;
    }
    const mark = await jobs.markDispatched(job.runId, HOLDER, workerId, job.leaseSequence);
    log("dispatched", { runId: job.runId, key, workerId, ...mark });
    if (mark.cancelled) log("leave", { runId: job.runId, workerId, reason: "cancelled while joining" });
  }
}

async function main(): Promise<void> {
  const pool = new pg.Pool({ connectionString: process.env["PGSTORE_DSN"] });
  const jobs = new PgJobStore(pool, { schema: process.env["PGSTORE_SCHEMA"] ?? "pgstore" });
  try {
    await jobs.start();
    const now = await jobs.nowMs();
    await jobs.schedule({ runId: "standup", dispatchAt: now });
    await jobs.schedule({ runId: "flaky-retro", dispatchAt: now });
    await jobs.schedule({ runId: "cancelled-sync", dispatchAt: now });
    await jobs.schedule({ runId: "tomorrow", dispatchAt: now + 86_400_000 });
    log("cancel", { runId: "cancelled-sync", answer: await jobs.cancel("cancelled-sync") });

    await dispatchDue(jobs); // standup dispatched; flaky-retro released for a retry
    await dispatchDue(jobs); // flaky-retro dispatched on its second attempt

    // A cancel after the dispatch: the bot is out, the caller tells it to leave.
    log("cancel", { runId: "standup", answer: await jobs.cancel("standup") });
    const dispatched = await jobs.listDispatched();
    log("reconcile", { dispatched: dispatched.map((j) => [j.runId, j.workerId, j.attempts]) });
    const tomorrow = await jobs.get("tomorrow");
    log("waiting", { runId: tomorrow?.runId, dispatched: tomorrow?.dispatched, attempts: tomorrow?.attempts });
  } finally {
    await pool.end();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`dispatcher example: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exitCode = 1;
});
