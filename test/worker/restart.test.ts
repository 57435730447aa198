// WorkerSupervisor against the real Python worker (dummy-null weights, real
// ZeroMQ, real signals): a worker killed by SIGKILL is restarted after its
// backoff and serves again from a fresh process and socket directory; a
// worker killed while it restarts is tried again; a crash loop hits the cap
// and gives up; the step watchdog treats a stopped (SIGSTOP) worker as dead,
// mid-step and idle. No process is left behind, even when a test fails.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { after, describe, test } from "node:test";
import { backoffMs, shutdownAllWorkers, WorkerSupervisor, type RestartPolicy, type WorkerEvent } from "../../src/worker/supervisor.js";
import { WorkerDiedError, type WorkerOptions } from "../../src/worker/types.js";
import { decodeStep, isRunning, nullModelDir, nullWorkerOptions, prefillStep, processesMatching, removeDir, waitUntil } from "./helpers.js";

const dirs: string[] = [];
const supervisors: WorkerSupervisor[] = [];
after(async () => {
  await Promise.all(supervisors.map((s) => s.stop(1000)));
  await shutdownAllWorkers(1000);
  for (const dir of dirs) for (const pid of processesMatching(dir)) process.kill(pid, "SIGKILL");
  dirs.forEach(removeDir);
});

/** Fast backoff for tests: 100 ms, 200 ms, 400 ms ... */
const FAST: Omit<RestartPolicy, "maxRestarts"> = { backoffBaseMs: 100, backoffCapMs: 1_000 };

async function supervise(policy: RestartPolicy, overrides: Partial<WorkerOptions> = {}): Promise<{ sup: WorkerSupervisor; events: WorkerEvent[]; dir: string }> {
  const dir = nullModelDir();
  dirs.push(dir);
  const events: WorkerEvent[] = [];
  const sup = await WorkerSupervisor.start(0, nullWorkerOptions(dir, overrides), policy, (event) => events.push(event));
  supervisors.push(sup);
  return { sup, events, dir };
}

function ipcDirOf(pid: number): string {
  const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
  return argv[argv.indexOf("--in-endpoint") + 1]!.slice("ipc://".length).replace(/\/in$/, "");
}

describe("restarts", { concurrency: true }, () => {
  test("backoff doubles from the base up to the cap", () => {
    assert.deepEqual([0, 1, 2, 3, 4, 5, 6].map((n) => backoffMs({ maxRestarts: 9 }, n)), [1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    assert.deepEqual([0, 1, 2, 3, 4].map((n) => backoffMs({ maxRestarts: 9, ...FAST }, n)), [100, 200, 400, 800, 1000]);
  });

  test("a killed worker is restarted after its backoff and serves again; the old process and sockets are gone", async () => {
    const { sup, events, dir } = await supervise({ maxRestarts: 3, ...FAST });
    const first = sup.client;
    const firstIpc = ipcDirOf(first.pid);
    await first.executeStep(prefillStep(1, 1, [3, 4, 5], 0));
    const diedAt = performance.now();
    process.kill(first.pid, "SIGKILL");
    await waitUntil(() => events.some((e) => e.kind === "up"), 30_000, "the restart");
    const down = events.find((e) => e.kind === "down");
    assert.ok(down?.kind === "down");
    assert.equal(down.exit.signal, "SIGKILL");
    assert.match(down.exit.summary, /killed by SIGKILL/);
    assert.equal(down.restartInMs, 100);
    assert.ok(performance.now() - diedAt >= 100, "not before the backoff");
    const up = events.find((e) => e.kind === "up");
    assert.ok(up?.kind === "up");
    assert.equal(up.client, sup.client);
    assert.notEqual(up.client.pid, first.pid);
    assert.equal(up.restarts, 1);
    assert.equal(isRunning(first.pid), false);
    assert.equal(existsSync(firstIpc), false, "the dead worker's socket directory is removed");
    await assert.rejects(first.executeStep(decodeStep(2, 1, 3)), WorkerDiedError);
    // The new worker knows nothing of the old one's requests: a fresh prefill works.
    const res = await sup.client.executeStep(prefillStep(2, 1, [3, 4, 5], 0));
    assert.deepEqual(Array.from(res.req_ids), [1]);
    assert.deepEqual(processesMatching(dir), [sup.client.pid]);
  });

  test("a worker killed while it restarts is tried again", async () => {
    const { sup, events, dir } = await supervise({ maxRestarts: 4, ...FAST });
    const first = sup.client.pid;
    process.kill(first, "SIGKILL");
    // The next one is spawned after 100 ms; kill it before it is Ready.
    await waitUntil(() => processesMatching(dir).some((pid) => pid !== first), 10_000, "the restart to spawn");
    const second = processesMatching(dir).find((pid) => pid !== first)!;
    process.kill(second, "SIGKILL");
    await waitUntil(() => events.some((e) => e.kind === "up"), 30_000, "a restart that stays up");
    const downs = events.filter((e) => e.kind === "down");
    assert.equal(downs.length, 2, "the death and the failed restart");
    assert.deepEqual(downs.map((e) => e.kind === "down" && e.restartInMs), [100, 200]);
    assert.notEqual(sup.client.pid, second);
    assert.deepEqual(processesMatching(dir), [sup.client.pid]);
  });

  test("a crash loop hits the cap and gives up, leaving nothing running", async () => {
    const { sup, events, dir } = await supervise({ maxRestarts: 2, ...FAST });
    // Kill every incarnation as soon as it is up.
    process.kill(sup.client.pid, "SIGKILL");
    for (let n = 1; n <= 2; n++) {
      await waitUntil(() => events.filter((e) => e.kind === "up").length === n, 30_000, `restart ${n}`);
      process.kill(sup.client.pid, "SIGKILL");
    }
    await waitUntil(() => events.some((e) => e.kind === "gave-up"), 10_000, "giving up");
    const last = events.at(-1)!;
    assert.equal(last.kind, "gave-up");
    assert.match(last.kind === "gave-up" ? last.message : "", /died 3 times in a row \(--max-worker-restarts 2\): model worker was killed by SIGKILL/);
    assert.equal(sup.finished, true);
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual(processesMatching(dir), []);
  });

  test("with restarts off, the first death gives up", async () => {
    const { sup, events } = await supervise({ maxRestarts: 0 });
    process.kill(sup.client.pid, "SIGKILL");
    await waitUntil(() => events.length > 0, 10_000, "the event");
    assert.equal(events[0]!.kind, "gave-up");
    assert.match(events[0]!.kind === "gave-up" ? events[0]!.message : "", /restarts are off \(--max-worker-restarts 0\)/);
  });

  test("stop() during the backoff cancels the restart", async () => {
    const { sup, events, dir } = await supervise({ maxRestarts: 3, backoffBaseMs: 2_000 });
    process.kill(sup.client.pid, "SIGKILL");
    await waitUntil(() => events.length > 0, 10_000, "the death");
    await sup.stop(1000);
    await new Promise((r) => setTimeout(r, 2_300));
    assert.deepEqual(processesMatching(dir), []);
    assert.equal(events.filter((e) => e.kind === "up").length, 0);
  });
});

describe("the step watchdog", { concurrency: true }, () => {
  test("a worker stopped mid-step is killed after --step-timeout and restarted", async () => {
    const { sup, events } = await supervise({ maxRestarts: 2, ...FAST }, { stepTimeoutMs: 600 });
    const first = sup.client;
    await first.executeStep(prefillStep(1, 1, [3, 4, 5], 0));
    process.kill(first.pid, "SIGSTOP");
    const started = performance.now();
    await assert.rejects(first.executeStep(decodeStep(2, 1, 3)), (error: unknown) => {
      assert.ok(error instanceof WorkerDiedError);
      assert.match(error.message, /did not answer step 2 within 600 ms \(--step-timeout\); it is treated as hung/);
      return true;
    });
    const waited = performance.now() - started;
    assert.ok(waited >= 600 && waited < 5_000, `detected after ${Math.round(waited)} ms`);
    await waitUntil(() => events.some((e) => e.kind === "up"), 30_000, "the restart");
    const down = events.find((e) => e.kind === "down");
    assert.ok(down?.kind === "down");
    assert.match(down.exit.summary, /did not answer step 2/);
    assert.equal(isRunning(first.pid), false);
    assert.deepEqual(Array.from((await sup.client.executeStep(prefillStep(3, 1, [3, 4, 5], 0))).req_ids), [1]);
  });

  test("an idle worker that stops answering is found by its pings", async () => {
    const { sup, events } = await supervise({ maxRestarts: 2, ...FAST }, { stepTimeoutMs: 500 });
    const pid = sup.client.pid;
    process.kill(pid, "SIGSTOP");
    await waitUntil(() => events.some((e) => e.kind === "down"), 10_000, "the hang to be noticed");
    const down = events.find((e) => e.kind === "down");
    assert.match(down?.kind === "down" ? down.exit.summary : "", /did not answer a ping within 500 ms while idle/);
    await waitUntil(() => events.some((e) => e.kind === "up"), 30_000, "the restart");
    assert.equal(isRunning(pid), false);
  });
});
