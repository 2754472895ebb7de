/** What both stores share: the connection, the schema, argument checks and bigint reads. */

import { InvalidArgument, SchemaNotReady, UnsafeInteger, translated } from "./errors.js";

/**
 * Anything that runs a parameterised query: a `pg.Pool`, a `pg.Client` or a
 * `pg.PoolClient` (of any copy of node-postgres). Given a client, the store's
 * calls run on it, inside whatever transaction the app has open there.
 */
export interface Queryable {
  query(config: { text: string; values: unknown[] }): Promise<{ rows: unknown[] }>;
}

/** Options of both stores. */
export interface StoreOptions {
  /** The store's schema, as migrated (`pgstore migrate --schema`); default "pgstore". */
  schema?: string;
}

export type Row = Record<string, unknown>;

const INT8_MIN = -(2n ** 63n);
const INT8_MAX = 2n ** 63n - 1n;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** The schema as a quoted identifier ("my ""odd"" schema"), never spliced raw. */
export function quotedSchema(schema: unknown): { name: string; quoted: string } {
  const name = text("schema", schema);
  if (name === "") throw new InvalidArgument("schema must be a non-empty string");
  return { name, quoted: `"${name.replace(/"/g, '""')}"` };
}

/** Runs the store's statements on the app's pool or client, with errors translated. */
export class Runner {
  readonly schema: string;
  readonly quoted: string;
  readonly #db: Queryable;

  constructor(db: Queryable, options: StoreOptions | undefined) {
    if (typeof db !== "object" || db === null || typeof db.query !== "function") {
      throw new InvalidArgument("db must be a pg.Pool, a pg.Client or a pg.PoolClient");
    }
    const { name, quoted } = quotedSchema(options?.schema ?? "pgstore");
    this.#db = db;
    this.schema = name;
    this.quoted = quoted;
  }

  /**
   * One statement: `text` with `$schema` replaced by the quoted schema, sent with
   * its values as an unnamed statement (no server-side prepared statement, no
   * session state: fine behind PgBouncer in transaction pooling).
   */
  async rows(text: string, values: unknown[]): Promise<Row[]> {
    const sql = text.replaceAll("$schema", this.quoted);
    try {
      const result = await this.#db.query({ text: sql, values });
      return result.rows as Row[];
    } catch (error) {
      throw translated(error, this.schema);
    }
  }

  async row(text: string, values: unknown[]): Promise<Row | undefined> {
    return (await this.rows(text, values))[0];
  }
}

// --- arguments: what the server cannot check -------------------------------------------

/** A string argument: a JavaScript string, without NUL or a lone surrogate. */
export function text(param: string, value: unknown): string {
  if (typeof value !== "string") throw new InvalidArgument(`${param} must be a string`);
  if (value.includes("\u0000")) {
    throw new InvalidArgument(`${param} must not contain a NUL character`);
  }
  if (LONE_SURROGATE.test(value)) {
    throw new InvalidArgument(`${param} must not contain a lone surrogate (not valid UTF-16)`);
  }
  return value;
}

export function optionalText(param: string, value: unknown): string | null {
  return value === null || value === undefined ? null : text(param, value);
}

/**
 * A bigint argument, sent as its decimal text: a safe-integer number or a bigint
 * within the int8 range. A fractional or unsafe number is refused (22023): it is
 * not the integer the caller meant.
 */
export function int8(param: string, value: unknown): string {
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) {
      throw new InvalidArgument(
        `${param} must be an integer within ±(2^53 - 1) (use a bigint beyond that)`,
      );
    }
    return String(value);
  }
  if (typeof value === "bigint") {
    if (value < INT8_MIN || value > INT8_MAX) {
      throw new InvalidArgument(`${param} is out of the bigint range`, "22003");
    }
    return value.toString();
  }
  throw new InvalidArgument(`${param} must be an integer (a number or a bigint)`);
}

export function optionalInt8(param: string, value: unknown): string | null {
  return value === null || value === undefined ? null : int8(param, value);
}

/** An integer (int4) argument. */
export function int4(param: string, value: unknown): number {
  if (typeof value === "bigint") value = Number(value);
  if (typeof value !== "number" || !Number.isInteger(value) || Math.abs(value) > 2 ** 31 - 1) {
    throw new InvalidArgument(`${param} must be an integer within ±(2^31 - 1)`);
  }
  return value;
}

export function optionalInt4(param: string, value: unknown): number | null {
  return value === null || value === undefined ? null : int4(param, value);
}

/**
 * A JSON argument (jsonb), sent as the text `JSON.stringify` writes; null or
 * undefined: NULL. Refused in the client (22023, nothing sent): what JSON cannot
 * hold (a bigint, a function, a symbol, a cycle, NaN or an infinity, which
 * `JSON.stringify` would write as null) and what jsonb cannot store (a NUL
 * character, a lone surrogate), in any value or key.
 */
export function jsonText(param: string, value: unknown): string | null {
  if (value === null || value === undefined) return null;
  let encoded: string | undefined;
  try {
    encoded = JSON.stringify(value, function (this: unknown, key: string, v: unknown): unknown {
      text(param, key);
      if (typeof v === "number" && !Number.isFinite(v)) {
        throw new InvalidArgument(`${param} must be a JSON value: ${v} is not a JSON number`);
      }
      if (typeof v === "string") text(param, v);
      return v;
    });
  } catch (error) {
    if (error instanceof InvalidArgument) throw error;
    throw new InvalidArgument(`${param} must be a JSON value: ${(error as Error).message}`);
  }
  if (encoded === undefined) throw new InvalidArgument(`${param} must be a JSON value`);
  return encoded;
}

/** An array argument's elements, each checked by `each`. */
export function array<T>(param: string, value: unknown, each: (p: string, v: unknown) => T): T[] {
  if (!Array.isArray(value)) throw new InvalidArgument(`${param} must be an array`);
  return value.map((element: unknown, i) => each(`${param}[${i}]`, element));
}

// --- answers: bigint columns -----------------------------------------------------------

/**
 * A bigint column as an exact bigint. node-postgres returns int8 as a string
 * unless the app installed another parser; a bigint or a safe number is taken
 * as it is.
 */
export function readBigInt(column: string, value: unknown): bigint {
  if (typeof value === "bigint") return value;
  if (typeof value === "string") return BigInt(value);
  if (typeof value === "number" && Number.isSafeInteger(value)) return BigInt(value);
  throw new UnsafeInteger(`${column}: ${String(value)} is not an exact integer`);
}

/** A bigint column as a number, only when exact: past 2^53 - 1 it throws UnsafeInteger. */
export function readNumber(column: string, value: unknown): number {
  const exact = readBigInt(column, value);
  if (exact > BigInt(Number.MAX_SAFE_INTEGER) || exact < BigInt(Number.MIN_SAFE_INTEGER)) {
    throw new UnsafeInteger(
      `${column} is ${exact}, past Number.MAX_SAFE_INTEGER: a number would round it`,
    );
  }
  return Number(exact);
}

export function readOptionalNumber(column: string, value: unknown): number | null {
  return value === null || value === undefined ? null : readNumber(column, value);
}

export function readString(column: string, value: unknown): string {
  if (typeof value !== "string") throw new TypeError(`${column}: expected text, got ${typeof value}`);
  return value;
}

export function readBoolean(column: string, value: unknown): boolean {
  if (typeof value !== "boolean") throw new TypeError(`${column}: expected boolean, got ${typeof value}`);
  return value;
}

export function readInt(column: string, value: unknown): number {
  return readNumber(column, value);
}

/** The check `start()` runs: every function this package calls exists with its signature. */
export async function checkFunctions(runner: Runner, signatures: readonly string[]): Promise<void> {
  const row = await runner.row(
    "SELECT coalesce(array_agg(s ORDER BY s) FILTER (WHERE to_regprocedure(s) IS NULL), '{}')" +
      " AS missing FROM unnest($1::text[]) AS u(s)",
    [signatures.map((s) => `${runner.quoted}.${s}`)],
  );
  const missing = (row?.["missing"] ?? []) as string[];
  if (missing.length > 0) {
    throw new SchemaNotReady(
      `schema ${JSON.stringify(runner.schema)} lacks ${missing.join(", ")}: ` +
        `run \`pgstore migrate --dsn DSN --schema ${runner.schema}\``,
    );
  }
}
