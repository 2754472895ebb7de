/**
 * pgstore from TypeScript: the @pgstore/client package (clients/typescript), whose
 * PgScheduleStore and PgJobStore call the store's SQL functions with node-postgres.
 *
 * Reads PGSTORE_DSN (a postgresql:// URL) and PGSTORE_SCHEMA (default "pgstore",
 * a schema that `pgstore migrate` has built), then:
 *
 *   1. register: a schedule due now;
 *   2. claimDue as "node-a" with a short lease: gets a fencing token;
 *   3. claimDue as "node-b" once node-a's lease has run out: the next token;
 *   4. complete with node-a's token: refused (false), the token is stale;
 *   5. complete with node-b's token: accepted (true);
 *   6. a bad argument: InvalidArgument (SQLSTATE 22023), nothing changed;
 *   7. schedule of a job due now: its NOTIFY wakes an idle pgstore Dispatcher.
 *
 * Each step prints one JSON object on a line of stdout (tokens and times as
 * strings, as the SQL functions return them). Exits 1, with the reason on
 * stderr, when the store answers otherwise.
 */

import { randomUUID } from "node:crypto";

import pg from "pg";

import { InvalidArgument, PgJobStore, PgScheduleStore } from "@pgstore/client";

type Report = Record<string, string | boolean | null>;

const INTERVAL_MS = 60_000;

function requiredEnv(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") {
    throw new Error(`${name} is not set: give it a postgresql:// URL`);
  }
  return value;
}

function report(step: string, fields: Report): void {
  process.stdout.write(`${JSON.stringify({ step, ...fields })}\n`);
}

function fail(message: string): never {
  throw new Error(message);
}

async function main(): Promise<void> {
  const client = new pg.Client({
    connectionString: requiredEnv("PGSTORE_DSN"),
    application_name: "pgstore-typescript-example",
  });
  // The stores quote the schema themselves: any name is only a name.
  const options = { schema: process.env["PGSTORE_SCHEMA"] || "pgstore" };
  const schedules = new PgScheduleStore(client, options);
  const jobs = new PgJobStore(client, options);
  // Unique ids: the program can run again on the same schema.
  const suffix = randomUUID().slice(0, 8);
  const scheduleId = `ts-report-${suffix}`;
  const runId = `ts-meeting-${suffix}`;

  await client.connect();
  try {
    await schedules.start();
    await jobs.start();
    // The database clock: every time the store compares comes from here.
    const now = await schedules.nowMs();

    const registered = await schedules.register(
      { id: scheduleId, kind: "interval", spec: String(INTERVAL_MS), nextRunAt: now },
      now,
    );
    report("register", {
      id: registered.id,
      fencing_token: String(registered.fencingToken),
      next_run_at: String(registered.nextRunAt),
    });

    // node-a claims with a 1 s lease, on the database clock (now: null).
    const a = (await schedules.claimDue(scheduleId, "node-a", null, 1_000)) ??
      fail("node-a: the schedule was not claimable");
    const expiry = a.record.leaseUntil ?? fail("node-a's claim has no leaseUntil");
    report("claim", { owner: "node-a", fencing_token: String(a.fencingToken), lease_until: String(expiry) });

    // node-a stalls past its lease; node-b claims at the instant the lease runs out.
    const b = (await schedules.claimDue(scheduleId, "node-b", expiry, 30_000)) ??
      fail("node-b: the expired lease was not claimable");
    report("claim", {
      owner: "node-b",
      fencing_token: String(b.fencingToken),
      lease_until: String(b.record.leaseUntil),
    });

    // node-a wakes up and tries to commit with its old token: refused.
    const next = { nextRunAt: now + INTERVAL_MS, lastStatus: "ok" } as const;
    const stale = await schedules.complete(scheduleId, a.fencingToken, { ...next, lastRunAt: now }, null);
    report("complete", { owner: "node-a", fencing_token: String(a.fencingToken), completed: stale });
    if (stale) fail("a stale fencing token was accepted");

    const fresh = await schedules.complete(scheduleId, b.fencingToken, { ...next, lastRunAt: expiry }, null);
    report("complete", { owner: "node-b", fencing_token: String(b.fencingToken), completed: fresh });
    if (!fresh) fail("the current fencing token was refused");

    // Bad input raises InvalidArgument (22023) naming the parameter, and changes nothing.
    try {
      await schedules.claimDue(scheduleId, "", null, 30_000);
      fail("an empty owner was accepted");
    } catch (error) {
      if (!(error instanceof InvalidArgument)) throw error;
      report("bad_input", { sqlstate: error.sqlstate, message: error.message });
    }

    // Autocommit: the NOTIFY is delivered as this call returns.
    const dispatchAt = await jobs.nowMs();
    await jobs.schedule({ runId, dispatchAt });
    report("job_schedule", { run_id: runId, dispatch_at: String(dispatchAt) });
  } finally {
    await client.end();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`pgstore example: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
});
