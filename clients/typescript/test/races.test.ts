/**
 * Races between processes, on real parallel connections, many trials:
 * two Node processes leasing at once never hold one job, and a cancel racing a
 * mark never leaves a bot in a cancelled meeting.
 */

import { strict as assert } from "node:assert";
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import * as path from "node:path";
import { createInterface, type Interface } from "node:readline";
import { after, before, test } from "node:test";

import pg from "pg";

import { PgJobStore } from "../src/index.js";
import { DSN, SCHEMA, pool, reset } from "./helpers.js";

const TRIALS = 300;
const WORKER = path.join(path.dirname(fileURLToPath(import.meta.url)), "race-worker.js");

class Racer {
  readonly child: ChildProcessWithoutNullStreams;
  readonly lines: Interface;
  readonly #waiting: ((line: string) => void)[] = [];

  constructor() {
    this.child = spawn(process.execPath, [WORKER], { stdio: ["pipe", "pipe", "pipe"] });
    this.child.stderr.on("data", (chunk: Buffer) => process.stderr.write(chunk));
    this.lines = createInterface({ input: this.child.stdout });
    this.lines.on("line", (line) => this.#waiting.shift()?.(line));
  }

  next(): Promise<string> {
    return new Promise((resolve) => this.#waiting.push(resolve));
  }

  /** Sends a command; the answer comes back as a promise (sent first, awaited later). */
  send(command: Record<string, string>): Promise<Record<string, unknown>> {
    const answer = this.next();
    this.child.stdin.write(`${JSON.stringify(command)}\n`);
    return answer.then((line) => JSON.parse(line) as Record<string, unknown>);
  }

  async stop(): Promise<void> {
    const exited = new Promise((resolve) => this.child.on("exit", resolve));
    this.child.stdin.end();
    await exited;
  }
}

let owner: pg.Pool;
let jobs: PgJobStore;
let racers: Racer[];

before(async () => {
  owner = pool(DSN, 2);
  jobs = new PgJobStore(owner, { schema: SCHEMA });
  await reset(owner);
  racers = [new Racer(), new Racer()];
  await Promise.all(racers.map((r) => r.next().then((line) => assert.equal(line, "ready"))));
});

after(async () => {
  await Promise.all(racers.map((r) => r.stop()));
  await owner.end();
});

test(`two processes leasing one due job at once: exactly one holds it (${TRIALS} trials)`, async () => {
  const wins = [0, 0];
  for (let i = 0; i < TRIALS; i++) {
    const runId = `lease-${i}`;
    await jobs.schedule({ runId, dispatchAt: 0 });
    const answers = await Promise.all(racers.map((r, n) => r.send({ op: "lease", holder: `p${n}` })));
    const holders = answers.flatMap((a, n) => (a["runId"] === undefined ? [] : [n]));
    assert.equal(holders.length, 1, `trial ${i}: ${JSON.stringify(answers)}`);
    const winner = holders[0] as number;
    assert.equal(answers[winner]?.["runId"], runId);
    wins[winner] = (wins[winner] ?? 0) + 1;
    const job = await jobs.get(runId);
    assert.equal(job?.leaseHolder, `p${winner}`);
    assert.equal(job?.leaseSequence, 1n);
  }
  process.stdout.write(`lease race wins per process: ${wins.join(" / ")}\n`);
});

test("two processes draining 500 due jobs at once: each job leased by exactly one", async () => {
  const runIds = Array.from({ length: 500 }, (_, i) => `drain-${String(i).padStart(3, "0")}`);
  await jobs.scheduleMany(runIds, runIds.map(() => 0));
  const [a, b] = await Promise.all(racers.map((r, n) => r.send({ op: "drain", holder: `d${n}` })));
  const first = (a?.["runIds"] ?? []) as string[];
  const second = (b?.["runIds"] ?? []) as string[];
  const both = first.filter((id) => second.includes(id));
  assert.deepEqual(both, [], "a job leased by both processes");
  assert.deepEqual([...first, ...second].sort(), runIds);
  process.stdout.write(`drained ${first.length} / ${second.length}\n`);
});

test(`a cancel racing a mark never leaves a bot in a cancelled meeting (${TRIALS} trials)`, async () => {
  const outcomes = { markSawCancel: 0, cancelSawDispatch: 0 };
  for (let i = 0; i < TRIALS; i++) {
    const runId = `meeting-${i}`;
    await jobs.schedule({ runId, dispatchAt: 0 });
    const leased = await jobs.lease("dispatcher", null, 600_000);
    assert.equal(leased?.runId, runId);
    // Both sent before either answer is read: the two statements run at once.
    const marking = racers[0]!.send({ op: "mark", runId, holder: "dispatcher" });
    const cancelling = racers[1]!.send({ op: "cancel", runId });
    const [mark, cancel] = await Promise.all([marking, cancelling]);
    assert.equal(mark["recorded"], true, `trial ${i}`);
    if (cancel["answer"] === "already_dispatched") {
      outcomes.cancelSawDispatch++;
      assert.equal(mark["cancelled"], false, `trial ${i}`);
    } else {
      assert.equal(cancel["answer"], "cancelled", `trial ${i}`);
      assert.equal(mark["cancelled"], true, `trial ${i}: the bot was not told to leave`);
      outcomes.markSawCancel++;
    }
    const job = await jobs.get(runId);
    assert.equal(job?.dispatched, true);
    assert.equal(job?.cancelled, cancel["answer"] === "cancelled");
  }
  process.stdout.write(
    `cancel vs mark: mark saw the cancel ${outcomes.markSawCancel}, cancel saw the dispatch ${outcomes.cancelSawDispatch}\n`,
  );
});
