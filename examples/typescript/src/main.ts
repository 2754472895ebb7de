/**
 * pgstore from TypeScript: the store's SQL functions called with node-postgres.
 *
 * Reads PGSTORE_DSN (a postgresql:// URL) and PGSTORE_SCHEMA (default "pgstore",
 * a schema that `pgstore migrate` has built), then:
 *
 *   1. schedule_register: a schedule due now;
 *   2. schedule_claim_due as "node-a" with a short lease: gets a fencing token;
 *   3. schedule_claim_due as "node-b" once node-a's lease has run out: the next token;
 *   4. schedule_complete with node-a's token: refused (false), the token is stale;
 *   5. schedule_complete with node-b's token: accepted (true);
 *   6. a bad argument: SQLSTATE 22023, nothing changed;
 *   7. job_schedule of a job due now: its NOTIFY wakes an idle pgstore Dispatcher.
 *
 * Each step prints one JSON object on a line of stdout. bigint columns arrive
 * from node-postgres as strings; they are kept as BigInt (exact) and printed as
 * strings. Exits 1, with the reason on stderr, when the store answers otherwise.
 */

import { randomUUID } from "node:crypto";

import pg from "pg";

/** Where the store's functions live; the schema is quoted by pg, never spliced raw. */
interface Store {
  client: pg.Client;
  /** The schema as a quoted identifier, e.g. "pgstore" or "my ""odd"" schema". */
  schema: string;
}

interface ScheduleRow {
  id: string;
  fencing_token: string;
  next_run_at: string | null;
  lease_owner: string | null;
  lease_until: string | null;
}

type Report = Record<string, string | boolean | null>;

const SCHEDULE_COLUMNS = "id, fencing_token, next_run_at, lease_owner, lease_until";
const INTERVAL_MS = 60_000n;

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

function big(value: string | null): bigint | null {
  return value === null ? null : BigInt(value);
}

/** The database clock, epoch ms: every time the store compares comes from here. */
async function nowMs(store: Store): Promise<bigint> {
  const result = await store.client.query<{ now: string }>(
    `SELECT ${store.schema}.now_ms() AS now`,
  );
  return BigInt(result.rows[0]?.now ?? fail("now_ms() returned no row"));
}

async function register(store: Store, id: string, nextRunAt: bigint): Promise<ScheduleRow> {
  const result = await store.client.query<ScheduleRow>(
    `SELECT ${SCHEDULE_COLUMNS} FROM ${store.schema}.schedule_register($1, $2, $3, $4)`,
    [id, "interval", INTERVAL_MS.toString(), nextRunAt.toString()],
  );
  return result.rows[0] ?? fail("schedule_register returned no row");
}

/** The claimed row, or null: not due, leased elsewhere, or unknown. */
async function claimDue(
  store: Store,
  id: string,
  owner: string,
  now: bigint | null,
  leaseMs: bigint,
): Promise<ScheduleRow | null> {
  const result = await store.client.query<ScheduleRow>(
    `SELECT ${SCHEDULE_COLUMNS} FROM ${store.schema}.schedule_claim_due($1, $2, $3, $4)`,
    [id, owner, now?.toString() ?? null, leaseMs.toString()],
  );
  return result.rows[0] ?? null;
}

/** True when the occurrence was committed; false when the token is stale or spent. */
async function complete(
  store: Store,
  id: string,
  fencingToken: bigint,
  nextRunAt: bigint,
  lastRunAt: bigint,
): Promise<boolean> {
  const result = await store.client.query<{ completed: boolean }>(
    `SELECT ${store.schema}.schedule_complete($1, $2, $3, $4, 'ok') AS completed`,
    [id, fencingToken.toString(), nextRunAt.toString(), lastRunAt.toString()],
  );
  return result.rows[0]?.completed ?? fail("schedule_complete returned no row");
}

async function scheduleJob(store: Store, runId: string, dispatchAt: bigint): Promise<void> {
  // Autocommit: the NOTIFY is delivered as this statement commits.
  await store.client.query(`SELECT ${store.schema}.job_schedule($1, $2)`, [
    runId,
    dispatchAt.toString(),
  ]);
}

/** The SQLSTATE of a server error, or undefined for anything else. */
function sqlstate(error: unknown): string | undefined {
  return error instanceof pg.DatabaseError ? error.code : undefined;
}

async function main(): Promise<void> {
  const client = new pg.Client({
    connectionString: requiredEnv("PGSTORE_DSN"),
    application_name: "pgstore-typescript-example",
  });
  const store: Store = {
    client,
    schema: pg.escapeIdentifier(process.env["PGSTORE_SCHEMA"] || "pgstore"),
  };
  // Unique ids: the program can run again on the same schema.
  const suffix = randomUUID().slice(0, 8);
  const scheduleId = `ts-report-${suffix}`;
  const runId = `ts-meeting-${suffix}`;

  await client.connect();
  try {
    const now = await nowMs(store);

    const registered = await register(store, scheduleId, now);
    report("register", {
      id: registered.id,
      fencing_token: registered.fencing_token,
      next_run_at: registered.next_run_at,
    });

    // node-a claims with a 1 s lease, on the database clock (p_now NULL).
    const a = (await claimDue(store, scheduleId, "node-a", null, 1_000n)) ??
      fail("node-a: the schedule was not claimable");
    report("claim", { owner: "node-a", fencing_token: a.fencing_token, lease_until: a.lease_until });

    // node-a stalls past its lease; node-b claims at the instant the lease runs out.
    const expiry = big(a.lease_until) ?? fail("node-a's claim has no lease_until");
    const b = (await claimDue(store, scheduleId, "node-b", expiry, 30_000n)) ??
      fail("node-b: the expired lease was not claimable");
    report("claim", { owner: "node-b", fencing_token: b.fencing_token, lease_until: b.lease_until });

    // node-a wakes up and tries to commit with its old token: refused.
    const stale = await complete(store, scheduleId, BigInt(a.fencing_token), now + INTERVAL_MS, now);
    report("complete", { owner: "node-a", fencing_token: a.fencing_token, completed: stale });
    if (stale) fail("a stale fencing token was accepted");

    const fresh = await complete(store, scheduleId, BigInt(b.fencing_token), now + INTERVAL_MS, expiry);
    report("complete", { owner: "node-b", fencing_token: b.fencing_token, completed: fresh });
    if (!fresh) fail("the current fencing token was refused");

    // Bad input raises 22023 naming the parameter, and changes nothing.
    try {
      await claimDue(store, scheduleId, "", null, 30_000n);
      fail("an empty owner was accepted");
    } catch (error) {
      if (sqlstate(error) !== "22023") throw error;
      report("bad_input", { sqlstate: "22023", message: (error as Error).message });
    }

    const dispatchAt = await nowMs(store);
    await scheduleJob(store, runId, dispatchAt);
    report("job_schedule", { run_id: runId, dispatch_at: dispatchAt.toString() });
  } finally {
    await client.end();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`pgstore example: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exitCode = 1;
});
