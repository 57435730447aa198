// A streamed response on the wire: each event as `event: <type>` and
// `data: <json>` (OpenAI's framing for the Responses API; no [DONE] line, the
// stream ends after the last event). Headers are those of the chat streams
// (sse.ts). With `hold`, the opening events wait for the first output: a
// request whose input the worker refuses (an image that does not decode) then
// gets a plain 4xx instead of a 200 stream that fails.

import type { ServerResponse } from "node:http";
import type { ApiError } from "../openai-error.js";
import type { ResponseEvent, RunListener } from "./run.js";

const OPENING = new Set(["response.created", "response.in_progress", "response.queued"]);

export class ResponseEventStream implements RunListener {
  private opened = false;
  private refused = false;
  private held: ResponseEvent[] | null;

  constructor(
    private readonly res: ServerResponse,
    /** The run's error, once it failed. */
    private readonly failure: () => ApiError | null,
    hold: boolean,
  ) {
    this.held = hold ? [] : null;
  }

  event(event: ResponseEvent): void {
    if (this.refused) return;
    if (this.held !== null) {
      if (OPENING.has(event.type)) {
        this.held.push(event);
        return;
      }
      const error = this.failure();
      if (error !== null && !this.res.headersSent) {
        this.refused = true;
        this.res.writeHead(error.status, { "content-type": "application/json; charset=utf-8" });
        this.res.end(JSON.stringify(error.toBody()));
        return;
      }
      this.flush();
    }
    this.write(event);
  }

  end(): void {
    if (this.refused) return;
    this.flush();
    this.open();
    if (!this.res.writableEnded) this.res.end();
  }

  private flush(): void {
    const held = this.held;
    this.held = null;
    if (held !== null) for (const event of held) this.write(event);
  }

  private open(): void {
    if (this.opened) return;
    this.opened = true;
    this.res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      // Proxies such as nginx would otherwise buffer the whole stream.
      "x-accel-buffering": "no",
    });
    // Small events must leave at once, not wait for Nagle (an injected test request's socket has no such knob).
    this.res.socket?.setNoDelay?.(true);
  }

  private write(event: ResponseEvent): void {
    this.open();
    if (this.res.writableEnded || this.res.destroyed) return;
    this.res.write(`event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`);
  }
}
