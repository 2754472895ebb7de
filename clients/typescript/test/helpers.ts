/**
 * What the suites share: the database the pytest driver (tests/test_typescript_client.py)
 * migrated, its owner's view of the state, and a reset between scenarios.
 *
 * PGSTORE_TS_DSN     a postgresql:// URL of the test database (the schema owner)
 * PGSTORE_TS_SCHEMA  the migrated schema
 * PGSTORE_TS_BOUNCER a postgresql:// URL through PgBouncer in transaction pooling (optional)
 */

import { fileURLToPath } from "node:url";
import * as path from "node:path";

import pg from "pg";

export function env(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") {
    throw new Error(`${name} is not set: run this suite through tests/test_typescript_client.py`);
  }
  return value;
}

export const DSN = env("PGSTORE_TS_DSN");
export const SCHEMA = env("PGSTORE_TS_SCHEMA");
export const BOUNCER = process.env["PGSTORE_TS_BOUNCER"] || undefined;
export const Q = pg.escapeIdentifier(SCHEMA);

/** The repository's root, from build-test/test/ (compiled) or test/ (sources). */
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

export function pool(url: string = DSN, max = 4): pg.Pool {
  return new pg.Pool({ connectionString: url, max, application_name: "pgstore-ts-test" });
}

/** Empties the store's tables (fences, paused queues and queue limits too) as a fresh schema has them. */
export async function reset(owner: pg.Pool): Promise<void> {
  await owner.query(
    `TRUNCATE ${Q}.jobs, ${Q}.queues, ${Q}.queue_slots, ${Q}.schedules, ${Q}.schedule_fences;` +
      ` UPDATE ${Q}.job_fences SET lease_sequence = 0`,
  );
}

/** The bigint columns (node-postgres reads them as strings). */
const INT8 = new Set([
  "dispatch_at", "lease_until", "lease_sequence", "next_run_at", "last_run_at",
  "fencing_token", "updated_at", "jitter_ms", "due_at", "triggered_at",
]);

function plainRow(row: Record<string, unknown>): Record<string, Plain> {
  const plain: Record<string, Plain> = {};
  for (const [key, value] of Object.entries(row)) {
    plain[key] = (INT8.has(key) && typeof value === "string" ? Number(value) : value) as Plain;
  }
  return plain;
}

export type Plain = null | boolean | number | string | Plain[] | { [key: string]: Plain };

/** The whole jobs table, read by the owner, in the scenarios' form. */
export async function jobsState(owner: pg.Pool): Promise<Record<string, Plain>> {
  const { rows } = await owner.query(
    `SELECT run_id, dispatch_at, lease_holder, lease_until, worker_id, dispatched, cancelled,` +
      ` lease_sequence, attempts, max_attempts, last_error, failed, queue, priority, payload` +
      ` FROM ${Q}.jobs ORDER BY run_id`,
  );
  const jobs: Record<string, Plain> = {};
  for (const row of rows as Record<string, unknown>[]) {
    jobs[row["run_id"] as string] = plainRow(row);
  }
  return jobs;
}

export async function schedulesState(
  owner: pg.Pool,
): Promise<{ schedules: Record<string, Plain>; fences: Record<string, Plain> }> {
  const { rows } = await owner.query(
    `SELECT id, kind, spec, next_run_at, last_run_at, last_status, fencing_token, lease_owner,` +
      ` lease_until, updated_at, consecutive_failures, catch_up, paused, jitter_ms, due_at,` +
      ` triggered_at FROM ${Q}.schedules ORDER BY id`,
  );
  const schedules: Record<string, Plain> = {};
  for (const row of rows as Record<string, unknown>[]) {
    schedules[row["id"] as string] = plainRow(row);
  }
  const fences: Record<string, Plain> = {};
  const f = await owner.query(`SELECT id, fencing_token FROM ${Q}.schedule_fences`);
  for (const row of f.rows as { id: string; fencing_token: string }[]) {
    fences[row.id] = Number(row.fencing_token);
  }
  return { schedules, fences };
}
