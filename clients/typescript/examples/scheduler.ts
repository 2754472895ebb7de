/**
 * botmesh's scheduler on pgstore: a PgScheduleStore as `BotConfig.scheduler.store`.
 *
 * Two scheduler nodes share one schema. Each tick, a node claims a due task
 * (claimDue), runs it while renewing its lease, and commits the occurrence with its
 * fencing token (complete). A node that stalled past its lease finds its token
 * stale: its complete answers false and it must not treat the run as done.
 *
 *     PGSTORE_DSN=postgresql://app@127.0.0.1/app PGSTORE_SCHEMA=pgstore \
 *       node build-test/examples/scheduler.js
 *
 * One JSON line per step on stdout.
 */

import pg from "pg";

import { PgScheduleStore, type ScheduleStore } from "@pgstore/client";

const INTERVAL_MS = 60_000;
const LEASE_MS = 30_000;

function log(step: string, fields: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ step, ...fields })}\n`);
}

/** One tick of one node: claim the task if due, run it, commit the occurrence. */
async function tick(store: ScheduleStore, id: string, owner: string, now: number): Promise<void> {
  const claim = await store.claimDue(id, owner, now, LEASE_MS);
  if (claim === null) {
    log("skip", { owner, reason: "not due, or leased by another node" });
    return;
  }
  log("claim", { owner, fencingToken: claim.fencingToken, leaseUntil: claim.record.leaseUntil });
  // ... the task runs here; a long one renews its lease, and stops if the lease is lost:
  if (!(await store.renew(id, claim.fencingToken, now + LEASE_MS))) return;
  const committed = await store.complete(
    id,
    claim.fencingToken,
    { nextRunAt: now + INTERVAL_MS, lastRunAt: now, lastStatus: "ok" },
    now,
  );
  log("complete", { owner, fencingToken: claim.fencingToken, committed });
}

async function main(): Promise<void> {
  const pool = new pg.Pool({ connectionString: process.env["PGSTORE_DSN"] });
  const store = new PgScheduleStore(pool, { schema: process.env["PGSTORE_SCHEMA"] ?? "pgstore" });
  try {
    await store.start();
    const now = await store.nowMs(); // the database clock: every node compares against it
    const id = `daily-report-${now}`;
    const rec = await store.register({ id, kind: "interval", spec: String(INTERVAL_MS), nextRunAt: now }, now);
    log("register", { id, fencingToken: rec.fencingToken, nextRunAt: rec.nextRunAt });

    // Both nodes tick at once: exactly one claims.
    await Promise.all([tick(store, id, "node-a", now), tick(store, id, "node-b", now)]);

    // A restart registers the same task again: untouched, it keeps its nextRunAt.
    const again = await store.register({ id, kind: "interval", spec: String(INTERVAL_MS), nextRunAt: now }, now);
    log("restart", { nextRunAt: again.nextRunAt, kept: again.nextRunAt === now + INTERVAL_MS });

    // A stalled node: claims the next occurrence, stalls past its lease, is overtaken.
    const next = now + INTERVAL_MS;
    const slow = await store.claimDue(id, "node-a", next, LEASE_MS);
    const fast = await store.claimDue(id, "node-b", next + LEASE_MS, LEASE_MS);
    if (slow === null || fast === null) throw new Error("the occurrence was not claimable");
    const late = await store.complete(
      id, slow.fencingToken, { nextRunAt: next + INTERVAL_MS, lastRunAt: next, lastStatus: "ok" }, next + LEASE_MS,
    );
    const current = await store.complete(
      id, fast.fencingToken, { nextRunAt: next + INTERVAL_MS, lastRunAt: next + LEASE_MS, lastStatus: "ok" }, next + LEASE_MS,
    );
    log("fenced", { staleToken: slow.fencingToken, staleCommitted: late, currentToken: fast.fencingToken, currentCommitted: current });
    await store.delete(id);
  } finally {
    await pool.end();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`scheduler example: ${error instanceof Error ? error.stack : String(error)}\n`);
  process.exitCode = 1;
});
