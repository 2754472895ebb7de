/**
 * The shared conformance scenarios (tests/conformance/*.json), the same files the
 * Python stores run (tests/test_conformance_scenarios.py), on the TypeScript stores:
 * on a pg.Pool, on a pg.Client, and on a pool through PgBouncer in transaction pooling.
 */

import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";

import pg from "pg";

import * as pgstore from "../src/index.js";
import { PgJobStore, PgScheduleStore, type CompletePatch } from "../src/index.js";
import { BOUNCER, DSN, REPO, SCHEMA, jobsState, pool, reset, schedulesState, type Plain } from "./helpers.js";

interface Step {
  call?: string;
  args?: Record<string, any>;
  expect?: Plain;
  raises?: { error: string; sqlstate: string; message_contains: string };
  state?: Record<string, Record<string, Plain>>;
}
interface Scenario {
  name: string;
  rule: string;
  steps: Step[];
}

function load(store: string): Scenario[] {
  const file = path.join(REPO, "tests", "conformance", `${store}.json`);
  const data = JSON.parse(readFileSync(file, "utf8")) as { store: string; scenarios: Scenario[] };
  assert.equal(data.store, store);
  return data.scenarios;
}

type Call<S> = (store: S, a: Record<string, any>) => Promise<unknown>;

/** A scenario's argument as the call takes it: `{"$repeat": s, "times": n}` is s n times. */
function expanded(value: any): any {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    if ("$repeat" in value) return (value["$repeat"] as string).repeat(value["times"] as number);
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, expanded(v)]));
  }
  return Array.isArray(value) ? value.map(expanded) : value;
}

const JOB_CALLS: Record<string, Call<PgJobStore>> = {
  schedule: (s, a) =>
    s.schedule({
      runId: a["run_id"],
      dispatchAt: a["dispatch_at"],
      maxAttempts: a["max_attempts"],
      queue: a["queue"],
      priority: a["priority"],
      payload: a["payload"],
    }),
  lease: (s, a) => s.lease(a["holder"], a["now"], a["ttl_ms"], { queues: a["queues"] }),
  renew: (s, a) => s.renew(a["run_id"], a["holder"], a["now"], a["ttl_ms"], a["lease_sequence"]),
  mark_dispatched: (s, a) =>
    s.markDispatched(a["run_id"], a["holder"], a["worker_id"], a["lease_sequence"]),
  release: (s, a) =>
    s.release(a["run_id"], a["holder"], a["retry_at"], {
      leaseSequence: a["lease_sequence"] ?? null,
      error: a["error"] ?? null,
    }),
  retry: (s, a) => s.retry(a["run_id"], a["dispatch_at"]),
  reschedule: (s, a) => s.reschedule(a["run_id"], a["dispatch_at"], a["now"]),
  cancel: (s, a) => s.cancel(a["run_id"]),
  get: (s, a) => s.get(a["run_id"]),
  list_dispatched: (s) => s.listDispatched(),
  list_failed: (s, a) => s.listFailed(a["limit"]),
  remove: (s, a) => s.remove(a["run_id"]),
  schedule_many: (s, a) =>
    s.scheduleMany(a["run_ids"], a["dispatch_at"], {
      queue: a["queue"],
      priority: a["priority"],
      payloads: a["payloads"],
    }),
  lease_many: (s, a) =>
    s.leaseMany(a["holder"], a["now"], a["ttl_ms"], a["limit"], { queues: a["queues"] }),
  mark_dispatched_many: (s, a) =>
    s.markDispatchedMany(a["run_ids"], a["holder"], a["worker_ids"], a["lease_sequences"]),
  renew_many: (s, a) =>
    s.renewMany(a["run_ids"], a["holder"], a["now"], a["ttl_ms"], a["lease_sequences"]),
  pause_queue: (s, a) => s.pauseQueue(a["queue"]),
  resume_queue: (s, a) => s.resumeQueue(a["queue"]),
  list_queues: (s, a) => s.listQueues(a["now"]),
  set_queue_concurrency: (s, a) => s.setQueueConcurrency(a["queue"], a["limit"]),
  set_queue_rate: (s, a) => s.setQueueRate(a["queue"], a["limit"], a["period_ms"]),
};

function patch(p: Record<string, any>): CompletePatch {
  return { nextRunAt: p["next_run_at"], lastRunAt: p["last_run_at"], lastStatus: p["last_status"] };
}

const SCHEDULE_CALLS: Record<string, Call<PgScheduleStore>> = {
  register: (s, a) =>
    s.register(
      { id: a["id"], kind: a["kind"], spec: a["spec"], nextRunAt: a["next_run_at"] },
      a["now"],
      "jitter_ms" in a ? { jitterMs: a["jitter_ms"] } : undefined,
    ),
  claim_due: (s, a) => s.claimDue(a["id"], a["owner"], a["now"], a["lease_ms"]),
  renew: (s, a) => s.renew(a["id"], a["fencing_token"], a["lease_until"]),
  complete: (s, a) => s.complete(a["id"], a["fencing_token"], patch(a["patch"]), a["now"]),
  delete: (s, a) => s.delete(a["id"]),
  get: (s, a) => s.get(a["id"]),
  list: (s) => s.list(),
  pause: (s, a) => s.pause(a["id"], a["now"]),
  resume: (s, a) => s.resume(a["id"], a["now"]),
  trigger: (s, a) => s.trigger(a["id"], a["now"]),
};

const JOB_FIELDS = [
  "run_id", "dispatch_at", "lease_holder", "lease_until", "worker_id", "dispatched", "cancelled",
  "lease_sequence", "attempts", "max_attempts", "last_error", "failed", "queue", "priority",
  "payload",
];
const RECORD_FIELDS = [
  "id", "kind", "spec", "next_run_at", "last_run_at", "last_status", "fencing_token",
  "lease_owner", "lease_until", "updated_at", "paused", "jitter_ms", "due_at", "triggered_at",
];

const snake = (key: string): string => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** An answer in the scenarios' form: snake_case keys, absent fields null, bigints as numbers. */
function plain(value: unknown): Plain {
  if (value === undefined || value === null) return null;
  if (typeof value === "bigint") return Number(value);
  if (Array.isArray(value)) return value.map(plain);
  if (typeof value === "object") {
    const out: Record<string, Plain> = {};
    for (const [key, v] of Object.entries(value)) {
      // A payload is the app's JSON value, its keys as written.
      if (key === "payload") out[key] = v as Plain;
      else if (key !== "finishedAt") out[snake(key)] = plain(v);
    }
    const fields = "runId" in value ? JOB_FIELDS : "kind" in value ? RECORD_FIELDS : [];
    for (const field of fields) out[field] ??= null;
    return out;
  }
  return value as Plain;
}

function mismatch(expected: Plain, actual: Plain, where = "answer"): string | null {
  if (expected !== null && typeof expected === "object" && !Array.isArray(expected)) {
    const keys = Object.keys(expected);
    if (keys.length === 1 && keys[0] === "$contains") {
      const needle = expected["$contains"] as string;
      return typeof actual === "string" && actual.includes(needle)
        ? null
        : `${where}: ${JSON.stringify(actual)} does not contain ${JSON.stringify(needle)}`;
    }
    if (actual === null || typeof actual !== "object" || Array.isArray(actual)) {
      return `${where}: expected an object, got ${JSON.stringify(actual)}`;
    }
    for (const key of keys) {
      if (!(key in actual)) return `${where}.${key}: missing from ${JSON.stringify(actual)}`;
      const why = mismatch(expected[key] as Plain, actual[key] as Plain, `${where}.${key}`);
      if (why !== null) return why;
    }
    return null;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      return `${where}: expected ${expected.length} items, got ${JSON.stringify(actual)}`;
    }
    for (let i = 0; i < expected.length; i++) {
      const why = mismatch(expected[i] as Plain, actual[i] as Plain, `${where}[${i}]`);
      if (why !== null) return why;
    }
    return null;
  }
  return expected === actual ? null : `${where}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`;
}

function stateMismatch(expected: Record<string, Record<string, Plain>>, actual: Record<string, Record<string, Plain>>): string | null {
  for (const [table, rows] of Object.entries(expected)) {
    const present = actual[table] ?? {};
    if (table === "fences") {
      try {
        assert.deepStrictEqual(present, rows);
      } catch {
        return `fences: expected ${JSON.stringify(rows)}, got ${JSON.stringify(present)}`;
      }
      continue;
    }
    const want = Object.keys(rows).sort();
    const got = Object.keys(present).sort();
    if (JSON.stringify(want) !== JSON.stringify(got)) {
      return `${table}: expected ids ${JSON.stringify(want)}, got ${JSON.stringify(got)}`;
    }
    for (const [key, row] of Object.entries(rows)) {
      const why = mismatch(row, present[key] as Plain, `${table}[${key}]`);
      if (why !== null) return why;
    }
  }
  return null;
}

async function run<S>(
  scenario: Scenario,
  store: S,
  calls: Record<string, Call<S>>,
  readState: () => Promise<Record<string, Record<string, Plain>>>,
): Promise<void> {
  for (const [n, step] of scenario.steps.entries()) {
    const where = `${scenario.name} step ${n}`;
    if (step.state !== undefined) {
      const why = stateMismatch(step.state, await readState());
      assert.equal(why, null, `${where}: ${why}`);
      continue;
    }
    const mapped = calls[step.call ?? ""];
    if (mapped === undefined) throw new Error(`${where}: no mapping for ${step.call}`);
    const call: Call<S> = mapped;
    if (step.raises !== undefined) {
      const raises = step.raises;
      const errorClass = (pgstore as unknown as Record<string, (new (...a: never[]) => Error) | undefined>)[raises.error];
      if (errorClass === undefined) throw new Error(`${where}: no error class ${raises.error}`);
      const stateBefore = await readState();
      await assert.rejects(call(store, expanded(step.args ?? {})), (error: unknown) => {
        assert.ok(error instanceof errorClass, `${where}: ${String(error)}`);
        assert.equal((error as pgstore.PgStoreError).sqlstate, raises.sqlstate, where);
        assert.ok((error as Error).message.includes(raises.message_contains), `${where}: ${(error as Error).message}`);
        return true;
      });
      assert.deepStrictEqual(await readState(), stateBefore, `${where}: the refused call changed the state`);
      continue;
    }
    const answer = plain(await call(store, expanded(step.args ?? {})));
    if (step.expect !== undefined) {
      const why = mismatch(step.expect, answer);
      assert.equal(why, null, `${where} (${step.call}): ${why}`);
    }
  }
}

const JOB_SCENARIOS = load("jobs");
const SCHEDULE_SCENARIOS = load("schedules");

/** How the app hands its connections to the stores. */
const MODES: { name: string; url: string | undefined; client: boolean }[] = [
  { name: "pool", url: DSN, client: false },
  { name: "client", url: DSN, client: true },
  { name: "pgbouncer", url: BOUNCER, client: false },
];

for (const mode of MODES) {
  describe(`conformance on a ${mode.name}`, { skip: mode.url === undefined ? "PGSTORE_TS_BOUNCER not set" : false }, () => {
    let owner: pg.Pool;
    let db: pg.Pool | pg.Client;
    let jobs: PgJobStore;
    let schedules: PgScheduleStore;

    before(async () => {
      owner = pool(DSN, 2);
      if (mode.client) {
        const client = new pg.Client({ connectionString: mode.url });
        await client.connect();
        db = client;
      } else {
        db = pool(mode.url, 2);
      }
      jobs = new PgJobStore(db, { schema: SCHEMA });
      schedules = new PgScheduleStore(db, { schema: SCHEMA });
      await jobs.start();
      await schedules.start();
    });
    after(async () => {
      await db.end();
      await owner.end();
    });

    for (const scenario of JOB_SCENARIOS) {
      test(`jobs: ${scenario.name}`, async () => {
        await reset(owner);
        await run(scenario, jobs, JOB_CALLS, async () => ({ jobs: await jobsState(owner) }));
      });
    }
    for (const scenario of SCHEDULE_SCENARIOS) {
      test(`schedules: ${scenario.name}`, async () => {
        await reset(owner);
        await run(scenario, schedules, SCHEDULE_CALLS, () => schedulesState(owner));
      });
    }
  });
}
