// The official `openai` npm client against the demo model: chat and
// completions, streaming and not, and seeded sampling that does not depend on
// what else is in the batch.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { demoModelDir, startServer, type RunningServer } from "./harness.js";

const MODEL = "baton-demo";

describe("openai client against the demo model", () => {
  let server: RunningServer | null = null;
  let client: OpenAI;

  before(async () => {
    server = await startServer([demoModelDir, "--served-model-name", MODEL, "--max-num-batched-tokens", "64"]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    const code = await server?.stop();
    assert.equal(code, 0, "the server exits cleanly on SIGTERM");
  });

  test("models lists the served model with its max_model_len", async () => {
    const models = await client.models.list();
    const model = models.data.find((m) => m.id === MODEL) as (OpenAI.Models.Model & { max_model_len?: number }) | undefined;
    assert.ok(model, JSON.stringify(models.data));
    assert.equal(typeof model.max_model_len, "number");
  });

  test("completions: non-streamed equals streamed at temperature 0", async () => {
    const params = { model: MODEL, prompt: "The quick brown fox", max_tokens: 12, temperature: 0 };
    const full = await client.completions.create(params);
    assert.equal(full.choices.length, 1);
    assert.equal(full.choices[0]?.finish_reason, "length");
    assert.equal(full.usage?.completion_tokens, 12);
    assert.ok((full.usage?.prompt_tokens ?? 0) > 0);
    assert.equal(full.usage?.total_tokens, (full.usage?.prompt_tokens ?? 0) + 12);

    const stream = await client.completions.create({ ...params, stream: true });
    let text = "";
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(text, full.choices[0]?.text);
    assert.equal(finish, "length");
  });

  test("chat: non-streamed equals streamed, with usage in the stream when asked", async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
      { role: "system", content: "You are terse." },
      { role: "user", content: "Say something about the sea." },
    ];
    const full = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 10, temperature: 0 });
    const message = full.choices[0]?.message;
    assert.equal(message?.role, "assistant");
    assert.equal(typeof message?.content, "string");
    assert.equal(full.usage?.completion_tokens, full.choices[0]?.finish_reason === "length" ? 10 : full.usage?.completion_tokens);

    const stream = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 10,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let role: string | undefined;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      role ??= chunk.choices[0]?.delta.role;
      text += chunk.choices[0]?.delta.content ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(role, "assistant");
    assert.equal(text, message?.content);
    // cached_tokens may differ: the second request can hit the prefix cache.
    assert.deepEqual({ ...usage, prompt_tokens_details: undefined }, { ...full.usage, prompt_tokens_details: undefined });
  });

  test("a seeded request gives the same output alone and in a busy batch", async () => {
    const seeded = { model: MODEL, prompt: "Random words:", max_tokens: 16, temperature: 1.0, top_p: 0.95, seed: 1234 };
    const alone = await client.completions.create(seeded);
    const noise = Array.from({ length: 6 }, (_, i) =>
      client.completions.create({ model: MODEL, prompt: `Other prompt number ${i} `.repeat(i + 1), max_tokens: 20, temperature: 1.0 }),
    );
    const [busy] = await Promise.all([client.completions.create(seeded), ...noise]);
    assert.equal(busy.choices[0]?.text, alone.choices[0]?.text);
    const other = await client.completions.create({ ...seeded, seed: 4321 });
    assert.notEqual(other.choices[0]?.text, alone.choices[0]?.text, "a different seed should give different text");
  });

  test("health says ok while the worker is alive", async () => {
    const response = await fetch(`${server!.url}/health`);
    assert.equal(response.status, 200);
  });
});
