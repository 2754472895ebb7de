/**
 * Type check only (`npm run check:seeds`, tsc --noEmit): the stores assigned to the
 * seed interfaces as the seed systems' API pages declare them, restated here
 * independently of the package's own declarations (src/interfaces.ts).
 *
 * botmesh core: ScheduleStore, ScheduleRecord (pages 000, 002); agentos
 * meetings: IJobStore (page 004). ClaimResult, CompletePatch, ScheduleKind and
 * MeetingJob are named by the pages without their own page: they are given the
 * fields the pages and pgstore's contract name.
 */

import pg from "pg";

import { PgJobStore, PgScheduleStore } from "../../src/index.js";

type ScheduleKind = "cron" | "interval" | "once";

interface ScheduleRecord {
  id: string;
  kind: ScheduleKind;
  spec: string;
  nextRunAt: number | null;
  lastRunAt?: number;
  lastStatus?: "ok" | "error";
  fencingToken: number;
  leaseOwner?: string;
  leaseUntil?: number;
  updatedAt: number;
}

interface ClaimResult {
  record: ScheduleRecord;
  fencingToken: number;
}

interface CompletePatch {
  nextRunAt: number | null;
  lastRunAt: number;
  lastStatus: "ok" | "error";
}

interface ScheduleStore {
  start?(): Promise<void>;
  get(id: string): Promise<ScheduleRecord | null>;
  register(rec: Pick<ScheduleRecord, "id" | "kind" | "spec" | "nextRunAt">, now: number): Promise<ScheduleRecord>;
  claimDue(id: string, owner: string, now: number, leaseMs: number): Promise<ClaimResult | null>;
  renew(id: string, fencingToken: number, leaseUntil: number): Promise<boolean>;
  complete(id: string, fencingToken: number, patch: CompletePatch, now: number): Promise<boolean>;
  delete(id: string): Promise<void>;
  list(): Promise<ScheduleRecord[]>;
}

interface MeetingJob {
  runId: string;
  dispatchAt: number;
  leaseHolder?: string;
  leaseUntil?: number;
  workerId?: string;
  dispatched: boolean;
  cancelled: boolean;
}

interface IJobStore {
  cancel(runId: string): Promise<"cancelled" | "already_dispatched" | "missing">;
  forget?(runId: string): Promise<void>;
  get(runId: string): Promise<MeetingJob | undefined>;
  lease(holder: string, now: number, ttlMs: number): Promise<MeetingJob | undefined>;
  listDispatched(): Promise<MeetingJob[]>;
  markDispatched(
    runId: string,
    holder: string,
    workerId: string | undefined,
  ): Promise<{ cancelled: boolean; recorded: boolean }>;
  release(runId: string, holder: string, retryAt: number): Promise<boolean>;
  remove(runId: string): Promise<void>;
  renew(runId: string, holder: string, now: number, ttlMs: number): Promise<boolean>;
  schedule(job: { dispatchAt: number; runId: string }): Promise<void>;
}

declare const pool: pg.Pool;
declare const client: pg.Client;
declare const poolClient: pg.PoolClient;

export const schedulesOnPool: ScheduleStore = new PgScheduleStore(pool, { schema: "pgstore" });
export const schedulesOnClient: ScheduleStore = new PgScheduleStore(client);
export const jobsOnPool: IJobStore = new PgJobStore(pool, { schema: "pgstore" });
export const jobsOnPoolClient: IJobStore = new PgJobStore(poolClient);

// Durable: no forget (the seed says durable stores omit it).
// @ts-expect-error forget is not there
export const noForget = jobsOnPool.forget?.("x") ?? new PgJobStore(pool).forget("x");
