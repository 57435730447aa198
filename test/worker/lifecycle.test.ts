// Process lifecycle guarantees: no worker outlives its engine (normal exit,
// process.exit() without shutdown, SIGKILL of the engine), shutdown during
// start-up, and handshake failures the real worker cannot produce on demand
// (wrong protocol version, never ready), played by a stand-in worker script.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chmodSync, existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { pathToFileURL } from "node:url";
import { PROTOCOL_VERSION } from "../../src/transport/messages.js";
import { packageRoot } from "../../src/transport/package-root.js";
import { liveWorkerPids, shutdownAllWorkers, startWorker } from "../../src/worker/supervisor.js";
import { WorkerStartError } from "../../src/worker/types.js";
import { isRunning, nullModelDir, nullWorkerOptions, processesMatching, removeDir, tempDir, waitUntil } from "./helpers.js";

const dirs: string[] = [];
after(async () => {
  await shutdownAllWorkers(1000);
  dirs.forEach(removeDir);
});

function model(): string {
  const dir = nullModelDir();
  dirs.push(dir);
  return dir;
}

const supervisorUrl = pathToFileURL(join(packageRoot, "dist", "src", "worker", "supervisor.js")).href;

/**
 * Runs a Node engine process that starts a real worker, prints its pid, then
 * does `then` ("exit": process.exit(0) without shutdown; "hang": waits to be killed).
 */
function engineProcess(
  modelDir: string,
  then: "exit" | "hang",
): Promise<{ enginePid: number; workerPid: number; ipcDir: string; exited: Promise<number | null> }> {
  const options = JSON.stringify(nullWorkerOptions(modelDir));
  const code = `
    const { startWorker } = await import(${JSON.stringify(supervisorUrl)});
    const worker = await startWorker(${options});
    // The worker's --in-endpoint is ipc://<dir>/in; report <dir> so the test can check it is removed.
    const argv = (await import("node:fs")).readFileSync("/proc/" + worker.pid + "/cmdline", "utf8").split("\\0");
    const ipcDir = argv[argv.indexOf("--in-endpoint") + 1].slice("ipc://".length).replace(/\\/in$/, "");
    process.stdout.write(worker.pid + " " + ipcDir + "\\n");
    if (${JSON.stringify(then)} === "exit") process.exit(0);
    setInterval(() => {}, 1000);
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", code], { stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)));
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
      const [pid, ipcDir] = (out.split("\n")[0] ?? "").split(" ");
      if (out.includes("\n") && pid && ipcDir) resolve({ enginePid: child.pid!, workerPid: Number(pid), ipcDir, exited });
    });
    void exited.then((c) => reject(new Error(`engine exited (${c}) before printing a worker pid: ${stderr}`)));
  });
}

describe("no orphans", { concurrency: true }, () => {
  test("process.exit() without shutdown kills the worker (exit hook)", async () => {
    const dir = model();
    const engine = await engineProcess(dir, "exit");
    assert.equal(await engine.exited, 0);
    await waitUntil(() => !isRunning(engine.workerPid), 5000, "the worker to die");
    assert.deepStrictEqual(processesMatching(dir), []);
    assert.equal(existsSync(engine.ipcDir), false, `the ipc socket directory ${engine.ipcDir} is removed`);
  });

  test("SIGKILL of the engine takes the worker down too (worker-side parent watch)", async () => {
    const dir = model();
    const engine = await engineProcess(dir, "hang");
    try {
      assert.ok(isRunning(engine.workerPid));
      process.kill(engine.enginePid, "SIGKILL");
      await engine.exited;
      await waitUntil(() => !isRunning(engine.workerPid), 5000, "the orphaned worker to exit");
      // Nobody is left to remove the socket files of a SIGKILLed engine.
      removeDir(engine.ipcDir);
      assert.deepStrictEqual(processesMatching(dir), []);
    } finally {
      for (const pid of processesMatching(dir)) process.kill(pid, "SIGKILL");
    }
  });

  test("shutdown while the worker is still starting rejects startWorker and leaves no process", async () => {
    const dir = model();
    const starting = startWorker(nullWorkerOptions(dir));
    await waitUntil(() => liveWorkerPids().length > 0 && processesMatching(dir).length > 0, 10_000, "the worker to be spawned");
    await shutdownAllWorkers(1000);
    await assert.rejects(starting, (error: unknown) => {
      assert.ok(error instanceof WorkerStartError);
      assert.match(error.message, /shut down before it was ready/);
      return true;
    });
    assert.deepStrictEqual(processesMatching(dir), []);
  });
});

/** An executable stand-in for the Python interpreter that plays a misbehaving worker. */
function fakeWorker(behaviour: "wrong-version" | "never-ready" | "garbage" | "crash"): string {
  const dir = tempDir("fake");
  dirs.push(dir);
  const path = join(dir, "python");
  const requireFrom = JSON.stringify(join(packageRoot, "package.json"));
  const codecUrl = JSON.stringify(pathToFileURL(join(packageRoot, "dist", "src", "transport", "codec.js")).href);
  writeFileSync(
    path,
    `#!${process.execPath}
// Called as: python -m baton_worker --model DIR --in-endpoint E1 --out-endpoint E2 ...
const { createRequire } = require("node:module");
const { Push } = createRequire(${requireFrom})("zeromq");
const arg = (name) => process.argv[process.argv.indexOf(name) + 1];
(async () => {
  const { encode } = await import(${codecUrl});
  const push = new Push({ linger: 1000 });
  push.connect(arg("--out-endpoint"));
  const behaviour = ${JSON.stringify(behaviour)};
  if (behaviour === "crash") {
    process.stderr.write("Traceback (most recent call last):\\nRuntimeError: CUDA out of memory on the fake device\\n");
    process.exit(3);
  }
  if (behaviour === "wrong-version" || behaviour === "garbage") {
    const ready = { kind: "Ready", protocol_version: 99, num_blocks: 1, block_size: 16, max_model_len: 64, vocab_size: 8,
      architecture: "Fake", dtype: "float32", device: "cpu", worker_pid: process.pid, graph: {}, pooling: null };
    await push.send(behaviour === "garbage" ? Buffer.from([0x93, 0xa5, 0x72, 0x65, 0x61, 0x64, 0x79, 1, 2]) : encode(ready));
  }
  setInterval(() => {}, 1000); // never exits by itself
})();
`,
  );
  chmodSync(path, 0o755);
  return path;
}

describe("handshake failures (stand-in worker)", { concurrency: true }, () => {
  test("a different protocol version is refused and the worker killed", async () => {
    const dir = model();
    await assert.rejects(startWorker(nullWorkerOptions(dir, { python: fakeWorker("wrong-version") })), (error: unknown) => {
      assert.ok(error instanceof WorkerStartError);
      assert.match(error.message, new RegExp(`protocol version 99, the engine speaks ${PROTOCOL_VERSION}`));
      assert.equal(error.exit?.signal, "SIGKILL");
      return true;
    });
    assert.deepStrictEqual(processesMatching(dir), []);
  });

  test("a malformed Ready names the field", async () => {
    const dir = model();
    await assert.rejects(startWorker(nullWorkerOptions(dir, { python: fakeWorker("garbage") })), /malformed message: Ready: expected 11 fields after the tag, got 2/);
    assert.deepStrictEqual(processesMatching(dir), []);
  });

  test("a worker that never becomes ready times out and is killed", async () => {
    const dir = model();
    const started = Date.now();
    await assert.rejects(startWorker(nullWorkerOptions(dir, { python: fakeWorker("never-ready"), startTimeoutMs: 1500 })), /did not become ready within 2 s/);
    assert.ok(Date.now() - started < 10_000);
    assert.deepStrictEqual(processesMatching(dir), []);
  });

  test("a crash before Ready reports the stderr tail and exit code", async () => {
    const dir = model();
    await assert.rejects(startWorker(nullWorkerOptions(dir, { python: fakeWorker("crash") })), (error: unknown) => {
      assert.ok(error instanceof WorkerStartError);
      assert.match(error.message, /exited with code 3 before it was ready/);
      assert.match(error.message, /CUDA out of memory on the fake device/);
      assert.equal(error.exit?.code, 3);
      return true;
    });
  });
});
