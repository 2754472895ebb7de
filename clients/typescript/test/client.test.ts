/**
 * What the scenarios cannot say: bigints past 2^53, the app's transactions on its
 * own client, the error classes, start(), and the connection types accepted.
 */

import { strict as assert } from "node:assert";
import { after, before, beforeEach, test } from "node:test";

import pg from "pg";

import {
  InvalidArgument,
  JobNotRemovable,
  PgJobStore,
  PgScheduleStore,
  ReadOnlyServer,
  SchemaNotReady,
  UnsafeInteger,
  type Queryable,
} from "../src/index.js";
import { DSN, Q, SCHEMA, jobsState, pool, reset } from "./helpers.js";

const TWO_53 = 2n ** 53n;
let owner: pg.Pool;
let jobs: PgJobStore;
let schedules: PgScheduleStore;

before(() => {
  owner = pool(DSN, 3);
  jobs = new PgJobStore(owner, { schema: SCHEMA });
  schedules = new PgScheduleStore(owner, { schema: SCHEMA });
});
beforeEach(() => reset(owner));
after(() => owner.end());

test("a fencing token past 2^53 throws UnsafeInteger on read, never a rounded number", async () => {
  await schedules.register({ id: "big", kind: "interval", spec: "1000", nextRunAt: 0 }, 0);
  await owner.query(`UPDATE ${Q}.schedules SET fencing_token = $1`, [(TWO_53 - 2n).toString()]);
  const claim = await schedules.claimDue("big", "o1", null, 60_000);
  assert.equal(claim?.fencingToken, Number.MAX_SAFE_INTEGER); // 2^53 - 1: still exact
  assert.equal(claim?.record.fencingToken, Number.MAX_SAFE_INTEGER);

  await owner.query(`UPDATE ${Q}.schedules SET fencing_token = $1, lease_until = 0`, [
    (TWO_53 + 5n).toString(),
  ]);
  await assert.rejects(schedules.get("big"), (e: unknown) => {
    assert.ok(e instanceof UnsafeInteger);
    assert.match((e as Error).message, /fencing_token is 9007199254740997/);
    return true;
  });
  await assert.rejects(schedules.list(), UnsafeInteger);
  // The token itself is still usable exactly, as a bigint argument.
  assert.equal(await schedules.renew("big", TWO_53 + 5n, 1), true);
  assert.equal(await schedules.renew("big", TWO_53 + 4n, 1), false);
  // A number that is not a safe integer is refused before any query is sent.
  await assert.rejects(schedules.renew("big", 2 ** 53 + 6, 1), (e: unknown) => {
    assert.ok(e instanceof InvalidArgument);
    assert.equal((e as InvalidArgument).sqlstate, "22023");
    return true;
  });
  await assert.rejects(schedules.renew("big", 2n ** 63n, 1), (e: unknown) => {
    assert.ok(e instanceof InvalidArgument);
    assert.equal((e as InvalidArgument).sqlstate, "22003");
    return true;
  });
});

test("lease sequences are bigint: exact past 2^53, and they fence as given", async () => {
  await jobs.schedule({ runId: "big", dispatchAt: 0 });
  const high = 2n ** 62n + 3n;
  await owner.query(`UPDATE ${Q}.jobs SET lease_sequence = $1`, [high.toString()]);
  const job = await jobs.lease("h1", null, 60_000);
  assert.equal(job?.leaseSequence, high + 1n);
  assert.equal(typeof job?.leaseSequence, "bigint");
  assert.equal(await jobs.renew("big", "h1", null, 60_000, high), false);
  assert.equal(await jobs.renew("big", "h1", null, 60_000, high + 1n), true);
  assert.deepEqual(await jobs.markDispatched("big", "h1", "w", high), { cancelled: false, recorded: false });
  assert.deepEqual(await jobs.markDispatched("big", "h1", "w", high + 1n), { cancelled: false, recorded: true });
  assert.deepEqual(await jobs.renewMany(["big"], "h1", null, 60_000, [high + 1n]), [true]);
  const row = await owner.query(`SELECT lease_sequence::text AS s FROM ${Q}.jobs`);
  assert.equal(row.rows[0].s, (high + 1n).toString());
});

test("on the app's client, the calls join its transaction: rolled back, nothing stays", async () => {
  const client = await owner.connect();
  try {
    const inTx = new PgJobStore(client, { schema: SCHEMA });
    await client.query("BEGIN");
    await inTx.schedule({ runId: "tx", dispatchAt: 0 });
    assert.equal((await inTx.get("tx"))?.runId, "tx"); // visible inside
    assert.equal(await jobs.get("tx"), undefined); // not outside, yet
    await client.query("ROLLBACK");
    assert.equal(await inTx.get("tx"), undefined);

    await client.query("BEGIN");
    await inTx.schedule({ runId: "tx", dispatchAt: 0 });
    await client.query("COMMIT");
    assert.equal((await jobs.get("tx"))?.runId, "tx");
  } finally {
    client.release();
  }
});

test("a read-only transaction raises ReadOnlyServer (25006) and changes nothing", async () => {
  const client = new pg.Client({ connectionString: DSN });
  await client.connect();
  try {
    const store = new PgJobStore(client, { schema: SCHEMA });
    await client.query("BEGIN READ ONLY");
    await assert.rejects(store.schedule({ runId: "ro", dispatchAt: 0 }), (e: unknown) => {
      assert.ok(e instanceof ReadOnlyServer);
      assert.equal((e as ReadOnlyServer).sqlstate, "25006");
      return true;
    });
    await client.query("ROLLBACK");
  } finally {
    await client.end();
  }
  assert.deepEqual(await jobsState(owner), {});
});

test("remove of a leased job raises JobNotRemovable (55000)", async () => {
  await jobs.schedule({ runId: "a", dispatchAt: 0 });
  await jobs.lease("h1", null, 60_000);
  await assert.rejects(jobs.remove("a"), (e: unknown) => {
    assert.ok(e instanceof JobNotRemovable);
    assert.equal((e as JobNotRemovable).sqlstate, "55000");
    assert.match((e as Error).message, /leased by/);
    return true;
  });
});

test("start() passes on a migrated schema; an unknown schema is SchemaNotReady", async () => {
  await jobs.start();
  await schedules.start();
  const missing = new PgJobStore(owner, { schema: "no such schema" });
  await assert.rejects(missing.start(), SchemaNotReady);
  await assert.rejects(missing.lease("h", null, 1000), SchemaNotReady);
  await assert.rejects(new PgScheduleStore(owner, { schema: "nope" }).get("x"), SchemaNotReady);
});

test("arguments the server cannot check are refused in the client, nothing sent", async () => {
  const cases: [string, () => Promise<unknown>][] = [
    ["NUL", () => jobs.schedule({ runId: "a\u0000b", dispatchAt: 0 })],
    ["lone surrogate", () => jobs.schedule({ runId: "a\uD800", dispatchAt: 0 })],
    ["fraction", () => jobs.lease("h", null, 1.5)],
    ["NaN", () => jobs.lease("h", Number.NaN, 100)],
    ["string for a number", () => jobs.lease("h", null, "100" as unknown as number)],
    ["number for a string", () => jobs.get(7 as unknown as string)],
  ];
  for (const [what, call] of cases) {
    await assert.rejects(call(), InvalidArgument, what);
  }
  assert.deepEqual(await jobsState(owner), {});
});

test("the controls: their records carry pgstore's fields, and what the server cannot check is refused", async () => {
  const rec = await schedules.register({ id: "c", kind: "interval", spec: "60000", nextRunAt: 1000 }, 0);
  assert.equal(rec.paused, false);
  assert.equal(rec.jitterMs, 0);
  assert.equal(rec.dueAt, 1000);
  assert.ok(!("triggeredAt" in rec), "an absent trigger is left out, not undefined");
  const triggered = await schedules.trigger("c", 10);
  assert.equal(triggered?.triggeredAt, 10);
  assert.equal(triggered?.dueAt, 10);
  const claim = await schedules.claimDue("c", "o1", 20, 1000);
  assert.equal(claim?.record.triggeredAt, 10);
  assert.equal((await schedules.pause("c", null))?.paused, true); // null: the database clock

  // A big jitter as a bigint is a jitter like any other.
  const jittered = await schedules.register(
    { id: "c", kind: "interval", spec: "60000", nextRunAt: 1000 },
    0,
    { jitterMs: 86_400_000n },
  );
  assert.equal(jittered.jitterMs, 86_400_000);
  const cases: [string, () => Promise<unknown>][] = [
    ["fractional jitter", () => schedules.register({ id: "d", kind: "once", spec: "1", nextRunAt: 1 }, 0, { jitterMs: 0.5 })],
    ["jitter as a string", () => schedules.register({ id: "d", kind: "once", spec: "1", nextRunAt: 1 }, 0, { jitterMs: "5" as unknown as number })],
    ["NUL id", () => schedules.pause("c\u0000", 0)],
    ["fractional now", () => schedules.resume("c", 1.5)],
    ["lone surrogate", () => schedules.trigger("c\uD800", 0)],
    ["no dispatchAt", () => jobs.reschedule("a", null as unknown as number)],
    ["unsafe dispatchAt", () => jobs.reschedule("a", 2 ** 53 + 2)],
  ];
  const before = await owner.query(`SELECT * FROM ${Q}.schedules ORDER BY id`);
  for (const [what, call] of cases) {
    await assert.rejects(call(), (e: unknown) => {
      assert.ok(e instanceof InvalidArgument, what);
      assert.equal((e as InvalidArgument).sqlstate, "22023", what);
      assert.match((e as Error).message, /jitterMs|id|now|dispatchAt/, what);
      return true;
    });
  }
  assert.deepEqual((await owner.query(`SELECT * FROM ${Q}.schedules ORDER BY id`)).rows, before.rows);
  assert.deepEqual(await jobsState(owner), {});
});

test("the schema is quoted, never spliced: a name with quotes and spaces is only a name", async () => {
  const odd = new PgJobStore(owner, { schema: `x"; DROP TABLE ${SCHEMA}.jobs; --` });
  await assert.rejects(odd.get("a"), SchemaNotReady);
  assert.deepEqual(await jobsState(owner), {});
});

test("a pg.Pool, a pg.Client and a pg.PoolClient are all Queryable", async () => {
  const client = await owner.connect();
  try {
    const sources: Queryable[] = [owner, client, new pg.Client({ connectionString: DSN })];
    assert.equal(sources.length, 3);
  } finally {
    client.release();
  }
});

test("list answers a page of the jobs a filter selects, and how many match in all", async () => {
  await jobs.scheduleMany(["c", "b", "a", "later"], [20, 10, 20, 10_000]);
  const due = await jobs.list("due", { now: 100, limit: 2 });
  assert.deepEqual(due.jobs.map((j) => j.runId), ["b", "a"]);
  assert.equal(due.matching, 3);
  const all = await jobs.list("all");
  assert.deepEqual(all.jobs.map((j) => j.runId), ["b", "a", "c", "later"]);
  assert.equal(all.matching, 4);
  assert.deepEqual(await jobs.list("dispatched"), { jobs: [], matching: 0 });
  await assert.rejects(jobs.list("bogus" as "all"), (e: unknown) => e instanceof InvalidArgument);
  assert.equal(typeof (await jobs.nowMs()), "number");
});

test("payloads: what JSON or jsonb cannot hold is refused in the client, nothing sent", async () => {
  const cyclic: Record<string, unknown> = {};
  cyclic["self"] = cyclic;
  const cases: [string, () => Promise<unknown>][] = [
    ["bigint", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: { id: 2n ** 60n } })],
    ["NaN", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: [Number.NaN] })],
    ["Infinity", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: { x: Infinity } })],
    ["cycle", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: cyclic })],
    ["function", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: () => 1 })],
    ["NUL in a value", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: { s: "a\u0000" } })],
    ["NUL in a key", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: { "k\u0000": 1 } })],
    ["lone surrogate", () => jobs.schedule({ runId: "a", dispatchAt: 0, payload: "\uDC00" })],
    ["one of a batch", () => jobs.scheduleMany(["a", "b"], [0, 0], { payloads: [1, 2n] })],
    ["empty queues", () => jobs.lease("h", null, 100, { queues: [] })],
    ["queues not strings", () => jobs.lease("h", null, 100, { queues: [7 as unknown as string] })],
    ["priority past int4", () => jobs.schedule({ runId: "a", dispatchAt: 0, priority: 2 ** 31 })],
  ];
  for (const [what, call] of cases) {
    await assert.rejects(call(), (e: unknown) => {
      assert.ok(e instanceof InvalidArgument, `${what}: ${String(e)}`);
      assert.equal((e as InvalidArgument).sqlstate, "22023", what);
      return true;
    });
  }
  assert.deepEqual(await jobsState(owner), {});
});

test("a payload is read from its JSON text, whatever the app's jsonb parser says", async () => {
  const payload = { big: "12345678901234567890", n: 2 ** 53 - 1, date: new Date(0) };
  await jobs.schedule({ runId: "p", dispatchAt: 0, queue: "q", priority: -3, payload });
  const expected = { big: "12345678901234567890", n: 2 ** 53 - 1, date: "1970-01-01T00:00:00.000Z" };
  // An app that parses jsonb its own way (here: not at all) on its own pg.types.
  const types = { getTypeParser: (oid: number, format?: string) =>
    oid === 3802 ? (text: string) => `raw:${text}` : pg.types.getTypeParser(oid, format as "text") };
  const raw = new pg.Pool({ connectionString: DSN, max: 1, types });
  try {
    const store = new PgJobStore(raw, { schema: SCHEMA });
    const job = await store.get("p");
    assert.deepEqual(job?.payload, expected);
    assert.equal(job?.queue, "q");
    assert.equal(job?.priority, -3);
    const leased = await store.lease("h", null, 60_000, { queues: ["q"] });
    assert.deepEqual(leased?.payload, expected);
    assert.deepEqual((await store.list("all", { queues: ["q"] })).jobs.map((j) => j.runId), ["p"]);
    assert.deepEqual((await store.list("all", { queues: ["other"] })).matching, 0);
  } finally {
    await raw.end();
  }
  // A job with none has no payload field; a JSON null is null.
  await jobs.schedule({ runId: "none", dispatchAt: 0 });
  assert.equal("payload" in ((await jobs.get("none")) ?? {}), false);
  await owner.query(`UPDATE ${Q}.jobs SET payload = 'null' WHERE run_id = 'none'`);
  assert.equal((await jobs.get("none"))?.payload, null);
});
