/** PgScheduleStore: botmesh's ScheduleStore over pgstore's schedule_* functions. */

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
  readNumber,
  readOptionalNumber,
  readString,
  text,
} from "./internal.js";

const COLUMNS =
  "id, kind, spec, next_run_at, last_run_at, last_status, fencing_token, lease_owner, lease_until, updated_at";

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
] as const;

/** A schedules row as the seed's ScheduleRecord: absent optional fields are left out. */
function record(row: Row): ScheduleRecord {
  const rec: ScheduleRecord = {
    id: readString("id", row["id"]),
    kind: readString("kind", row["kind"]) as ScheduleKind,
    spec: readString("spec", row["spec"]),
    nextRunAt: readOptionalNumber("next_run_at", row["next_run_at"]),
    fencingToken: readNumber("fencing_token", row["fencing_token"]),
    updatedAt: readNumber("updated_at", row["updated_at"]),
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
  async get(id: string): Promise<ScheduleRecord | null> {
    const row = await this.#run.row(
      `SELECT ${COLUMNS} FROM $schema.schedule_get($1::text)`,
      [text("id", id)],
    );
    return row === undefined ? null : record(row);
  }

  /**
   * Inserts the task if absent (token: the id's high-water mark, or 0); same
   * kind and spec: untouched (a restart keeps its nextRunAt); another kind or
   * spec: overwrites kind, spec and nextRunAt, keeping the token. Returns the
   * stored record. SQL: `schedule_register`
   */
  async register(
    rec: Pick<ScheduleRecord, "id" | "kind" | "spec" | "nextRunAt">,
    now: number | null,
  ): Promise<ScheduleRecord> {
    const row = await this.#run.row(
      `SELECT ${COLUMNS} FROM $schema.schedule_register(` +
        "$1::text, $2::text, $3::text, $4::bigint, $5::bigint, 'once'::text, 0::bigint)",
      [
        text("id", rec.id),
        text("kind", rec.kind),
        text("spec", rec.spec),
        optionalInt8("nextRunAt", rec.nextRunAt),
        optionalInt8("now", now),
      ],
    );
    if (row === undefined) throw new Error("schedule_register returned no row");
    return record(row);
  }

  /**
   * Claims `id` for `owner` until now + leaseMs, with the next fencing token,
   * when it is due and has no live lease; else null (not due, leased elsewhere,
   * or unknown). SQL: `schedule_claim_due`
   */
  async claimDue(
    id: string,
    owner: string,
    now: number | null,
    leaseMs: number,
  ): Promise<ClaimResult | null> {
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
  async list(): Promise<ScheduleRecord[]> {
    const rows = await this.#run.rows(`SELECT ${COLUMNS} FROM $schema.schedule_list()`, []);
    return rows.map(record);
  }
}
