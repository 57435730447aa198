// How worker deaths, restarts and give-ups turn into /health and admission:
// one engine is unavailable while its worker is down; data parallel stays
// available (degraded, saying which replica is down) while one replica
// serves, and stops only when every replica gave up.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ServingHealth } from "../../src/cli/serving-health.js";
import type { WorkerExit } from "../../src/worker/types.js";

const exit: WorkerExit = { code: null, signal: "SIGKILL", message: "", summary: "model worker was killed by SIGKILL" };

describe("ServingHealth", () => {
  test("one engine: unavailable while its worker is down, stops when it gives up", () => {
    const health = new ServingHealth(1, 1);
    const down = health.apply({ kind: "down", rank: 0, exit, restartInMs: 1000 });
    assert.equal(down.state.unavailable, "the model worker died: model worker was killed by SIGKILL; restarting it in 1 s");
    assert.equal(down.state.degraded, null);
    assert.deepEqual(health.apply({ kind: "up", rank: 0, pid: 7, restarts: 1 }).state, { unavailable: null, degraded: null });
    const gone = health.apply({ kind: "gave-up", rank: 0, exit, message: "the model worker died 6 times in a row" });
    assert.equal(gone.stop, "the model worker died 6 times in a row");
  });

  test("data parallel: degraded while some replicas serve, unavailable when none does", () => {
    const health = new ServingHealth(2, 1);
    const one = health.apply({ kind: "down", rank: 0, exit, restartInMs: 1000, replica: 1 });
    assert.equal(one.state.unavailable, null);
    assert.match(one.state.degraded ?? "", /^serving on 1 of 2 replicas: the model worker of replica 1 died/);
    const both = health.apply({ kind: "down", rank: 0, exit, restartInMs: 2000, replica: 0 });
    assert.match(both.state.unavailable ?? "", /replica 1 died.*; the model worker of replica 0 died/);
    assert.equal(both.state.degraded, null);
    health.apply({ kind: "up", rank: 0, pid: 8, restarts: 1, replica: 0 });
    const back = health.apply({ kind: "up", rank: 0, pid: 9, restarts: 1, replica: 1 });
    assert.deepEqual(back.state, { unavailable: null, degraded: null });
  });

  test("data parallel: a replica that gave up is out for good; the server stops when all have", () => {
    const health = new ServingHealth(2, 1);
    const first = health.apply({ kind: "gave-up", rank: 0, exit, message: "gave up on replica 0's worker", replica: 0 });
    assert.equal(first.stop, null);
    assert.match(first.state.degraded ?? "", /serving on 1 of 2 replicas: replica 0: gave up/);
    assert.match(first.log.line, /replica 0 is out of service/);
    const second = health.apply({ kind: "gave-up", rank: 0, exit, message: "gave up on replica 1's worker", replica: 1 });
    assert.equal(second.stop, "gave up on replica 1's worker");
  });
});
