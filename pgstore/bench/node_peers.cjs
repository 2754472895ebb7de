// The bench's Node peers: graphile-worker and pg-boss, driven the way _peers.py
// drives the Python ones. Run by pgstore/bench/_node.py, never by hand:
//
//   node node_peers.cjs versions
//   node node_peers.cjs install <system> <schema>
//   node node_peers.cjs fill    <system> <schema> <jobs>
//   node node_peers.cjs work    <system> <schema> <settings-json>
//
// The connection comes from the PG* environment variables (node-postgres reads
// them); the packages from the folder in PGSTORE_BENCH_NODE_MODULES (the bench's
// npm cache, see _node.py). `work` connects, prints "ready", waits for a line on
// stdin, drains the queue with its peer's own batching, and prints one JSON line:
// {"got": [job ids], "last": "<CLOCK_MONOTONIC ns of the last completion>",
//  "calls": [epoch ms each job's handler ran, as got], "end": <epoch ms of the last completion>,
//  "cpu_us": <the process's CPU from the go line to the last completion, µs>,
//  "runq_us": <its main thread's time waiting for a CPU meanwhile, µs (schedstat)>}
// (the burst sends the go line at its instant T: the workers connect before).
"use strict";

const path = require("node:path");
const readline = require("node:readline");
const { createRequire } = require("node:module");

const modules = process.env.PGSTORE_BENCH_NODE_MODULES;
if (!modules) throw new Error("PGSTORE_BENCH_NODE_MODULES is not set");
const need = createRequire(path.join(modules, "package.json"));
const QUEUE = "bench";
const EMPTY_RETRIES = 3;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const now = () => process.hrtime.bigint().toString(); // CLOCK_MONOTONIC on Linux
const cpuSince = (at) => { const u = process.cpuUsage(at); return u.user + u.system; };
// ns the main thread waited, runnable, for a CPU (0 where /proc has no schedstat)
const runqNs = () => {
  try {
    return Number(require("node:fs").readFileSync("/proc/self/schedstat", "utf8").split(" ")[1]);
  } catch {
    return 0;
  }
};

function versions() {
  const of = (name) => need(`${name}/package.json`).version;
  return { node: process.versions.node, "graphile-worker": of("graphile-worker"),
           "pg-boss": of("pg-boss"), pg: of("pg") };
}

// e.g. "-c synchronous_commit=off" (node-postgres reads no PGOPTIONS of its own)
const options = process.env.PGSTORE_BENCH_PGOPTIONS || undefined;

function pool(max) {
  const { Pool } = need("pg");
  const p = new Pool({ max, options });
  p.on("error", (err) => process.stderr.write(`pool: ${err}\n`));
  p.on("connect", (client) => client.on("error", (err) => process.stderr.write(`client: ${err}\n`)));
  return p;
}

function boss(schema, max) {
  const PgBoss = need("pg-boss");
  const env = process.env;
  return new PgBoss({
    host: env.PGHOST, port: Number(env.PGPORT || 5432), user: env.PGUSER,
    password: env.PGPASSWORD, database: env.PGDATABASE, schema, max, options,
    supervise: false, schedule: false, migrate: true,
  });
}

async function waitForGo() {
  process.stdout.write("ready\n");
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    lines.close();
    return line;
  }
  throw new Error("stdin closed before go");
}

async function install(system, schema) {
  if (system === "graphile-worker") {
    const { runMigrations } = need("graphile-worker");
    const pgPool = pool(2);
    await runMigrations({ pgPool, schema, logger: quietLogger() });
    await pgPool.end();
  } else {
    const b = boss(schema, 2);
    await b.start();
    await b.createQueue(QUEUE);
    await b.stop({ graceful: false, wait: true });
  }
}

async function fill(system, schema, jobs) {
  if (system === "graphile-worker") {
    const { makeWorkerUtils } = need("graphile-worker");
    const pgPool = pool(2);
    const utils = await makeWorkerUtils({ pgPool, schema, logger: quietLogger() });
    const specs = Array.from({ length: jobs }, () => ({ identifier: QUEUE, payload: {} }));
    await utils.addJobs(specs);
    await utils.release();
    await pgPool.end();
  } else {
    const b = boss(schema, 2);
    await b.start();
    await b.insert(Array.from({ length: jobs }, () => ({ name: QUEUE, data: {} })));
    await b.stop({ graceful: false, wait: true });
  }
}

function quietLogger() {
  const { Logger } = need("graphile-worker");
  return new Logger(() => (level, message) => {
    if (level === "error") process.stderr.write(`${message}\n`);
  });
}

async function workGraphile(schema, settings) {
  const { runOnce } = need("graphile-worker");
  // Its own pool: the worker's job fetches and its batched completions.
  const pgPool = pool(settings.maxPoolSize);
  // Open every connection of its pool before "ready" (the Python workers connect
  // before it too): none is opened inside the timed drain.
  const clients = await Promise.all(
    Array.from({ length: settings.maxPoolSize }, () => pgPool.connect()));
  for (const client of clients) client.release();
  const got = [];
  const calls = [];
  let last = now();
  const taskList = {
    [QUEUE]: async (_payload, helpers) => {
      got.push(String(helpers.job.id));
      calls.push(Date.now());
    },
  };
  await waitForGo();
  const cpuAtGo = process.cpuUsage();
  const runqAtGo = runqNs();
  await runOnce({
    pgPool, schema, taskList, concurrency: settings.concurrentJobs, noHandleSignals: true,
    logger: quietLogger(),
    preset: { worker: { localQueue: { size: settings.localQueueSize },
                        completeJobBatchDelay: settings.completeJobBatchDelay } },
  });
  last = now(); // runOnce resolves once every completion is written
  const end = Date.now();
  const cpu_us = cpuSince(cpuAtGo);
  const runq_us = (runqNs() - runqAtGo) / 1000;
  await pgPool.end();
  return { got, last, calls, end, cpu_us, runq_us };
}

async function workBoss(schema, settings) {
  const b = boss(schema, settings.max);
  await b.start();
  const got = [];
  const calls = [];
  let last = now();
  let end = Date.now();
  let empty = 0;
  await waitForGo();
  const cpuAtGo = process.cpuUsage();
  const runqAtGo = runqNs();
  let cpu_us = 0;
  let runq_us = 0;
  while (empty < EMPTY_RETRIES) {
    const jobs = await b.fetch(QUEUE, { batchSize: settings.batchSize });
    if (!jobs || jobs.length === 0) {
      empty += 1;
      await sleep(2);
      continue;
    }
    empty = 0;
    const ids = jobs.map((j) => j.id);
    const called = Date.now();
    for (const _ of ids) calls.push(called);
    const done = await b.complete(QUEUE, ids);
    if (done.affected !== ids.length) throw new Error(`completed ${done.affected} of ${ids.length}`);
    for (const id of ids) got.push(String(id));
    last = now();
    end = Date.now();
    cpu_us = cpuSince(cpuAtGo);
    runq_us = (runqNs() - runqAtGo) / 1000;
  }
  await b.stop({ graceful: false, wait: true });
  return { got, last, calls, end, cpu_us, runq_us };
}

async function main() {
  const [command, system, schema, arg] = process.argv.slice(2);
  if (command === "versions") return versions();
  if (command === "install") return install(system, schema);
  if (command === "fill") return fill(system, schema, Number(arg));
  if (command === "work") {
    const settings = JSON.parse(arg);
    return system === "graphile-worker"
      ? workGraphile(schema, settings) : workBoss(schema, settings);
  }
  throw new Error(`unknown command ${command}`);
}

main().then(
  // exit once the answer is written: a pipe takes 64 KiB before write() must wait
  (out) => process.stdout.write(out ? `${JSON.stringify(out)}\n` : "", () => process.exit(0)),
  (err) => {
    process.stderr.write(`${err && err.stack ? err.stack : err}\n`);
    process.exit(1);
  },
);
