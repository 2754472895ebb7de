/**
 * The interfaces this package implements, declared here as the seed systems'
 * API pages declare them (structurally identical: an implementation of these is
 * one of theirs). botmesh's `ScheduleStore` (@botmesh/core) and agentos'
 * `IJobStore` (meetings stores).
 */

/** How a schedule recurs; the spec's meaning depends on it. */
export type ScheduleKind = "cron" | "interval" | "once";

/** Persisted state of one durable task. Times are epoch ms. */
export interface ScheduleRecord {
  id: string;
  kind: ScheduleKind;
  /** Cron expression, interval in ms, or one-shot delay in ms (as a string); opaque to the store. */
  spec: string;
  /** Epoch ms of the next occurrence; `null` once a one-shot task has run (a tombstone). */
  nextRunAt: number | null;
  lastRunAt?: number;
  lastStatus?: "ok" | "error";
  /** Bumped by every successful claimDue; never goes backwards for an id, even across delete. */
  fencingToken: number;
  leaseOwner?: string;
  leaseUntil?: number;
  updatedAt: number;
}

/** A successful claim: the claimed record and the claim's fencing token. */
export interface ClaimResult {
  record: ScheduleRecord;
  fencingToken: number;
}

/** What `complete` writes. */
export interface CompletePatch {
  nextRunAt: number | null;
  lastRunAt: number;
  lastStatus: "ok" | "error";
}

/** Storage for durable scheduled tasks (botmesh's `BotConfig.scheduler.store`). */
export interface ScheduleStore {
  start?(): Promise<void>;
  get(id: string): Promise<ScheduleRecord | null>;
  register(
    rec: Pick<ScheduleRecord, "id" | "kind" | "spec" | "nextRunAt">,
    now: number,
  ): Promise<ScheduleRecord>;
  claimDue(id: string, owner: string, now: number, leaseMs: number): Promise<ClaimResult | null>;
  renew(id: string, fencingToken: number, leaseUntil: number): Promise<boolean>;
  complete(id: string, fencingToken: number, patch: CompletePatch, now: number): Promise<boolean>;
  delete(id: string): Promise<void>;
  list(): Promise<ScheduleRecord[]>;
}

/**
 * One run's delayed dispatch, as the job store keeps it. agentos' page does not
 * spell `MeetingJob` out; these are the fields its `IJobStore` methods name
 * (the run, its due time, the lease, the worker, the dispatched and cancelled
 * flags).
 */
export interface MeetingJob {
  runId: string;
  dispatchAt: number;
  leaseHolder?: string;
  leaseUntil?: number;
  workerId?: string;
  dispatched: boolean;
  cancelled: boolean;
}

/** Delayed dispatch with leases: two takers never hold one job. */
export interface IJobStore {
  forget?(runId: string): Promise<void>;
  schedule(job: { dispatchAt: number; runId: string }): Promise<void>;
  lease(holder: string, now: number, ttlMs: number): Promise<MeetingJob | undefined>;
  renew(runId: string, holder: string, now: number, ttlMs: number): Promise<boolean>;
  markDispatched(
    runId: string,
    holder: string,
    workerId: string | undefined,
  ): Promise<{ cancelled: boolean; recorded: boolean }>;
  release(runId: string, holder: string, retryAt: number): Promise<boolean>;
  cancel(runId: string): Promise<"cancelled" | "already_dispatched" | "missing">;
  get(runId: string): Promise<MeetingJob | undefined>;
  listDispatched(): Promise<MeetingJob[]>;
  remove(runId: string): Promise<void>;
}
