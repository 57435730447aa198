// The load generator's SSE client against small real HTTP servers that stream
// the way real ones do: one token per event with the total only on the last
// choice (transformers serve), several token ids per event with a usage-only
// closing chunk (Baton, vLLM with return_token_ids), usage on every event
// (continuous_usage_stats), and an error status.

import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { StreamClient } from "../../src/bench/openai-stream.js";

async function serve(events: (object | string)[], status = 200): Promise<{ server: Server; url: URL }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", async () => {
      if (status !== 200) {
        res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify({ detail: "Unexpected fields in the request: {'ignore_eos'}" }));
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (const event of events) {
        res.write(`data: ${typeof event === "string" ? event : JSON.stringify(event)}\n\n`);
        await sleep(15);
      }
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return { server, url: new URL(`http://127.0.0.1:${port}/`) };
}

async function send(events: (object | string)[], status = 200) {
  const { server, url } = await serve(events, status);
  const client = new StreamClient(url, 1);
  try {
    return await client.send({ url: new URL("v1/completions", url), endpoint: "/v1/completions", body: { prompt: "x" }, headers: {} });
  } finally {
    client.close();
    server.close();
  }
}

const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0);

test("one token per event, the total on the last choice (transformers serve)", async () => {
  const o = await send([
    { choices: [{ text: "a" }] },
    { choices: [{ text: "b" }] },
    { choices: [{ text: "c" }] },
    { choices: [{ text: "", finish_reason: "length" }], usage: { prompt_tokens: 5, completion_tokens: 3 } },
  ]);
  assert.equal(o.success, true, o.error);
  assert.equal(sum(o.chunkTokens), 3, "the closing usage is not counted as tokens again");
  assert.equal(o.usageOutputTokens, 3);
  assert.equal(o.usagePromptTokens, 5);
  assert.equal(o.generatedText, "abc");
});

test("several token ids per event and a usage-only closing chunk (Baton, return_token_ids)", async () => {
  const o = await send([
    { choices: [{ text: "a", token_ids: [1] }] },
    { choices: [{ text: "bc", token_ids: [2, 3] }] },
    { choices: [{ text: "d", token_ids: [4], finish_reason: "length" }] },
    { choices: [], usage: { prompt_tokens: 2, completion_tokens: 4 } },
    "[DONE]",
  ]);
  assert.equal(o.success, true, o.error);
  assert.deepEqual(o.chunkTokens, [1, 2, 1]);
  assert.equal(o.usageOutputTokens, 4);
});

test("usage on every event counts its growth (continuous_usage_stats)", async () => {
  const o = await send([
    { choices: [{ text: "" }], usage: { prompt_tokens: 2, completion_tokens: 0 } },
    { choices: [{ text: "ab" }], usage: { prompt_tokens: 2, completion_tokens: 2 } },
    { choices: [{ text: "c" }], usage: { prompt_tokens: 2, completion_tokens: 3 } },
    "[DONE]",
  ]);
  assert.equal(o.success, true, o.error);
  assert.deepEqual(o.chunkTokens, [2, 1]);
});

test("an error status fails the request with the server's message", async () => {
  const o = await send([], 422);
  assert.equal(o.success, false);
  assert.equal(o.status, 422);
  assert.equal(o.error, "HTTP 422: Unexpected fields in the request: {'ignore_eos'}");
});
