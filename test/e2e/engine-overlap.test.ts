// Overlap (async) scheduling end to end: greedy outputs are identical with and
// without --no-async-scheduling, including requests that stop in the middle
// of a batch on stop token ids (picked from a first run's output), on EOS
// where the model emits it, and on max_tokens of different lengths.

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { startServer, type RunningServer } from "./harness.js";
import { completeAll, promptIds, summary, type Ask } from "./engine-common.js";

const N = 24;
const base: Ask[] = Array.from({ length: N }, (_, i) => ({ prompt: promptIds(100 + i, 8 + ((i * 7) % 50)), maxTokens: 40 }));

describe("overlap scheduling through HTTP (demo model)", () => {
  const servers: RunningServer[] = [];
  after(async () => {
    for (const s of servers) await s.stop();
  });

  test("greedy outputs are identical with and without async scheduling, with mid-batch stops", async () => {
    const on = await startServer(["--max-num-batched-tokens", "128"]);
    servers.push(on);
    // First run: learn each request's output, then pick a stop token in its middle.
    const first = (await completeAll(on.url, base)).map(summary);
    const asks: Ask[] = base.map((ask, i) => {
      const tokens = first[i]!.tokens;
      if (i % 3 === 0 && tokens.length > 10) return { ...ask, stopTokenIds: [tokens[3 + (i % 7)]!] }; // stop mid-batch
      if (i % 3 === 1) return { ...ask, maxTokens: 1 + ((i * 5) % 30) }; // length at different steps
      return ask;
    });
    const withAsync = (await completeAll(on.url, asks)).map(summary);
    await on.stop();

    const off = await startServer(["--max-num-batched-tokens", "128", "--no-async-scheduling"]);
    servers.push(off);
    const withoutAsync = (await completeAll(off.url, asks)).map(summary);
    assert.deepEqual(withAsync, withoutAsync);
    const stopped = withAsync.filter((s, i) => asks[i]!.stopTokenIds !== undefined && s.finish === "stop");
    assert.ok(stopped.length >= 5, `${stopped.length} requests stopped on a stop token id`);
    assert.ok(withAsync.some((s, i) => s.finish === "length" && s.tokens.length === asks[i]!.maxTokens && s.tokens.length < 40));
    for (const [i, s] of withAsync.entries()) {
      const stop = asks[i]!.stopTokenIds?.[0];
      if (s.finish === "stop" && stop !== undefined) assert.equal(s.tokens.at(-1), stop, `request ${i} ends on its stop token`);
    }
  });
});
