// The Responses SSE writer: `event:` and `data:` lines per event, no [DONE];
// with hold, the opening events wait for the first output, and a failure
// before it is a plain JSON error with its status instead of a 200 stream.

import assert from "node:assert/strict";
import type { ServerResponse } from "node:http";
import { describe, test } from "node:test";
import { badRequest, type ApiError } from "../../../src/frontend/openai-error.js";
import { ResponseEventStream } from "../../../src/frontend/responses/event-stream.js";

class FakeResponse {
  status: number | null = null;
  headers: Record<string, string> = {};
  body = "";
  writableEnded = false;
  destroyed = false;
  get headersSent(): boolean {
    return this.status !== null;
  }
  writeHead(status: number, headers: Record<string, string>): this {
    this.status = status;
    this.headers = headers;
    return this;
  }
  write(chunk: string): boolean {
    this.body += chunk;
    return true;
  }
  end(chunk?: string): this {
    if (chunk !== undefined) this.body += chunk;
    this.writableEnded = true;
    return this;
  }
}

const event = (type: string, sequence_number: number) => ({ type, sequence_number });

function stream(hold: boolean, failure: ApiError | null = null): { res: FakeResponse; writer: ResponseEventStream } {
  const res = new FakeResponse();
  return { res, writer: new ResponseEventStream(res as unknown as ServerResponse, () => failure, hold) };
}

describe("ResponseEventStream", () => {
  test("each event as an event line and a data line; the stream ends without [DONE]", () => {
    const { res, writer } = stream(false);
    writer.event(event("response.created", 0));
    assert.equal(res.status, 200);
    assert.equal(res.headers["content-type"], "text/event-stream; charset=utf-8");
    writer.event(event("response.completed", 1));
    writer.end();
    assert.equal(
      res.body,
      'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n' +
        'event: response.completed\ndata: {"type":"response.completed","sequence_number":1}\n\n',
    );
    assert.ok(res.writableEnded);
  });

  test("held: nothing is sent until the first output, then the opening events go first", () => {
    const { res, writer } = stream(true);
    writer.event(event("response.created", 0));
    writer.event(event("response.in_progress", 1));
    assert.equal(res.status, null);
    writer.event(event("response.output_item.added", 2));
    assert.deepEqual(
      [...res.body.matchAll(/^event: (.*)$/gm)].map((m) => m[1]),
      ["response.created", "response.in_progress", "response.output_item.added"],
    );
  });

  test("held: a failure before any output is a plain error response with its status", () => {
    const { res, writer } = stream(true, badRequest("input[0].content[1]: the image does not decode", "input[0].content[1]"));
    writer.event(event("response.created", 0));
    writer.event(event("error", 1));
    writer.event(event("response.failed", 2));
    writer.end();
    assert.equal(res.status, 400);
    assert.equal(res.headers["content-type"], "application/json; charset=utf-8");
    assert.deepEqual(JSON.parse(res.body), {
      error: { message: "input[0].content[1]: the image does not decode", type: "invalid_request_error", param: "input[0].content[1]", code: null },
    });
  });
});
