// `baton bench router`: its flags and its workload (the run itself starts two
// data-parallel servers; test/e2e/data-parallel.test.ts serves the same kind
// of workload under both routers).

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { parseBenchArgs } from "../../src/cli/bench.js";
import { sharedPrefixPrompts } from "../../src/bench/router-bench.js";

describe("baton bench router", () => {
  test("flags and defaults", () => {
    const args = parseBenchArgs(["router", "--groups", "4", "--serve-arg=--no-engine-thread", "--serve-arg=--max-num-seqs=8"]);
    assert.equal(args.kind, "router");
    if (args.kind !== "router") return;
    assert.equal(args.groups, 4);
    assert.equal(args.requestsPerGroup, 8);
    assert.equal(args.dataParallelSize, 2);
    assert.equal(args.kvBlocks, 400);
    assert.equal(args.rounds, 2);
    assert.deepEqual(args.serveArgs, ["--no-engine-thread", "--max-num-seqs=8"]);
    assert.throws(() => parseBenchArgs(["router", "--data-parallel-size", "1"]), /at least 2/);
    assert.throws(() => parseBenchArgs(["router", "--groups", "0"]), /--groups: expected a positive integer/);
  });

  test("the workload: groups share their system prompt, interleaved, the same for the same seed", () => {
    const options = { groups: 3, requestsPerGroup: 4, systemTokens: 20, questionTokens: 5, seed: 7 };
    const prompts = sharedPrefixPrompts(options);
    assert.equal(prompts.length, 12);
    for (const p of prompts) assert.equal(p.length, 25);
    const systems = new Map<string, number>();
    for (const p of prompts) systems.set(p.slice(0, 20).join(","), (systems.get(p.slice(0, 20).join(",")) ?? 0) + 1);
    assert.deepEqual([...systems.values()], [4, 4, 4]);
    // Interleaved: not all of one group first.
    const firstGroup = prompts.slice(0, 4).map((p) => p.slice(0, 20).join(","));
    assert.ok(new Set(firstGroup).size > 1);
    assert.deepEqual(sharedPrefixPrompts(options), prompts);
    assert.notDeepEqual(sharedPrefixPrompts({ ...options, seed: 8 }), prompts);
  });
});
