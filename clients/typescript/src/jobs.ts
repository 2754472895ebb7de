/** PgJobStore: agentos' IJobStore over pgstore's job_* functions, with the extras. */

import type { IJobStore, MeetingJob } from "./interfaces.js";
import {
  type Queryable,
  type Row,
  Runner,
  type StoreOptions,
  array,
  checkFunctions,
  int4,
  int8,
  jsonText,
  optionalInt4,
  optionalInt8,
  optionalText,
  readBigInt,
  readBoolean,
  readInt,
  readNumber,
  readOptionalNumber,
  readString,
  text,
} from "./internal.js";

// The payload as its JSON text, parsed here: what the app's pg.types say of jsonb
// (a parser of its own, or none) cannot change what a Job holds.
const COLUMNS =
  "run_id, dispatch_at, lease_holder, lease_until, worker_id, dispatched, cancelled," +
  " lease_sequence, finished_at, attempts, max_attempts, last_error, failed, queue, priority," +
  " payload::text AS payload";

/** The functions PgJobStore calls, by the signatures they have. */
export const JOB_FUNCTIONS = [
  "now_ms()",
  "job_schedule(text,bigint,integer,text,integer,jsonb)",
  "job_lease(text,bigint,bigint,text[])",
  "job_renew(text,text,bigint,bigint,bigint)",
  "job_mark_dispatched(text,text,text,bigint)",
  "job_release(text,text,bigint,bigint,text)",
  "job_retry(text,bigint)",
  "job_reschedule(text,bigint,bigint)",
  "job_cancel(text)",
  "job_get(text)",
  "job_list_dispatched()",
  "job_list(text,bigint,integer,text[])",
  "job_remove(text)",
  "job_schedule_many(text[],bigint[],text,integer,jsonb[])",
  "job_lease_many(text,bigint,bigint,integer,text[])",
  "job_mark_dispatched_many(text[],text,text[],bigint[])",
  "job_renew_many(text[],text,bigint,bigint,bigint[])",
  "queue_pause(text)",
  "queue_resume(text)",
  "queue_list(bigint)",
  "queue_set_concurrency(text,integer)",
  "queue_set_rate(text,integer,bigint)",
] as const;

/**
 * A job as the store keeps it: the seed's MeetingJob fields, then pgstore's.
 * Absent optional fields are left out (never `undefined`).
 */
export interface Job extends MeetingJob {
  /**
   * Which lease of this job: (runId, leaseSequence) names one lease for good
   * (an idempotency key for the provider call), and fences renew, markDispatched
   * and release. A bigint: it starts at 2^40 per failover timeline and can pass
   * 2^53 after restores, so it is never squeezed into a number.
   */
  leaseSequence: bigint;
  /** How many times the job was leased (each lease counts one). */
  attempts: number;
  /** The most leases it gets; out of them, it fails. */
  maxAttempts: number;
  /** The error the last release kept, or why the store failed the job. */
  lastError?: string;
  /** Out of attempts, never leased again (until `retry`). */
  failed: boolean;
  /** When the job finished (dispatched, cancelled or failed), epoch ms. */
  finishedAt?: number;
  /** Its queue: "default" unless scheduled with another. */
  queue: string;
  /** Higher is leased first (0 unless scheduled with another). */
  priority: number;
  /**
   * What the job was scheduled with, as `JSON.parse` reads its JSON text back (so a
   * JSON null is `null`); absent when it was scheduled with none. Numbers are
   * JavaScript numbers: an integer past 2^53 comes back rounded, so keep such ids
   * in strings.
   */
  payload?: unknown;
}

/** `schedule`'s job: the seed's fields, then pgstore's. */
export interface ScheduleJob {
  runId: string;
  dispatchAt: number;
  /** At most this many leases (absent: the store default, 25; an existing job: keep). */
  maxAttempts?: number | null;
  /** Its queue (absent: "default" for a new job, kept for an existing one). */
  queue?: string | null;
  /** Higher is leased first, an integer within ±(2^31 - 1) (absent: 0, or kept). */
  priority?: number | null;
  /**
   * Any JSON value, sent as `JSON.stringify` writes it, at most the owner's
   * `store_settings.max_payload_bytes` (64 KiB) as JSON text (absent or null: none
   * for a new job, kept for an existing one).
   */
  payload?: unknown;
}

/** `scheduleMany`'s options: one queue and priority for all, one payload each. */
export interface ScheduleManyOptions {
  queue?: string | null;
  priority?: number | null;
  /** As long as runIds; payloads[i] null or undefined: none (or kept). */
  payloads?: readonly unknown[] | null;
}

/** `lease` and `leaseMany`'s options. */
export interface LeaseOptions {
  /** Lease only jobs of these queues (absent or null: every queue; else non-empty). */
  queues?: readonly string[] | null;
}

/** One queue as `listQueues` answers it (SQL `queue_list`). */
export interface QueueInfo {
  queue: string;
  /** Its jobs waiting: not dispatched, cancelled or failed. */
  depth: number;
  /** Of those, due and held by no live lease: what a lease could take. */
  due: number;
  /** Of those, under a live lease. */
  leased: number;
  /** Paused (`pauseQueue`): none of its jobs is leased. */
  paused: boolean;
  /** At most this many live leases at once (`setQueueConcurrency`); null: no limit. */
  concurrencyLimit: number | null;
  /** At most `rateLimit` leases in any window of `ratePeriodMs` (`setQueueRate`); null: none. */
  rateLimit: number | null;
  ratePeriodMs: number | null;
  /** Leases in the last period at `now`, of `rateLimit`; null without a rate limit. */
  rateUsed: number | null;
}

/** markDispatched's answer. */
export interface MarkResult {
  /** A cancel arrived: tell the bot to leave at once. */
  cancelled: boolean;
  /** The dispatch was recorded; false: another holder or lease took the job, or it is gone. */
  recorded: boolean;
}

export type CancelResult = "cancelled" | "already_dispatched" | "missing";
export type RetryResult = "retried" | "not_failed" | "missing";
export type JobFilter = "all" | "due" | "dispatched" | "failed";

/** A lease sequence: as `lease` answered it (bigint), or a safe number. */
export type LeaseSequence = bigint | number;

/** release's options, named so that none can be passed in the other's place. */
export interface ReleaseOptions {
  /** Release only that lease (a stale dispatcher's release then changes nothing). */
  leaseSequence?: LeaseSequence | null;
  /** Why the dispatch failed, kept as lastError (at most 4096 characters). */
  error?: string | null;
}

function job(row: Row): Job {
  const found: Job = {
    runId: readString("run_id", row["run_id"]),
    dispatchAt: readNumber("dispatch_at", row["dispatch_at"]),
    dispatched: readBoolean("dispatched", row["dispatched"]),
    cancelled: readBoolean("cancelled", row["cancelled"]),
    leaseSequence: readBigInt("lease_sequence", row["lease_sequence"]),
    attempts: readInt("attempts", row["attempts"]),
    maxAttempts: readInt("max_attempts", row["max_attempts"]),
    failed: readBoolean("failed", row["failed"]),
    queue: readString("queue", row["queue"]),
    priority: readInt("priority", row["priority"]),
  };
  if (row["lease_holder"] !== null) found.leaseHolder = readString("lease_holder", row["lease_holder"]);
  const leaseUntil = readOptionalNumber("lease_until", row["lease_until"]);
  if (leaseUntil !== null) found.leaseUntil = leaseUntil;
  if (row["worker_id"] !== null) found.workerId = readString("worker_id", row["worker_id"]);
  if (row["last_error"] !== null) found.lastError = readString("last_error", row["last_error"]);
  const finishedAt = readOptionalNumber("finished_at", row["finished_at"]);
  if (finishedAt !== null) found.finishedAt = finishedAt;
  if (row["payload"] !== null && row["payload"] !== undefined) {
    found.payload = JSON.parse(readString("payload", row["payload"])) as unknown;
  }
  return found;
}

function queues(value: readonly string[] | null | undefined): string[] | null {
  return value === null || value === undefined ? null : array("queues", value, text);
}

function sequences(value: readonly (LeaseSequence | null)[] | null | undefined): (string | null)[] | null {
  return value === null || value === undefined ? null : array("leaseSequences", value, optionalInt8);
}

/**
 * agentos' `IJobStore` on a pgstore schema: each method is one call of one SQL
 * function, on the pool (autocommit) or on the client given (inside the app's
 * transaction, if one is open there). Beyond the interface: lease-sequence
 * fences on renew, markDispatched and release, attempts and `retry`, `list`,
 * and the batch calls. Durable: no `forget` (the store keeps its records).
 *
 * Times are `number` (epoch ms) as the seed types them, read with a check (past
 * Number.MAX_SAFE_INTEGER: `UnsafeInteger`); lease sequences are `bigint`.
 * `now` may be `null`: the database clock (`now_ms()`).
 */
export class PgJobStore implements IJobStore {
  readonly #run: Runner;

  constructor(db: Queryable, options?: StoreOptions) {
    this.#run = new Runner(db, options);
  }

  /** The schema's name, as given. */
  get schema(): string {
    return this.#run.schema;
  }

  /**
   * Checks that the schema has every function this store calls, with the
   * signatures it calls them by; else `SchemaNotReady`. Idempotent, changes nothing.
   */
  async start(): Promise<void> {
    await checkFunctions(this.#run, JOB_FUNCTIONS);
  }

  /** The database clock, epoch ms. SQL: `now_ms` */
  async nowMs(): Promise<number> {
    const row = await this.#run.row("SELECT $schema.now_ms() AS now", []);
    return readNumber("now_ms", row?.["now"]);
  }

  /**
   * Adds the run's job, due at dispatchAt (at most maxAttempts leases; absent:
   * the store default, 25), in `queue` ("default") at `priority` (0) carrying
   * `payload` (none); for an existing job moves dispatchAt and changes
   * maxAttempts, queue, priority and payload only where given, keeping lease,
   * worker, dispatched and cancelled. A payload past the owner's
   * `store_settings.max_payload_bytes` (64 KiB) as JSON text: `InvalidArgument`
   * naming `payload`, nothing changed. Notifies the store's channel at commit.
   * SQL: `job_schedule`
   */
  async schedule(job: ScheduleJob): Promise<void> {
    await this.#run.rows(
      "SELECT $schema.job_schedule($1::text, $2::bigint, $3::integer, $4::text, $5::integer," +
        " $6::jsonb)",
      [
        text("runId", job.runId),
        int8("dispatchAt", job.dispatchAt),
        optionalInt4("maxAttempts", job.maxAttempts),
        optionalText("queue", job.queue),
        optionalInt4("priority", job.priority),
        jsonText("payload", job.payload),
      ],
    );
  }

  /**
   * Leases the next due, waiting job of `options.queues` (absent: every queue; a
   * paused queue's jobs never) whose lease is absent or expired (highest priority,
   * then earliest dispatchAt, then runId) to `holder` until now + ttlMs, counting
   * one attempt; undefined when none is leasable right now. SQL: `job_lease`
   */
  async lease(
    holder: string,
    now: number | null,
    ttlMs: number,
    options?: LeaseOptions,
  ): Promise<Job | undefined> {
    const row = await this.#run.row(
      `SELECT ${COLUMNS} FROM $schema.job_lease($1::text, $2::bigint, $3::bigint, $4::text[])`,
      [
        text("holder", holder),
        optionalInt8("now", now),
        int8("ttlMs", ttlMs),
        queues(options?.queues),
      ],
    );
    return row === undefined ? undefined : job(row);
  }

  /**
   * Extends a lease `holder` still holds unexpired (given leaseSequence, only
   * that lease) to now + ttlMs; false: expired or taken, stop. SQL: `job_renew`
   */
  async renew(
    runId: string,
    holder: string,
    now: number | null,
    ttlMs: number,
    leaseSequence?: LeaseSequence | null,
  ): Promise<boolean> {
    const row = await this.#run.row(
      "SELECT $schema.job_renew($1::text, $2::text, $3::bigint, $4::bigint, $5::bigint) AS ok",
      [
        text("runId", runId),
        text("holder", holder),
        optionalInt8("now", now),
        int8("ttlMs", ttlMs),
        optionalInt8("leaseSequence", leaseSequence),
      ],
    );
    return row?.["ok"] === true;
  }

  /**
   * Records the dispatch when `holder` holds the job's lease, expired or not
   * (given leaseSequence, that lease), and answers whether a cancel arrived
   * meanwhile; recorded = false (nothing changed) when another holder took it
   * or it is gone. SQL: `job_mark_dispatched`
   */
  async markDispatched(
    runId: string,
    holder: string,
    workerId: string | undefined | null,
    leaseSequence?: LeaseSequence | null,
  ): Promise<MarkResult> {
    const row = await this.#run.row(
      "SELECT cancelled, recorded FROM $schema.job_mark_dispatched(" +
        "$1::text, $2::text, $3::text, $4::bigint)",
      [
        text("runId", runId),
        text("holder", holder),
        optionalText("workerId", workerId),
        optionalInt8("leaseSequence", leaseSequence),
      ],
    );
    return {
      cancelled: readBoolean("cancelled", row?.["cancelled"]),
      recorded: readBoolean("recorded", row?.["recorded"]),
    };
  }

  /**
   * Gives back `holder`'s lease without dispatching, due again at retryAt, or,
   * when that lease was the job's last attempt, fails it; true either way.
   * False, and nothing changed, when `holder` no longer holds the lease (or
   * not `options.leaseSequence`), the job was dispatched, or it is gone.
   * SQL: `job_release`
   */
  async release(
    runId: string,
    holder: string,
    retryAt: number,
    options?: ReleaseOptions,
  ): Promise<boolean> {
    const row = await this.#run.row(
      "SELECT $schema.job_release(" +
        "p_run_id => $1::text, p_holder => $2::text, p_retry_at => $3::bigint," +
        " p_lease_sequence => $4::bigint, p_error => $5::text) AS ok",
      [
        text("runId", runId),
        text("holder", holder),
        int8("retryAt", retryAt),
        optionalInt8("leaseSequence", options?.leaseSequence),
        optionalText("error", options?.error),
      ],
    );
    return row?.["ok"] === true;
  }

  /**
   * Puts a failed (uncancelled) job back to waiting at dispatchAt (absent or
   * null: now), attempts reset; "not_failed" and "missing" change nothing.
   * SQL: `job_retry`
   */
  async retry(runId: string, dispatchAt?: number | null): Promise<RetryResult> {
    const row = await this.#run.row("SELECT $schema.job_retry($1::text, $2::bigint) AS r", [
      text("runId", runId),
      optionalInt8("dispatchAt", dispatchAt),
    ]);
    return readString("job_retry", row?.["r"]) as RetryResult;
  }

  /**
   * Moves the job to dispatchAt when it still waits (not dispatched, cancelled or
   * failed) and holds no live lease at `now` (absent or null: the database clock),
   * and answers it as moved; an expired lease is cleared, so its holder can no
   * longer mark or release it (attempts and leaseSequence are kept). Undefined,
   * and nothing changed: no such job, a finished one, or a live lease (its holder
   * may be dispatching it). Unlike `schedule`, which moves any existing job.
   * Notifies the store's channel at commit when it moved the job.
   * SQL: `job_reschedule`
   */
  async reschedule(runId: string, dispatchAt: number, now?: number | null): Promise<Job | undefined> {
    const row = await this.#run.row(
      `SELECT ${COLUMNS} FROM $schema.job_reschedule($1::text, $2::bigint, $3::bigint)`,
      [text("runId", runId), int8("dispatchAt", dispatchAt), optionalInt8("now", now)],
    );
    return row === undefined ? undefined : job(row);
  }

  /**
   * Cancels the job: "cancelled" (also under a live lease: its holder learns it
   * from markDispatched), "already_dispatched" (nothing changed: tell the bot to
   * leave) or "missing". SQL: `job_cancel`
   */
  async cancel(runId: string): Promise<CancelResult> {
    const row = await this.#run.row("SELECT $schema.job_cancel($1::text) AS r", [
      text("runId", runId),
    ]);
    return readString("job_cancel", row?.["r"]) as CancelResult;
  }

  /** The run's job, or undefined. SQL: `job_get` */
  async get(runId: string): Promise<Job | undefined> {
    const row = await this.#run.row(`SELECT ${COLUMNS} FROM $schema.job_get($1::text)`, [
      text("runId", runId),
    ]);
    return row === undefined ? undefined : job(row);
  }

  /** Every dispatched job, ordered by runId. SQL: `job_list_dispatched` */
  async listDispatched(): Promise<Job[]> {
    const rows = await this.#run.rows(`SELECT ${COLUMNS} FROM $schema.job_list_dispatched()`, []);
    return rows.map(job);
  }

  /**
   * Deletes the job if it waits with no lease holder (unknown: nothing); any
   * other job throws `JobNotRemovable` naming its state, and nothing changes.
   * SQL: `job_remove`
   */
  async remove(runId: string): Promise<void> {
    await this.#run.rows("SELECT $schema.job_remove($1::text)", [text("runId", runId)]);
  }

  /**
   * The first `limit` jobs (absent: all) that `filter` selects, of `queues` (absent:
   * every queue), by dispatchAt then runId, and how many match in all: "all", "due"
   * (waiting and due at `now`), "dispatched", "failed". SQL: `job_list`
   */
  async list(
    filter: JobFilter,
    options?: { now?: number | null; limit?: number | null; queues?: readonly string[] | null },
  ): Promise<{ jobs: Job[]; matching: number }> {
    const rows = await this.#run.rows(
      `SELECT ${COLUMNS}, matching FROM $schema.job_list($1::text, $2::bigint, $3::integer,` +
        " $4::text[])",
      [
        text("filter", filter),
        optionalInt8("now", options?.now),
        optionalInt4("limit", options?.limit),
        queues(options?.queues),
      ],
    );
    const first = rows[0];
    return {
      jobs: rows.map(job),
      matching: first === undefined ? 0 : readNumber("matching", first["matching"]),
    };
  }

  /** The first `limit` failed jobs (absent: all), by dispatchAt then runId. SQL: `job_list` */
  async listFailed(limit?: number | null): Promise<Job[]> {
    return (await this.list("failed", { limit: limit ?? null })).jobs;
  }

  /**
   * `schedule` for each (runIds[i], dispatchAt[i]) in one statement: distinct
   * ids, at most 10000, all in `options.queue` at `options.priority`, each carrying
   * `options.payloads[i]` (as long as runIds); one notification. A payload too
   * large: `InvalidArgument` naming `payloads`, nothing changed.
   * SQL: `job_schedule_many`
   */
  async scheduleMany(
    runIds: readonly string[],
    dispatchAt: readonly number[],
    options?: ScheduleManyOptions,
  ): Promise<void> {
    const payloads = options?.payloads;
    await this.#run.rows(
      "SELECT $schema.job_schedule_many($1::text[], $2::bigint[], $3::text, $4::integer," +
        " $5::jsonb[])",
      [
        array("runIds", runIds, text),
        array("dispatchAt", dispatchAt, int8),
        optionalText("queue", options?.queue),
        optionalInt4("priority", options?.priority),
        payloads === null || payloads === undefined ? null : array("payloads", payloads, jsonText),
      ],
    );
  }

  /**
   * `lease` for up to `limit` jobs (at most 10000) of `options.queues` in one
   * statement, in lease order; jobs out of attempts among them are failed and left
   * out. SQL: `job_lease_many`
   */
  async leaseMany(
    holder: string,
    now: number | null,
    ttlMs: number,
    limit: number,
    options?: LeaseOptions,
  ): Promise<Job[]> {
    const rows = await this.#run.rows(
      `SELECT ${COLUMNS} FROM $schema.job_lease_many($1::text, $2::bigint, $3::bigint,` +
        " $4::integer, $5::text[])",
      [
        text("holder", holder),
        optionalInt8("now", now),
        int8("ttlMs", ttlMs),
        int4("limit", limit),
        queues(options?.queues),
      ],
    );
    return rows.map(job);
  }

  /**
   * `markDispatched` for each runIds[i] with workerIds[i], fenced by
   * leaseSequences[i] when given: one answer per job, in the order given.
   * SQL: `job_mark_dispatched_many`
   */
  async markDispatchedMany(
    runIds: readonly string[],
    holder: string,
    workerIds: readonly (string | null | undefined)[],
    leaseSequences?: readonly (LeaseSequence | null)[] | null,
  ): Promise<MarkResult[]> {
    const rows = await this.#run.rows(
      "SELECT cancelled, recorded FROM $schema.job_mark_dispatched_many(" +
        "$1::text[], $2::text, $3::text[], $4::bigint[])",
      [
        array("runIds", runIds, text),
        text("holder", holder),
        array("workerIds", workerIds, optionalText),
        sequences(leaseSequences),
      ],
    );
    return rows.map((row) => ({
      cancelled: readBoolean("cancelled", row["cancelled"]),
      recorded: readBoolean("recorded", row["recorded"]),
    }));
  }

  /**
   * `renew` for each runIds[i] at one `now`, fenced by leaseSequences[i] when
   * given: one answer per job, in the order given. SQL: `job_renew_many`
   */
  async renewMany(
    runIds: readonly string[],
    holder: string,
    now: number | null,
    ttlMs: number,
    leaseSequences?: readonly (LeaseSequence | null)[] | null,
  ): Promise<boolean[]> {
    const rows = await this.#run.rows(
      "SELECT renewed FROM $schema.job_renew_many($1::text[], $2::text, $3::bigint, $4::bigint, $5::bigint[])",
      [
        array("runIds", runIds, text),
        text("holder", holder),
        optionalInt8("now", now),
        int8("ttlMs", ttlMs),
        sequences(leaseSequences),
      ],
    );
    return rows.map((row) => readBoolean("renewed", row["renewed"]));
  }

  /**
   * Pauses `queue` (any name: it need not hold jobs): no lease takes its jobs
   * until `resumeQueue`; leases already held run on. True: paused now; false: it
   * was paused already (nothing changed). SQL: `queue_pause`
   */
  async pauseQueue(queue: string): Promise<boolean> {
    const row = await this.#run.row("SELECT $schema.queue_pause($1::text) AS ok", [
      text("queue", queue),
    ]);
    return readBoolean("queue_pause", row?.["ok"]);
  }

  /**
   * Resumes a paused `queue`, and wakes idle dispatchers at commit. True: resumed
   * now; false: it was not paused (nothing changed). SQL: `queue_resume`
   */
  async resumeQueue(queue: string): Promise<boolean> {
    const row = await this.#run.row("SELECT $schema.queue_resume($1::text) AS ok", [
      text("queue", queue),
    ]);
    return readBoolean("queue_resume", row?.["ok"]);
  }

  /**
   * Every queue that holds waiting jobs or was ever paused, by name, with its
   * depth, due and leased counts at `now` (absent or null: the database clock) and
   * whether it is paused. Reads every waiting job, never the history.
   * SQL: `queue_list`
   */
  async listQueues(now?: number | null): Promise<QueueInfo[]> {
    const rows = await this.#run.rows(
      "SELECT queue, depth, due, leased, paused, concurrency_limit, rate_limit, rate_period_ms," +
        " rate_used FROM $schema.queue_list($1::bigint)",
      [optionalInt8("now", now)],
    );
    return rows.map((row) => ({
      queue: readString("queue", row["queue"]),
      depth: readNumber("depth", row["depth"]),
      due: readNumber("due", row["due"]),
      leased: readNumber("leased", row["leased"]),
      paused: readBoolean("paused", row["paused"]),
      concurrencyLimit: readOptionalNumber("concurrency_limit", row["concurrency_limit"]),
      rateLimit: readOptionalNumber("rate_limit", row["rate_limit"]),
      ratePeriodMs: readOptionalNumber("rate_period_ms", row["rate_period_ms"]),
      rateUsed: readOptionalNumber("rate_used", row["rate_used"]),
    }));
  }

  /**
   * Holds at most `limit` live leases of `queue`'s jobs at once, across every
   * dispatcher (null: no limit). A lease counts until it expires or its job is
   * dispatched, released or failed; a renew keeps it counting. True: changed;
   * false: it was so already. 22023: a limit outside 1..10000. SQL: `queue_set_concurrency`
   */
  async setQueueConcurrency(queue: string, limit: number | null): Promise<boolean> {
    const row = await this.#run.row(
      "SELECT $schema.queue_set_concurrency($1::text, $2::integer) AS ok",
      [text("queue", queue), optionalInt4("limit", limit)],
    );
    return readBoolean("queue_set_concurrency", row?.["ok"]);
  }

  /**
   * Leases at most `limit` of `queue`'s jobs in any window of `periodMs` (both
   * null: no rate limit). True: changed; false: it was so already. 22023: one null
   * and not the other, a limit outside 1..10000 or a period outside 1 ms..366 days.
   * SQL: `queue_set_rate`
   */
  async setQueueRate(queue: string, limit: number | null, periodMs: number | bigint | null): Promise<boolean> {
    const row = await this.#run.row(
      "SELECT $schema.queue_set_rate($1::text, $2::integer, $3::bigint) AS ok",
      [text("queue", queue), optionalInt4("limit", limit), optionalInt8("period_ms", periodMs)],
    );
    return readBoolean("queue_set_rate", row?.["ok"]);
  }
}
