// `baton bench soak`: its flags, and a short real run (the demo model, the
// real CLI, real faults) that must end clean: every request ended with its
// tokens or an expected error, faults were survived, nothing leaked.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { runSoak } from "../../src/bench/soak.js";
import { UsageError } from "../../src/cli/args.js";
import { parseBenchArgs } from "../../src/cli/bench.js";
import { removeDir, repoRoot } from "../e2e/harness.js";
import { demoModelCopy } from "../reliability/helpers.js";

const demo = join(repoRoot, "models", "demo");

describe("bench soak", () => {
  test("flags", () => {
    const args = parseBenchArgs(["soak", "--minutes", "0.5", "--concurrency", "4", "--fault-interval", "0", "--step-timeout", "3", "--seed", "7", "--json"]);
    assert.deepEqual(args, { kind: "soak", help: false, modelDir: null, minutes: 0.5, concurrency: 4, faultIntervalS: 0, stepTimeoutS: 3, seed: 7, json: true });
    const defaults = parseBenchArgs(["soak", "/models/x"]);
    assert.deepEqual(defaults, { kind: "soak", help: false, modelDir: "/models/x", minutes: 1, concurrency: 16, faultIntervalS: 20, stepTimeoutS: 5, seed: 0, json: false });
    assert.throws(() => parseBenchArgs(["soak", "--minutes", "0"]), UsageError);
    assert.throws(() => parseBenchArgs(["soak", "--concurrency", "0"]), UsageError);
    assert.throws(() => parseBenchArgs(["soak", "--seed", "1.5"]), UsageError);
    assert.throws(() => parseBenchArgs(["soak", "--bogus"]), UsageError);
  });

  test("a short run with faults ends clean", { skip: !existsSync(join(demo, "config.json")) && "no demo model (npm run setup)" }, async () => {
    const previous = process.env.OMP_NUM_THREADS;
    // The test machine's cores are shared: one torch thread per worker.
    process.env.OMP_NUM_THREADS = "1";
    // Its own copy of the model: the soak tells its workers (and orphans) by the model's path, and other suites run demo workers too.
    const modelDir = demoModelCopy("baton-soak-");
    try {
      const result = await runSoak({ repoRoot, modelDir, minutes: 0.2, concurrency: 4, faultIntervalS: 3, stepTimeoutS: 2, seed: 1, log: () => {} });
      assert.deepEqual(result.problems, []);
      assert.ok(result.faults.sigkill + result.faults.sigstop >= 1, JSON.stringify(result.faults));
      assert.ok(result.restarts >= result.faults.sigkill + result.faults.sigstop);
      assert.ok(result.requests.served > 0);
      assert.equal(result.end.freeKvBlocks, result.end.kvBlocks);
    } finally {
      removeDir(modelDir);
      if (previous === undefined) delete process.env.OMP_NUM_THREADS;
      else process.env.OMP_NUM_THREADS = previous;
    }
  });
});
