/**
 * pgstore for Node: botmesh's ScheduleStore and agentos' IJobStore over a
 * pgstore schema, with node-postgres.
 *
 *     import pg from "pg";
 *     import { PgJobStore, PgScheduleStore } from "@pgstore/client";
 *
 *     const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 *     const jobs = new PgJobStore(pool, { schema: "pgstore" });
 *     const schedules = new PgScheduleStore(pool, { schema: "pgstore" });
 */

export {
  InvalidArgument,
  JobNotRemovable,
  NotPermitted,
  PgStoreError,
  ReadOnlyServer,
  SchemaNotReady,
  UnsafeInteger,
} from "./errors.js";
export type {
  ClaimResult,
  CompletePatch,
  IJobStore,
  MeetingJob,
  ScheduleKind,
  ScheduleRecord,
  ScheduleStore,
} from "./interfaces.js";
export type { Queryable, StoreOptions } from "./internal.js";
export {
  JOB_FUNCTIONS,
  PgJobStore,
  type CancelResult,
  type Job,
  type JobFilter,
  type LeaseOptions,
  type LeaseSequence,
  type MarkResult,
  type QueueInfo,
  type ReleaseOptions,
  type RetryResult,
  type ScheduleJob,
  type ScheduleManyOptions,
} from "./jobs.js";
export {
  PgScheduleStore,
  SCHEDULE_FUNCTIONS,
  type RegisterOptions,
  type Schedule,
  type ScheduleClaim,
} from "./schedules.js";
