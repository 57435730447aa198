// Responses input items as the chat messages the template renders: string
// and list inputs normalized, function calls joined to their assistant turn,
// tool outputs checked against earlier calls, reasoning carried to the turn
// it belongs to; and the chat route's errors renamed to Responses parameters.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ApiError, badRequest } from "../../../src/frontend/openai-error.js";
import { responsesError } from "../../../src/frontend/responses/chat-request.js";
import { conversationMessages } from "../../../src/frontend/responses/input-messages.js";
import { parseResponsesRequest } from "../../../src/frontend/responses/request.js";

function messagesOf(body: Record<string, unknown>): unknown[] {
  const req = parseResponsesRequest(body);
  return conversationMessages(
    req.instructions,
    req.input.map((item, i) => ({ item, param: `input[${i}]` })),
  ).messages;
}

function fails(body: Record<string, unknown>, param: string, message: RegExp): void {
  assert.throws(
    () => messagesOf(body),
    (error: unknown) => error instanceof ApiError && error.status === 400 && error.param === param && message.test(error.message),
    JSON.stringify(body),
  );
}

describe("Responses input items", () => {
  test("a string input is one user message; instructions come first as a system message", () => {
    const req = parseResponsesRequest({ input: "Hi", instructions: "Be kind." });
    assert.equal(req.input.length, 1);
    const [item] = req.input;
    assert.ok(item?.type === "message" && /^msg_[0-9a-f]{48}$/.test(item.id));
    assert.deepEqual(item.content, [{ type: "input_text", text: "Hi" }]);
    assert.deepEqual(messagesOf({ input: "Hi", instructions: "Be kind." }), [
      { role: "system", content: "Be kind." },
      { role: "user", content: "Hi" },
    ]);
  });

  test("messages: text parts join, images become image_url parts, developer is system, assistant text is output_text", () => {
    const input = [
      { role: "developer", content: "Rules." },
      { type: "message", role: "user", content: [{ type: "input_text", text: "Look:" }, { type: "input_image", image_url: "data:image/png;base64,AAAA" }] },
      { role: "assistant", content: "Seen." },
      { role: "user", content: [{ type: "input_text", text: "a" }, { type: "input_text", text: "b" }] },
    ];
    assert.deepEqual(messagesOf({ input }), [
      { role: "system", content: "Rules." },
      { role: "user", content: [{ type: "text", text: "Look:" }, { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } }] },
      { role: "assistant", content: "Seen." },
      { role: "user", content: "a\nb" },
    ]);
    const [, , assistant] = parseResponsesRequest({ input }).input;
    assert.deepEqual(assistant?.type === "message" && assistant.content, [{ type: "output_text", text: "Seen.", annotations: [], logprobs: [] }]);
  });

  test("function calls join the assistant turn before them; their outputs are tool messages", () => {
    const input = [
      { role: "user", content: "Weather in Paris and Oslo?" },
      { role: "assistant", content: "Checking." },
      { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city": "Paris"}' },
      { type: "function_call", call_id: "call_2", name: "get_weather", arguments: '{"city": "Oslo"}' },
      { type: "function_call_output", call_id: "call_1", output: "21" },
      { type: "function_call_output", call_id: "call_2", output: [{ type: "input_text", text: "3" }] },
      { type: "function_call", call_id: "call_3", name: "get_time", arguments: "{}" },
    ];
    assert.deepEqual(messagesOf({ input }), [
      { role: "user", content: "Weather in Paris and Oslo?" },
      {
        role: "assistant",
        content: "Checking.",
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
          { id: "call_2", type: "function", function: { name: "get_weather", arguments: '{"city": "Oslo"}' } },
        ],
      },
      { role: "tool", tool_call_id: "call_1", content: "21" },
      { role: "tool", tool_call_id: "call_2", content: "3" },
      // After tool results, a call opens a new assistant turn.
      { role: "assistant", content: "", tool_calls: [{ id: "call_3", type: "function", function: { name: "get_time", arguments: "{}" } }] },
    ]);
  });

  test("a reasoning item is the reasoning_content of the assistant turn that follows it", () => {
    const input = [
      { role: "user", content: "2+2?" },
      { type: "reasoning", id: "rs_1", summary: [], content: [{ type: "reasoning_text", text: "Add them." }] },
      { type: "function_call", call_id: "call_1", name: "add", arguments: "[2, 2]" },
      { type: "function_call_output", call_id: "call_1", output: "4" },
      { type: "reasoning", id: "rs_2", summary: [{ type: "summary_text", text: "Done." }] },
      { role: "assistant", content: "4" },
      { type: "reasoning", id: "rs_3", summary: [], content: [{ type: "reasoning_text", text: "dangling" }] },
      { role: "user", content: "thanks" },
    ];
    assert.deepEqual(messagesOf({ input }), [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "", reasoning_content: "Add them.", tool_calls: [{ id: "call_1", type: "function", function: { name: "add", arguments: "[2, 2]" } }] },
      { role: "tool", tool_call_id: "call_1", content: "4" },
      { role: "assistant", content: "4", reasoning_content: "Done." },
      { role: "user", content: "thanks" },
    ]);
  });

  test("bad items are 400s naming them", () => {
    fails({ input: [{ type: "function_call_output", call_id: "call_9", output: "x" }] }, "input[0].call_id", /^No tool call found for function call output with call_id call_9\.$/);
    // The call must come before its output.
    fails(
      {
        input: [
          { type: "function_call_output", call_id: "call_1", output: "x" },
          { type: "function_call", call_id: "call_1", name: "f", arguments: "{}" },
        ],
      },
      "input[0].call_id",
      /call_1/,
    );
    fails({ input: [{ type: "computer_call_output", call_id: "c" }] }, "input[0].type", /unsupported input item type "computer_call_output"/);
    fails({ input: [{ content: "no role or type" }] }, "input[0].type", /required/);
    fails({ input: [{ role: "tool", content: "x" }] }, "input[0].role", /user, assistant, system, developer/);
    fails({ input: [{ role: "user", content: [{ type: "input_file", file_id: "f" }] }] }, "input[0].content[0].type", /input_file/);
    fails({ input: [{ role: "user", content: [{ type: "input_image", file_id: "f" }] }] }, "input[0].content[0].image_url", /file_id/);
    fails({ input: [{ type: "function_call", call_id: "c", name: "f", arguments: { a: 1 } }] }, "input[0].arguments", /string/);
    fails({ input: 42 }, "input", /a string or a list/);
    fails({ input: "x", tool_choice: { type: "allowed_tools" } }, "tool_choice", /tool_choice/);
    fails({ input: "x", tools: [{ type: "file_search" }] }, "tools[0].type", /"file_search"/);
    fails({ input: "x", text: { format: { type: "grammar" } } }, "text.format.type", /grammar/);
    fails({ input: "x", background: true, store: false }, "background", /store/);
    fails({ input: "x", truncation: "auto" }, "truncation", /auto/);
    fails({ input: "x", conversation: "conv_1" }, "conversation", /previous_response_id/);
    fails({ input: "x", metadata: { k: 1 } }, "metadata.k", /string/);
  });

  test("the chat route's errors name the Responses parameters", () => {
    const origins = ["instructions", "previous_response_id", "input[0]", "input[2]"];
    const renamed = (error: ApiError): ApiError => responsesError(error, origins) as ApiError;
    const cases: [ApiError, string, string][] = [
      [badRequest("messages[3].content[1]: this model does not take images", "messages[3].content[1]"), "input[2].content[1]", "input[2].content[1]: this model does not take images"],
      [badRequest("tools[0].function.name must be 1 to 64 letters", "tools[0].function.name"), "tools[0].name", "tools[0].name must be 1 to 64 letters"],
      [badRequest("response_format.json_schema.schema is required", "response_format.json_schema.schema"), "text.format.schema", "text.format.schema is required"],
      [badRequest("too long; reduce max_completion_tokens", "max_completion_tokens"), "max_output_tokens", "too long; reduce max_output_tokens"],
      [badRequest('tool_choice names function "x"', "tool_choice.function.name"), "tool_choice.name", 'tool_choice names function "x"'],
      [badRequest("messages must not be empty", "messages"), "input", "input must not be empty"],
    ];
    for (const [error, param, message] of cases) {
      const out = renamed(error);
      assert.equal(out.param, param);
      assert.equal(out.message, message);
      assert.equal(out.status, 400);
    }
    const other = new Error("not an API error");
    assert.equal(responsesError(other, origins), other);
  });
});
