// The engine core in its own thread (EngineThread), with a real Python worker
// in the dummy-null load format (each token is the last + 1, so outputs are
// known in advance): outputs arrive complete and in order, merged when the
// main thread is busy; refusals stay synchronous; aborts, worker death and
// close() end requests once and free everything; no process outlives the
// thread or the Node process.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { pathToFileURL } from "node:url";
import { RequestRejectedError } from "../../src/engine/engine-core.js";
import type { EngineRequest, RequestOutput } from "../../src/engine/types.js";
import { EngineThread } from "../../src/engine-host/engine-thread.js";
import { packageRoot } from "../../src/transport/package-root.js";
import { WorkerStartError } from "../../src/worker/types.js";
import type { WorkerHealthEvent } from "../../src/worker/types.js";
import { greedy, isRunning, nullModelDir, nullWorkerOptions, processesMatching, removeDir, tempDir, waitUntil } from "../worker/helpers.js";

const VOCAB = 128;
const demoDir = join(packageRoot, "models", "demo");
const dirs: string[] = [];
const threads: EngineThread[] = [];
after(async () => {
  await Promise.all(threads.map((t) => t.close()));
  dirs.forEach(removeDir);
});

async function startThread(): Promise<{ engine: EngineThread; dir: string }> {
  const dir = nullModelDir({ vocab_size: VOCAB });
  dirs.push(dir);
  const engine = await EngineThread.start({
    worker: nullWorkerOptions(dir, { numBlocks: 64 }),
    engine: { maxNumSeqs: 8, maxNumBatchedTokens: 64, enablePrefixCaching: true },
  });
  threads.push(engine);
  return { engine, dir };
}

let nextId = 0;
function request(promptIds: number[], maxTokens: number): EngineRequest {
  return {
    id: ++nextId,
    promptIds,
    sampling: greedy,
    stop: { maxTokens, eosTokenIds: [], stopTokenIds: [], ignoreEos: true, minTokens: 0 },
    priority: 0,
    arrivalMs: performance.now(),
  };
}

/** Submits and collects every output; `ended` resolves with them once one is finished. */
function run(engine: EngineThread, req: EngineRequest): { outputs: RequestOutput[]; ended: Promise<RequestOutput[]> } {
  const outputs: RequestOutput[] = [];
  let done: (all: RequestOutput[]) => void = () => {};
  const ended = new Promise<RequestOutput[]>((resolve) => (done = resolve));
  engine.submit(req, (output) => {
    assert.equal(output.requestId, req.id);
    assert.ok(!outputs.some((o) => o.finished), "nothing after the final output");
    outputs.push(output);
    if (output.finished) done(outputs);
  });
  return { outputs, ended };
}

/** The null worker's greedy continuation of a prompt. */
function expectedTokens(promptIds: number[], n: number): number[] {
  const out: number[] = [];
  let last = promptIds[promptIds.length - 1] as number;
  for (let i = 0; i < n; i++) out.push((last = (last + 1) % VOCAB));
  return out;
}

function busyWait(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // The main thread is blocked; the engine thread keeps stepping.
  }
}

describe("engine thread", () => {
  test("outputs arrive complete and in order, merged into fewer outputs while the main thread is busy", async () => {
    const { engine } = await startThread();
    const prompt = [5, 6, 7];
    const { ended } = run(engine, request(prompt, 60));
    busyWait(400);
    const outputs = await ended;
    assert.deepEqual(
      outputs.flatMap((o) => o.newTokenIds),
      expectedTokens(prompt, 60),
    );
    assert.ok(outputs.length < 60, `${outputs.length} outputs for 60 tokens: several steps were merged`);
    const last = outputs[outputs.length - 1] as RequestOutput;
    assert.equal(last.finishReason, "length");
    assert.equal(outputs.filter((o) => o.finished).length, 1);
    await waitUntil(() => engine.stats.numRunning === 0 && engine.stats.numFreeBlocks === engine.config.numBlocks, 5000, "the engine to be idle");
    // Unmerged when nobody blocks the main thread: one token per output.
    const again = await run(engine, request([9, 10, 11], 12)).ended;
    assert.deepEqual(
      again.flatMap((o) => o.newTokenIds),
      expectedTokens([9, 10, 11], 12),
    );
    assert.equal(engine.timings.recent().length > 0, true, "step timings reach the main thread");
  });

  test("requests that can never run are refused synchronously at submit", async () => {
    const { engine } = await startThread();
    assert.throws(() => engine.submit(request([], 4), () => {}), RequestRejectedError);
    assert.throws(() => engine.submit(request([1, VOCAB], 4), () => {}), /outside the vocabulary/);
    assert.throws(() => engine.submit(request([1], 0), () => {}), /maxTokens/);
    assert.throws(() => engine.submit(request(new Array<number>(64 * 16 + 1).fill(1), 1), () => {}), /more than/);
    const live = request([1, 2], 100);
    const { ended } = run(engine, live);
    assert.throws(() => engine.submit({ ...live }, () => {}), /already running/);
    engine.abort(live.id);
    assert.equal((await ended).at(-1)?.finishReason, "abort");
  });

  test("requests on their way to the engine count as waiting", async () => {
    const { engine } = await startThread();
    const runs = [1, 2, 3].map((i) => run(engine, request([i], 5)));
    assert.ok(engine.stats.numWaiting >= 3, `numWaiting ${engine.stats.numWaiting} right after 3 submits`);
    await Promise.all(runs.map((r) => r.ended));
    await waitUntil(() => engine.stats.numWaiting === 0 && engine.stats.numRunning === 0, 5000, "the queue to drain");
  });

  test("an abort mid-generation ends the request once and frees its blocks", async () => {
    const { engine } = await startThread();
    const req = request([3, 4, 5], 200);
    const { outputs, ended } = run(engine, req);
    await waitUntil(() => outputs.length > 0, 5000, "a first output");
    engine.abort(req.id);
    engine.abort(req.id);
    const all = await ended;
    assert.equal(all.at(-1)?.finishReason, "abort");
    const tokens = all.flatMap((o) => o.newTokenIds);
    assert.deepEqual(tokens, expectedTokens([3, 4, 5], tokens.length));
    assert.ok(tokens.length < 200);
    await waitUntil(() => engine.stats.numRunning === 0 && engine.stats.numFreeBlocks === engine.config.numBlocks, 5000, "all blocks free");
  });

  test("without restarts, the worker's death ends live requests and is reported once; new requests are refused", async () => {
    const { engine } = await startThread();
    const events: WorkerHealthEvent[] = [];
    engine.onWorkerEvent((event) => events.push(event));
    const { outputs, ended } = run(engine, request([1], 250));
    await waitUntil(() => outputs.length > 0, 5000, "a first output");
    process.kill(engine.pid, "SIGKILL");
    const all = await ended;
    // Ended by the engine, not by a fault of the request: "abort" with the reason (HTTP 503).
    assert.equal(all.at(-1)?.finishReason, "abort");
    assert.match(all.at(-1)?.error ?? "", /worker/);
    await waitUntil(() => events.length === 1, 5000, "the death to be reported");
    assert.equal(events[0]?.kind, "gave-up");
    assert.equal(events[0]?.kind === "gave-up" ? events[0].exit.signal : null, "SIGKILL");
    // New requests end at once instead of hanging.
    const next = await run(engine, request([2], 3)).ended;
    assert.equal(next.at(-1)?.finishReason, "error");
    assert.match(next.at(-1)?.error ?? "", /restarts are off/);
  });

  test("close() ends live requests with abort and stops the worker and the thread", async () => {
    const { engine, dir } = await startThread();
    const { outputs, ended } = run(engine, request([7], 250));
    await waitUntil(() => outputs.length > 0, 5000, "a first output");
    await engine.close();
    assert.equal((await ended).at(-1)?.finishReason, "abort");
    assert.equal(isRunning(engine.pid), false);
    assert.deepEqual(processesMatching(dir), []);
    assert.equal(engine.alive, false);
    assert.throws(() => engine.submit(request([1], 1), () => {}), /shutting down/);
    await engine.close();
  });

  test("weight-loading progress reaches the main thread, ending at all tensors loaded", { skip: !existsSync(join(demoDir, "model.safetensors")) && "no demo model (npm run setup)" }, async () => {
    const progress: [number, number][] = [];
    const engine = await EngineThread.start({
      worker: { ...nullWorkerOptions(demoDir, { numBlocks: 16 }), loadFormat: "auto", onLoadProgress: (done, total) => progress.push([done, total]) },
      engine: { maxNumSeqs: 2, maxNumBatchedTokens: 64 },
    });
    threads.push(engine);
    assert.ok(progress.length >= 2, JSON.stringify(progress));
    const [done, total] = progress.at(-1) as [number, number];
    assert.equal(done, total);
    assert.ok(total > 0);
    for (let i = 1; i < progress.length; i++) assert.ok((progress[i] as [number, number])[0] >= (progress[i - 1] as [number, number])[0], "progress only grows");
    await engine.close();
  });

  test("a worker that cannot start: WorkerStartError with its message, nothing left running", async () => {
    const dir = join(tempDir("missing"), "no-model-here");
    dirs.push(dir);
    await assert.rejects(EngineThread.start({ worker: nullWorkerOptions(dir), engine: { maxNumSeqs: 4, maxNumBatchedTokens: 64 } }), (error: unknown) => {
      assert.ok(error instanceof WorkerStartError);
      assert.match(error.message, /no-model-here/);
      return true;
    });
    assert.deepEqual(processesMatching(dir), []);
  });

  test("aborting the start while the worker loads rejects it and leaves no process", async () => {
    const dir = nullModelDir({ vocab_size: VOCAB });
    dirs.push(dir);
    const controller = new AbortController();
    const starting = EngineThread.start({ worker: nullWorkerOptions(dir), engine: { maxNumSeqs: 4, maxNumBatchedTokens: 64 }, signal: controller.signal });
    controller.abort();
    await assert.rejects(starting, WorkerStartError);
    await waitUntil(() => processesMatching(dir).length === 0, 5000, "no worker process");
  });
});

/** A Node process that starts an engine thread, prints the worker's pid, then exits or hangs. */
async function engineProcess(dir: string, then: "exit" | "hang"): Promise<{ workerPid: number; proc: ReturnType<typeof spawn>; exited: Promise<number | null> }> {
  const url = pathToFileURL(join(packageRoot, "dist", "src", "engine-host", "engine-thread.js")).href;
  const script = `
    const { EngineThread } = await import(${JSON.stringify(url)});
    const engine = await EngineThread.start({
      worker: { modelDir: ${JSON.stringify(dir)}, blockSize: 16, numBlocks: 16, dtype: "float32", device: "cpu", seed: 0, loadFormat: "dummy-null", forwardOutput: false },
      engine: { maxNumSeqs: 2, maxNumBatchedTokens: 32 },
    });
    console.log("PID " + engine.pid);
    if (${JSON.stringify(then)} === "exit") process.exit(0);
    setInterval(() => {}, 1000);
  `;
  const proc = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  let out = "";
  const workerPid = await new Promise<number>((resolve, reject) => {
    proc.stdout?.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      const match = /PID (\d+)/.exec(out);
      if (match) resolve(Number(match[1]));
    });
    void exited.then(() => reject(new Error(`the engine process exited early: ${out}`)));
  });
  return { workerPid, proc, exited };
}

describe("no orphans with an engine thread", () => {
  test("process.exit() without close() takes the worker down", async () => {
    const dir = nullModelDir();
    dirs.push(dir);
    const engine = await engineProcess(dir, "exit");
    assert.equal(await engine.exited, 0);
    await waitUntil(() => !isRunning(engine.workerPid), 5000, "the worker to die");
    assert.deepEqual(processesMatching(dir), []);
  });

  test("SIGKILL of the Node process takes the worker down", async () => {
    const dir = nullModelDir();
    dirs.push(dir);
    const engine = await engineProcess(dir, "hang");
    try {
      assert.equal(isRunning(engine.workerPid), true);
      engine.proc.kill("SIGKILL");
      await engine.exited;
      await waitUntil(() => !isRunning(engine.workerPid), 5000, "the worker to die");
      assert.deepEqual(processesMatching(dir), []);
    } finally {
      engine.proc.kill("SIGKILL");
    }
  });
});
