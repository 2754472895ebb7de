/** PgScheduleStore: botmesh's ScheduleStore over pgstore's schedule_* functions, with the controls. */

import type {
  ClaimResult,
  CompletePatch,
  ScheduleKind,
  ScheduleRecord,
  ScheduleStore,
} from "./interfaces.js";
import {
  type Queryable,
  type Row,
  Runner,
  type StoreOptions,
  checkFunctions,
  int8,
  optionalInt8,
  readBoolean,
  readNumber,
  readOptionalNumber,
  readString,
  text,
} from "./internal.js";

const COLUMNS =
  "id, kind, spec, next_run_at, last_run_at, last_status, fencing_token, lease_owner, lease_until," +
  " updated_at, paused, jitter_ms, due_at, triggered_at";

/** The functions PgScheduleStore calls, with the argument types it sends. */
export const SCHEDULE_FUNCTIONS = [
  "now_ms()",
  "schedule_get(text)",
  "schedule_register(text,text,text,bigint,bigint,text,bigint)",
  "schedule_claim_due(text,text,bigint,bigint)",
  "schedule_renew(text,bigint,bigint)",
  "schedule_complete(text,bigint,bigint,bigint,text,bigint)",
  "schedule_delete(text)",
  "schedule_list()",
  "schedule_pause(text,bigint)",
  "schedule_resume(text,bigint)",
  "schedule_trigger(text,bigint)",
] as const;

/**
 * A schedule as the store keeps it: the seed's ScheduleRecord fields, then the
 * schedule controls' (docs/schedule-controls.md). Absent optional fields are
 * left out (never `undefined`).
 */
export interface Schedule extends ScheduleRecord {
  /** No claim takes it until `resume`; a lease already held runs on. */
  paused: boolean;
  /**
   * Each occurrence becomes claimable a deterministic amount in [0, jitterMs)
   * after nextRunAt (0: none). Set by `register`.
   */
  jitterMs: number;
  /**
   * When a claim may take it next, epoch ms: nextRunAt plus its jitter, or a
   * pending trigger's time when that is earlier; null for a tombstone with no
   * trigger pending. Claims compare it with now; nextRunAt stays the nominal time.
   */
  dueAt: number | null;
  /**
   * A run out of turn that `trigger` asked for at this time: the next claim takes
   * it, due or not, and that claim's `complete` keeps nextRunAt.
   */
  triggeredAt?: number;
}

/** A successful claim: the claimed schedule and the claim's fencing token. */
export interface ScheduleClaim extends ClaimResult {
  record: Schedule;
}

/** register's options, beyond the seed's arguments. */
export interface RegisterOptions {
  /**
   * Spread each occurrence over [0, jitterMs) ms after its time, by an amount
   * fixed per schedule and occurrence; 0 to 86400000 (a day). Absent or null: 0,
   * no jitter (so a register without it clears a jitter set before).
   */
  jitterMs?: number | bigint | null;
}

/** A schedules row as a Schedule: absent optional fields are left out. */
function record(row: Row): Schedule {
  const rec: Schedule = {
    id: readString("id", row["id"]),
    kind: readString("kind", row["kind"]) as ScheduleKind,
    spec: readString("spec", row["spec"]),
    nextRunAt: readOptionalNumber("next_run_at", row["next_run_at"]),
    fencingToken: readNumber("fencing_token", row["fencing_token"]),
    updatedAt: readNumber("updated_at", row["updated_at"]),
    paused: readBoolean("paused", row["paused"]),
    jitterMs: readNumber("jitter_ms", row["jitter_ms"]),
    dueAt: readOptionalNumber("due_at", row["due_at"]),
  };
  const lastRunAt = readOptionalNumber("last_run_at", row["last_run_at"]);
  if (lastRunAt !== null) rec.lastRunAt = lastRunAt;
  // "skipped" (an occurrence pgstore's Python Scheduler did not run) has no place in
  // the seed's type: it reads as no status, lastRunAt still says when.
  const lastStatus = row["last_status"];
  if (lastStatus === "ok" || lastStatus === "error") rec.lastStatus = lastStatus;
  if (row["lease_owner"] !== null) rec.leaseOwner = readString("lease_owner", row["lease_owner"]);
  const leaseUntil = readOptionalNumber("lease_until", row["lease_until"]);
  if (leaseUntil !== null) rec.leaseUntil = leaseUntil;
  const triggeredAt = readOptionalNumber("triggered_at", row["triggered_at"]);
  if (triggeredAt !== null) rec.triggeredAt = triggeredAt;
  return rec;
}

/**
 * botmesh's `ScheduleStore` on a pgstore schema: each method is one call of one
 * SQL function, on the pool (autocommit) or on the client given (inside the
 * app's transaction, if one is open there).
 *
 * Times and fencing tokens are `number`, as the seed types them: a value read
 * past Number.MAX_SAFE_INTEGER throws `UnsafeInteger` rather than round.
 * `now` may be `null`: the database clock (`now_ms()`).
 */
export class PgScheduleStore implements ScheduleStore {
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
    await checkFunctions(this.#run, SCHEDULE_FUNCTIONS);
  }

  /** The database clock, epoch ms. SQL: `now_ms` */
  async nowMs(): Promise<number> {
    const row = await this.#run.row("SELECT $schema.now_ms() AS now", []);
    return readNumber("now_ms", row?.["now"]);
  }

  /** The record of `id`, or null. SQL: `schedule_get` */
  async get(id: string): Promise<Schedule | null> {
    const row = await this.#run.row(
      `SELECT ${COLUMNS} FROM $schema.schedule_get($1::text)`,
      [text("id", id)],
    );
    return row === undefined ? null : record(row);
  }

  /**
   * Inserts the task if absent (token: the id's high-water mark, or 0); same
   * kind, spec and jitter: untouched (a restart keeps its nextRunAt); another
   * kind or spec: overwrites kind, spec, nextRunAt and the jitter, keeping the
   * token; only another jitter: just that changes (dueAt follows). A pause and
   * a pending trigger are kept either way. Returns the stored record.
   * SQL: `schedule_register`
   */
  async register(
    rec: Pick<ScheduleRecord, "id" | "kind" | "spec" | "nextRunAt">,
    now: number | null,
    options?: RegisterOptions,
  ): Promise<Schedule> {
    const row = await this.#run.row(
      `SELECT ${COLUMNS} FROM $schema.schedule_register(` +
        "$1::text, $2::text, $3::text, $4::bigint, $5::bigint, 'once'::text, $6::bigint)",
      [
        text("id", rec.id),
        text("kind", rec.kind),
        text("spec", rec.spec),
        optionalInt8("nextRunAt", rec.nextRunAt),
        optionalInt8("now", now),
        int8("jitterMs", options?.jitterMs ?? 0),
      ],
    );
    if (row === undefined) throw new Error("schedule_register returned no row");
    return record(row);
  }

  /**
   * Claims `id` for `owner` until now + leaseMs, with the next fencing token,
   * when it is not paused, is due (dueAt <= now) and has no live lease; else
   * null (paused, not due, leased elsewhere, or unknown). SQL: `schedule_claim_due`
   */
  async claimDue(
    id: string,
    owner: string,
    now: number | null,
    leaseMs: number,
  ): Promise<ScheduleClaim | null> {
    const row = await this.#run.row(
      `SELECT ${COLUMNS} FROM $schema.schedule_claim_due($1::text, $2::text, $3::bigint, $4::bigint)`,
      [text("id", id), text("owner", owner), optionalInt8("now", now), int8("leaseMs", leaseMs)],
    );
    if (row === undefined) return null;
    const claimed = record(row);
    return { record: claimed, fencingToken: claimed.fencingToken };
  }

  /**
   * Sets leaseUntil only if `fencingToken` still matches a claim still held;
   * false means the lease was lost. SQL: `schedule_renew`
   */
  async renew(id: string, fencingToken: number | bigint, leaseUntil: number): Promise<boolean> {
    const row = await this.#run.row(
      "SELECT $schema.schedule_renew($1::text, $2::bigint, $3::bigint) AS ok",
      [text("id", id), int8("fencingToken", fencingToken), int8("leaseUntil", leaseUntil)],
    );
    return row?.["ok"] === true;
  }

  /**
   * Commits an occurrence only if `fencingToken` still matches a claim still
   * held: writes the patch, clears the lease, updatedAt = now. False when stale
   * or deleted; then nothing changed. SQL: `schedule_complete`
   */
  async complete(
    id: string,
    fencingToken: number | bigint,
    patch: CompletePatch,
    now: number | null,
  ): Promise<boolean> {
    const row = await this.#run.row(
      "SELECT $schema.schedule_complete(" +
        "$1::text, $2::bigint, $3::bigint, $4::bigint, $5::text, $6::bigint) AS ok",
      [
        text("id", id),
        int8("fencingToken", fencingToken),
        optionalInt8("patch.nextRunAt", patch.nextRunAt),
        int8("patch.lastRunAt", patch.lastRunAt),
        text("patch.lastStatus", patch.lastStatus),
        optionalInt8("now", now),
      ],
    );
    return row?.["ok"] === true;
  }

  /** Removes the record, keeping its token as the id's high-water mark. SQL: `schedule_delete` */
  async delete(id: string): Promise<void> {
    await this.#run.rows("SELECT $schema.schedule_delete($1::text)", [text("id", id)]);
  }

  /** Every stored record, orphans and tombstones included, ordered by id. SQL: `schedule_list` */
  async list(): Promise<Schedule[]> {
    const rows = await this.#run.rows(`SELECT ${COLUMNS} FROM $schema.schedule_list()`, []);
    return rows.map(record);
  }

  /**
   * Pauses `id`: no claim takes it until `resume`. A lease already held runs
   * on (its holder renews and completes as usual); nextRunAt, a pending trigger
   * and the token are kept; updatedAt = now when it was not paused. The record,
   * or null for an unknown id. `now` absent or null: the database clock.
   * SQL: `schedule_pause`
   */
  async pause(id: string, now?: number | null): Promise<Schedule | null> {
    return this.#control(`SELECT ${COLUMNS} FROM $schema.schedule_pause($1::text, $2::bigint)`, id, now);
  }

  /**
   * Makes `id` claimable again, with nextRunAt where the pause left it: the
   * occurrences missed meanwhile are met as after downtime, by whichever
   * scheduler claims it. updatedAt = now when it was paused. The record, or null
   * for an unknown id. SQL: `schedule_resume`
   */
  async resume(id: string, now?: number | null): Promise<Schedule | null> {
    return this.#control(`SELECT ${COLUMNS} FROM $schema.schedule_resume($1::text, $2::bigint)`, id, now);
  }

  /**
   * Asks for one run of `id` now, out of turn: sets triggeredAt (kept when
   * already set), so the next claim takes it, due or not, with a fresh token;
   * that claim's `complete` keeps nextRunAt (the patch's is ignored). An expired
   * lease is fenced: its holder can no longer renew or complete. Runs nothing
   * itself. The record, or null when refused: unknown, paused, or a live lease
   * (a run in progress: trigger again after it). SQL: `schedule_trigger`
   */
  async trigger(id: string, now?: number | null): Promise<Schedule | null> {
    return this.#control(`SELECT ${COLUMNS} FROM $schema.schedule_trigger($1::text, $2::bigint)`, id, now);
  }

  /** One control's statement on (id, now): the record it answers, or null. */
  async #control(sql: string, id: string, now: number | null | undefined): Promise<Schedule | null> {
    const row = await this.#run.row(sql, [text("id", id), optionalInt8("now", now)]);
    return row === undefined ? null : record(row);
  }
}
