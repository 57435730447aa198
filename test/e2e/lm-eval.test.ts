// EleutherAI's lm-evaluation-harness against Baton: bench/lm_eval_compare.py
// runs a generated multiple-choice task through lm-eval's local-completions
// backend (echo + logprobs over /v1/completions, several prompts per request)
// and its hf backend (transformers in process) on the same random-weight
// model; per-sample loglikelihoods must agree within 1e-3 and the accuracy
// must be the same. The script installs lm-eval on first use
// (python/requirements-eval.txt).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { makeRandomModel, python, removeDir, repoRoot, startServer, tempDir, type RunningServer } from "./harness.js";

interface Comparison {
  requests: number;
  max_abs_diff: number;
  acc_hf: number;
  acc_baton: number;
  is_greedy_mismatches: number;
  same: boolean;
}

describe("lm-evaluation-harness: local-completions against Baton equals the hf backend", () => {
  let dir: string;
  let server: RunningServer;

  before(async () => {
    dir = tempDir("lm-eval");
    makeRandomModel("llama", join(dir, "model"), 0);
    server = await startServer([join(dir, "model"), "--dtype", "float32", "--served-model-name", "lm-eval-model"]);
  });

  after(async () => {
    await server?.stop();
    removeDir(dir);
  });

  test("per-sample loglikelihoods within 1e-3, the same accuracy", () => {
    const out = join(dir, "comparison.json");
    const result = spawnSync(
      python,
      [join(repoRoot, "bench", "lm_eval_compare.py"), "--model-dir", join(dir, "model"), "--base-url", server.url, "--num-docs", "12", "--out", out],
      { cwd: repoRoot, encoding: "utf8", timeout: 600_000 },
    );
    assert.equal(result.status, 0, `${result.stdout}\n${result.stderr.slice(-4000)}`);
    const comparison = JSON.parse(readFileSync(out, "utf8")) as Comparison;
    assert.ok(comparison.requests >= 24, `${comparison.requests} loglikelihood requests`);
    assert.ok(comparison.max_abs_diff <= 1e-3, `max diff ${comparison.max_abs_diff}`);
    assert.equal(comparison.acc_baton, comparison.acc_hf);
    assert.equal(comparison.is_greedy_mismatches, 0);
    assert.ok(comparison.same);
  });
});
