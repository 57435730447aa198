// Prefix caching end to end: a second request sharing a long prefix reports
// usage.prompt_tokens_details.cached_tokens > 0 and gives the same greedy
// output as a server with --no-enable-prefix-caching (which reports 0).

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { postJson, startServer, type RunningServer } from "./harness.js";
import { complete, metric, promptIds, summary } from "./engine-common.js";

const PREFIX = promptIds(7, 100);
const FIRST = [...PREFIX, ...promptIds(8, 10)];
const SECOND = [...PREFIX, ...promptIds(9, 12)];

describe("prefix caching through HTTP (demo model)", () => {
  const servers: RunningServer[] = [];
  after(async () => {
    for (const s of servers) await s.stop();
  });

  test("a shared prefix is served from the cache with the same output as caching off", async () => {
    const cachingOn = await startServer([]);
    servers.push(cachingOn);
    const a = await complete(cachingOn.url, { prompt: FIRST, maxTokens: 16 });
    assert.equal(a.usage.prompt_tokens_details?.cached_tokens, 0);
    const b = await complete(cachingOn.url, { prompt: SECOND, maxTokens: 16 });
    // 100 shared tokens, block size 16: six full blocks.
    assert.equal(b.usage.prompt_tokens_details?.cached_tokens, 96);
    assert.equal(b.usage.prompt_tokens, SECOND.length);
    // vLLM semantics: with the default fcfs policy a non-zero priority is a 400; zero is fine.
    const refused = await postJson<{ error: { param?: string } }>(`${cachingOn.url}/v1/completions`, { prompt: FIRST, max_tokens: 1, priority: 1 });
    assert.equal(refused.status, 400);
    assert.equal(refused.body.error.param, "priority");
    assert.equal((await postJson(`${cachingOn.url}/v1/completions`, { prompt: FIRST, max_tokens: 1, priority: 0 })).status, 200);
    const hits = await metric(cachingOn.url, "vllm:prefix_cache_hits_total");
    assert.ok(hits !== null && hits >= 96, `prefix cache hits ${hits}`);
    await cachingOn.stop();

    const cachingOff = await startServer(["--no-enable-prefix-caching"]);
    servers.push(cachingOff);
    const a2 = await complete(cachingOff.url, { prompt: FIRST, maxTokens: 16 });
    const b2 = await complete(cachingOff.url, { prompt: SECOND, maxTokens: 16 });
    assert.equal(b2.usage.prompt_tokens_details?.cached_tokens, 0);
    assert.deepEqual(summary(a), summary(a2));
    assert.deepEqual(summary(b), summary(b2));
    assert.equal(summary(b).tokens.length, 16);
  });
});
