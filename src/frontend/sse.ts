// Server-sent events for streamed completions: `data: {json}\n\n` per chunk
// and `data: [DONE]\n\n` at the end, written straight to the Node response
// (the route hijacks the reply, so fastify does not serialize anything).

import type { ServerResponse } from "node:http";
import type { OpenAIErrorBody } from "./openai-error.js";

export class SseStream {
  constructor(private readonly res: ServerResponse) {
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      // Proxies such as nginx would otherwise buffer the whole stream.
      "x-accel-buffering": "no",
    });
    // Small chunks must leave at once, not wait for Nagle.
    res.socket?.setNoDelay(true);
  }

  /** False once the response ended or the client went away. */
  get open(): boolean {
    return !this.res.writableEnded && !this.res.destroyed;
  }

  send(chunk: object): void {
    if (this.open) this.res.write(`data: ${JSON.stringify(chunk)}\n\n`);
  }

  /** An error after the stream started: the status is already 200, so it travels as an event (vLLM does the same). */
  sendError(body: OpenAIErrorBody): void {
    this.send(body);
  }

  done(): void {
    if (!this.open) return;
    this.res.end("data: [DONE]\n\n");
  }
}
