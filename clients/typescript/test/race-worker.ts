/**
 * One racer of races.test.ts, in a process of its own: reads one JSON command per
 * line on stdin, runs it on its own pool, answers one JSON line on stdout.
 *   {"op": "lease", "holder"}         -> {"runId", "leaseSequence"} or {}
 *   {"op": "drain", "holder"}         -> {"runIds": [...]}: leases until none is left
 *   {"op": "mark", "runId", "holder"} -> {"cancelled", "recorded"}
 *   {"op": "cancel", "runId"}         -> {"answer"}
 */

import { createInterface } from "node:readline";

import { PgJobStore } from "../src/index.js";
import { DSN, SCHEMA, pool } from "./helpers.js";

const db = pool(DSN, 1);
const jobs = new PgJobStore(db, { schema: SCHEMA });

async function handle(command: Record<string, string>): Promise<unknown> {
  switch (command["op"]) {
    case "lease": {
      const job = await jobs.lease(command["holder"] ?? "", null, 600_000);
      return job === undefined ? {} : { runId: job.runId, leaseSequence: job.leaseSequence.toString() };
    }
    case "drain": {
      const runIds: string[] = [];
      for (;;) {
        const job = await jobs.lease(command["holder"] ?? "", null, 600_000);
        if (job === undefined) return { runIds };
        runIds.push(job.runId);
      }
    }
    case "mark":
      return jobs.markDispatched(command["runId"] ?? "", command["holder"] ?? "", "bot");
    case "cancel":
      return { answer: await jobs.cancel(command["runId"] ?? "") };
    default:
      throw new Error(`unknown op ${command["op"]}`);
  }
}

await db.query("SELECT 1"); // connected before the first race
process.stdout.write("ready\n");
for await (const line of createInterface({ input: process.stdin })) {
  if (line === "") continue;
  process.stdout.write(`${JSON.stringify(await handle(JSON.parse(line) as Record<string, string>))}\n`);
}
await db.end();
