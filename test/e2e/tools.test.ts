// Tool calling through the real server: tools and an earlier turn's tool
// calls and tool results rendered by the model's chat template (checked on
// the prompt the server actually ran), and tool_choice "auto" parsing with
// --enable-auto-tool-choice --tool-call-parser hermes, streamed and not.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { demoModelDir, postJson, startServer, type RunningServer } from "./harness.js";

const MODEL = "baton-demo";

const TOOLS: OpenAI.Chat.ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
    },
  },
];

describe("tools against the demo model (hermes parser)", () => {
  let server: RunningServer | null = null;
  let client: OpenAI;

  before(async () => {
    server = await startServer([demoModelDir, "--served-model-name", MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    assert.equal(await server?.stop(), 0);
  });

  test("a tool result round trip: the next turn's prompt holds the tools, the call and its result", async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
      { role: "user", content: "Weather in Paris?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }],
      },
      { role: "tool", tool_call_id: "call_1", content: '{"temperature_c": 21}' },
    ];
    const body = { model: MODEL, messages, tools: TOOLS, max_tokens: 4, temperature: 0, return_token_ids: true };
    const { status, body: response } = await postJson<{ prompt_token_ids: number[]; choices: { message: { content: string | null } }[] }>(
      `${server?.url}/v1/chat/completions`,
      body,
    );
    assert.equal(status, 200, JSON.stringify(response));
    const { body: decoded } = await postJson<{ prompt: string }>(`${server?.url}/detokenize`, { model: MODEL, tokens: response.prompt_token_ids });
    const prompt = decoded.prompt;
    // Qwen3's template: the tool list in the system turn, the call as JSON with its arguments object, the result as a tool_response.
    assert.match(prompt, /<tools>\n\{"type": "function", "function": \{"name": "get_weather"/);
    assert.ok(prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'), prompt);
    assert.ok(prompt.includes('<tool_response>\n{"temperature_c": 21}\n</tool_response>'), prompt);
    assert.ok(prompt.endsWith("<|im_start|>assistant\n"), prompt);
  });

  test("tool_choice auto: the answer (no call from random weights) is the same streamed and not", async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in Oslo?" }];
    const full = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, max_tokens: 10, temperature: 0 });
    const choice = full.choices[0];
    assert.equal(choice?.finish_reason, "length");
    const stream = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, max_tokens: 10, temperature: 0, stream: true });
    let content = "";
    const calls: string[] = [];
    for await (const chunk of stream) {
      content += chunk.choices[0]?.delta.content ?? "";
      for (const call of chunk.choices[0]?.delta.tool_calls ?? []) calls.push(call.function?.name ?? "");
    }
    assert.equal(content, choice?.message.content ?? "");
    assert.deepEqual(calls, (choice?.message.tool_calls ?? []).map((c) => (c.type === "function" ? c.function.name : "")));
  });

  test("tool_choice auto: a call the model writes in hermes format (forced here by a regex) is parsed, streamed and not", async () => {
    const body = {
      model: MODEL,
      messages: [{ role: "user" as const, content: "Weather in Oslo?" }],
      tools: TOOLS,
      max_tokens: 80,
      seed: 3,
      structured_outputs: { regex: 'Checking\\.\\n<tool_call>\\n\\{"name": "get_weather", "arguments": \\{"city": "(Paris|Oslo|Lima)"\\}\\}\\n</tool_call>' },
    };
    const full = await client.chat.completions.create(body as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    const choice = full.choices[0];
    assert.equal(choice?.finish_reason, "tool_calls");
    assert.equal(choice?.message.content, "Checking.\n");
    const call = choice?.message.tool_calls?.[0];
    assert.ok(call?.type === "function" && call.function.name === "get_weather", JSON.stringify(choice?.message));
    assert.match(call.function.arguments, /^\{"city": "(Paris|Oslo|Lima)"\}$/);

    const stream = await client.chat.completions.create({ ...(body as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming), stream: true });
    let content = "";
    let args = "";
    const headers: string[] = [];
    let finish: string | null = null;
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta;
      content += delta?.content ?? "";
      for (const d of delta?.tool_calls ?? []) {
        if (d.id !== undefined) headers.push(`${d.index}:${d.type}:${d.function?.name}:${d.function?.arguments}`);
        else args += d.function?.arguments ?? "";
      }
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(content, "Checking.\n");
    assert.deepEqual(headers, ["0:function:get_weather:"]);
    assert.equal(args, call.function.arguments);
    assert.equal(finish, "tool_calls");
  });

  test("a named tool_choice whose function is not offered is a 400", async () => {
    const { status, body } = await postJson<{ error: { message: string; param: string } }>(`${server?.url}/v1/chat/completions`, {
      model: MODEL,
      messages: [{ role: "user", content: "hi" }],
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_time" } },
    });
    assert.equal(status, 400);
    assert.equal(body.error.param, "tool_choice.function.name");
  });
});
