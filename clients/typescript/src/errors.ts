/**
 * The errors the stores throw. A server error with one of the SQLSTATEs below
 * becomes the matching class (the original error is its `cause`); any other
 * error is thrown as the driver raised it.
 *
 * | SQLSTATE | class |
 * | --- | --- |
 * | 22023, 22003 | InvalidArgument (nothing changed) |
 * | 25006 | ReadOnlyServer (a standby, or a read-only transaction) |
 * | 55000 | JobNotRemovable (only job_remove raises it) |
 * | 42883, 3F000 | SchemaNotReady (the schema is not migrated) |
 * | 42501 | NotPermitted (the role may not call the function) |
 */

/** Base class of the stores' own errors. */
export class PgStoreError extends Error {
  /** The server's SQLSTATE, or undefined for an error raised in the client. */
  readonly sqlstate: string | undefined;

  constructor(message: string, sqlstate?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.sqlstate = sqlstate;
  }
}

/**
 * A bad argument: the call changed nothing. `sqlstate` is "22023" for a value
 * outside the contract, "22003" for a value or a sum past the bigint range; the
 * message names the parameter. Arguments the server cannot see (a number that
 * is not a safe integer, a NUL character, a lone surrogate) are refused in the
 * client with "22023" before any query is sent.
 */
export class InvalidArgument extends PgStoreError {
  declare readonly sqlstate: string;

  constructor(message: string, sqlstate = "22023", options?: { cause?: unknown }) {
    super(message, sqlstate, options);
  }
}

/** The call reached a server that cannot write (a standby, SQLSTATE 25006): nothing changed. */
export class ReadOnlyServer extends PgStoreError {}

/** `remove` refused a job that does not wait unleased (SQLSTATE 55000): nothing changed. */
export class JobNotRemovable extends PgStoreError {}

/** The store's schema lacks the functions this package calls (42883, 3F000): run `pgstore migrate`. */
export class SchemaNotReady extends PgStoreError {}

/** The connection's role may not call the function (SQLSTATE 42501). */
export class NotPermitted extends PgStoreError {}

/**
 * A bigint read from the store does not fit a JavaScript number exactly (it is
 * past Number.MAX_SAFE_INTEGER, 2^53 - 1) where the seed interfaces type it as
 * `number`. Thrown instead of a rounded value; the message names the column.
 * Lease sequences are `bigint` and never raise it.
 */
export class UnsafeInteger extends PgStoreError {}

/** What a server error looks like: node-postgres' DatabaseError, duck-typed (any copy of pg). */
interface ServerError {
  code: string;
  message: string;
  severity?: string;
}

function isServerError(error: unknown): error is ServerError {
  if (typeof error !== "object" || error === null) return false;
  const { code, severity } = error as { code?: unknown; severity?: unknown };
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) && typeof severity === "string";
}

/** The store's error for a server error, or the error itself. */
export function translated(error: unknown, schema: string): unknown {
  if (!isServerError(error)) return error;
  const cause = { cause: error };
  switch (error.code) {
    case "22023":
    case "22003":
      return new InvalidArgument(error.message, error.code, cause);
    case "25006":
      return new ReadOnlyServer(error.message, error.code, cause);
    case "55000":
      return new JobNotRemovable(error.message, error.code, cause);
    case "42883":
    case "3F000":
      return new SchemaNotReady(
        `schema ${JSON.stringify(schema)} has no pgstore functions at this revision ` +
          `(${error.message}): run \`pgstore migrate --dsn DSN --schema ${schema}\``,
        error.code,
        cause,
      );
    case "42501":
      return new NotPermitted(error.message, error.code, cause);
    default:
      return error;
  }
}
