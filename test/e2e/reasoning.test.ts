// --reasoning-parser through the real server and the official openai client:
// reasoning_content in the message and in streamed deltas, the same text
// either way, enable_thinking passed to the chat template, include_reasoning.
// The demo model's random weights never close a think block, so with
// deepseek_r1 (which starts inside one) its whole answer is reasoning.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { demoModelDir, startServer, type RunningServer } from "./harness.js";

const MODEL = "baton-demo";

type WithReasoning<T> = T & { reasoning_content?: string | null };

describe("reasoning parser (deepseek_r1) against the demo model", () => {
  let server: RunningServer | null = null;
  let client: OpenAI;

  before(async () => {
    server = await startServer([demoModelDir, "--served-model-name", MODEL, "--reasoning-parser", "deepseek_r1"]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    assert.equal(await server?.stop(), 0);
  });

  const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Why is the sky blue?" }];

  test("an unfinished think block is reasoning_content; the stream carries the same text in reasoning deltas", async () => {
    const full = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0 });
    const message = full.choices[0]?.message as WithReasoning<OpenAI.Chat.ChatCompletionMessage>;
    assert.equal(full.choices[0]?.finish_reason, "length");
    assert.equal(message.content, null);
    assert.ok(typeof message.reasoning_content === "string" && message.reasoning_content.length > 0, JSON.stringify(message));

    const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0, stream: true });
    let reasoning = "";
    let content = "";
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta as WithReasoning<OpenAI.Chat.ChatCompletionChunk.Choice.Delta> | undefined;
      reasoning += delta?.reasoning_content ?? "";
      content += delta?.content ?? "";
    }
    assert.equal(reasoning, message.reasoning_content);
    assert.equal(content, "");
  });

  test("enable_thinking false: the template closes the think block, the answer is content", async () => {
    const body = { model: MODEL, messages, max_tokens: 12, temperature: 0, chat_template_kwargs: { enable_thinking: false } };
    const full = await client.chat.completions.create(body as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const message = full.choices[0]?.message as WithReasoning<OpenAI.Chat.ChatCompletionMessage>;
    assert.equal(message.reasoning_content, null);
    assert.ok(typeof message.content === "string" && message.content.length > 0, JSON.stringify(message));
  });

  test("structured output applies to the answer: with thinking off, the content is the schema's JSON", async () => {
    const schema = { type: "object", properties: { answer: { type: "string", maxLength: 8 } }, required: ["answer"], additionalProperties: false };
    const body = {
      model: MODEL,
      messages,
      max_tokens: 100,
      seed: 2,
      chat_template_kwargs: { enable_thinking: false },
      response_format: { type: "json_schema", json_schema: { name: "a", schema } },
    };
    const full = await client.chat.completions.create(body as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const message = full.choices[0]?.message as WithReasoning<OpenAI.Chat.ChatCompletionMessage>;
    assert.equal(message.reasoning_content, null);
    const value = JSON.parse(message.content ?? "") as { answer: unknown };
    assert.equal(typeof value.answer, "string");
  });

  test("include_reasoning false drops the reasoning", async () => {
    const body = { model: MODEL, messages, max_tokens: 6, temperature: 0, include_reasoning: false };
    const full = await client.chat.completions.create(body as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const message = full.choices[0]?.message as WithReasoning<OpenAI.Chat.ChatCompletionMessage>;
    assert.equal(message.reasoning_content, null);
    assert.equal(full.usage?.completion_tokens, 6);
  });
});
