// KV pressure end to end: the demo model served with very few KV blocks and
// many long concurrent requests. Every request completes, greedy and seeded
// outputs equal an unpressured server's (a preempted seeded request is
// recomputed and must draw the same tokens), and the engine preempted
// (vllm:num_preemptions_total).

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { startServer, type RunningServer } from "./harness.js";
import { completeAll, metric, promptIds, summary, type Ask } from "./engine-common.js";

// 16 requests of 40..70 prompt tokens + 48 output tokens, block size 16: about
// 6-8 blocks each at the end, ~110 in all; 24 blocks force preemption. Every
// other request samples at temperature 1 with its own seed.
const ASKS: Ask[] = Array.from({ length: 16 }, (_, i) => ({
  prompt: promptIds(i, 40 + 2 * i),
  maxTokens: 48,
  ignoreEos: true,
  ...(i % 2 ? { sampling: { temperature: 1.0, top_p: 0.95, seed: 1000 + i } } : {}),
}));

describe("KV pressure through HTTP (demo model)", () => {
  const servers: RunningServer[] = [];
  after(async () => {
    for (const s of servers) await s.stop();
  });

  test("every request completes with the unpressured greedy or seeded output, and preemption happened", async () => {
    const roomy = await startServer(["--max-num-batched-tokens", "256"]);
    servers.push(roomy);
    const expected = (await completeAll(roomy.url, ASKS)).map(summary);
    assert.equal(await metric(roomy.url, "vllm:num_preemptions_total"), 0);
    await roomy.stop();

    const tight = await startServer(["--num-gpu-blocks-override", "24", "--max-num-batched-tokens", "256"]);
    servers.push(tight);
    const got = (await completeAll(tight.url, ASKS)).map(summary);
    for (let i = 0; i < ASKS.length; i++) {
      assert.equal(got[i]!.finish, "length", `request ${i}`);
      assert.equal(got[i]!.tokens.length, 48, `request ${i}`);
      assert.deepEqual(got[i], expected[i], `request ${i} differs under KV pressure`);
    }
    const preemptions = await metric(tight.url, "vllm:num_preemptions_total");
    assert.ok(preemptions !== null && preemptions > 0, `expected preemptions, /metrics says ${preemptions}`);
    // Varied output, or equality would prove little.
    assert.ok(new Set(got.flatMap((g) => g.tokens)).size > 50);
  });
});
