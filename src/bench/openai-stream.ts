// One streamed OpenAI request of the load generator: POSTs the body, reads the
// SSE stream as it arrives and records when tokens came. Tokens per event come
// from the event's token_ids (servers that return them), else from the growth
// of a per-event usage (continuous_usage_stats), else one per event with text;
// events that arrive in the same read of the socket count as one delivery (a
// server that flushes several tokens at once shows as a gap shared by them,
// not as zero-length gaps). The request's output count is the server's closing
// usage when it sends one.

import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { performance } from "node:perf_hooks";

export type Endpoint = "/v1/completions" | "/v1/chat/completions";
export const ENDPOINTS: readonly Endpoint[] = ["/v1/completions", "/v1/chat/completions"];

export interface StreamRequest {
  url: URL;
  endpoint: Endpoint;
  body: Record<string, unknown>;
  headers: Record<string, string>;
}

/** What one request saw; times are performance.now() milliseconds. */
export interface RequestOutcome {
  success: boolean;
  /** Why it failed ("" on success). */
  error: string;
  startMs: number;
  /** Arrival time of each read of the stream that carried tokens, and how many it carried (all its events). */
  chunkTimesMs: number[];
  chunkTokens: number[];
  /** usage.prompt_tokens / completion_tokens of the closing usage, when the server sent it. */
  usagePromptTokens: number | null;
  usageOutputTokens: number | null;
  endMs: number;
  generatedText: string;
  /** HTTP status (0 when no response came). */
  status: number;
}

export class StreamClient {
  private readonly agent: HttpAgent;

  constructor(
    readonly baseUrl: URL,
    maxSockets: number,
  ) {
    const options = { keepAlive: true, maxSockets };
    this.agent = baseUrl.protocol === "https:" ? new HttpsAgent(options) : new HttpAgent(options);
  }

  close(): void {
    this.agent.destroy();
  }

  /** Sends one request and resolves when its stream ends (never rejects: failures are outcomes). */
  send(req: StreamRequest): Promise<RequestOutcome> {
    const outcome: RequestOutcome = {
      success: false,
      error: "",
      startMs: performance.now(),
      chunkTimesMs: [],
      chunkTokens: [],
      usagePromptTokens: null,
      usageOutputTokens: null,
      endMs: 0,
      generatedText: "",
      status: 0,
    };
    const payload = JSON.stringify(req.body);
    const send = req.url.protocol === "https:" ? httpsRequest : httpRequest;
    return new Promise<RequestOutcome>((resolve) => {
      let settled = false;
      const finish = (error: string): void => {
        if (settled) return;
        settled = true;
        outcome.endMs = performance.now();
        outcome.error = error;
        outcome.success = error === "";
        resolve(outcome);
      };
      const clientRequest = send(
        req.url,
        {
          method: "POST",
          agent: this.agent,
          headers: { "content-type": "application/json", accept: "text/event-stream", "content-length": Buffer.byteLength(payload), ...req.headers },
        },
        (res) => {
          outcome.status = res.statusCode ?? 0;
          if (outcome.status !== 200) {
            readErrorBody(res, (text) => finish(`HTTP ${outcome.status}: ${text}`));
            return;
          }
          const reader = new SseReader(req.endpoint, outcome);
          res.setEncoding("utf8");
          res.on("data", (chunk: string) => {
            const error = reader.push(chunk, performance.now());
            if (error !== null) {
              finish(error);
              res.destroy();
            }
          });
          res.on("end", () => finish(reader.endError()));
          res.on("error", (error) => finish(error.message));
        },
      );
      clientRequest.on("error", (error) => finish(describeNetworkError(error)));
      clientRequest.end(payload);
    });
  }
}

function readErrorBody(res: IncomingMessage, done: (text: string) => void): void {
  let text = "";
  res.setEncoding("utf8");
  res.on("data", (chunk: string) => {
    if (text.length < 2000) text += chunk;
  });
  res.on("end", () => done(errorMessageOf(text)));
  res.on("error", () => done(errorMessageOf(text)));
}

/** The message of an OpenAI-style error body, else the body itself, on one line. */
function errorMessageOf(text: string): string {
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } | string; detail?: unknown; message?: unknown };
    const message = typeof body.error === "object" ? body.error.message : (body.error ?? body.detail ?? body.message);
    if (message !== undefined) return (typeof message === "string" ? message : JSON.stringify(message)).replace(/\s+/g, " ").slice(0, 300);
  } catch {
    // Not JSON: fall through.
  }
  return text.replace(/\s+/g, " ").trim().slice(0, 300);
}

export function describeNetworkError(error: Error): string {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === "ECONNREFUSED") return "connection refused";
  if (code === "ENOTFOUND") return "host not found";
  if (code === "ECONNRESET") return "connection reset by the server";
  if (code === "ETIMEDOUT") return "connection timed out";
  return code ? `${code}: ${error.message}` : error.message;
}

interface StreamChoice {
  text?: string | null;
  delta?: { content?: string | null; reasoning_content?: string | null };
  token_ids?: number[] | null;
}
interface StreamChunk {
  choices?: StreamChoice[];
  usage?: { prompt_tokens?: number; completion_tokens?: number } | null;
  error?: unknown;
}

/** Splits the SSE byte stream into events and records their tokens on the outcome. */
class SseReader {
  private buffer = "";
  private usageSoFar = 0;
  /** Whether usage came on the stream's first token event (continuous_usage_stats), not only at its close. */
  private continuousUsage: boolean | null = null;

  constructor(
    private readonly endpoint: Endpoint,
    private readonly outcome: RequestOutcome,
  ) {}

  /** Feeds received text; returns an error message when the stream reports one. */
  push(text: string, atMs: number): string | null {
    this.buffer += text;
    for (;;) {
      const end = this.buffer.search(/\r?\n\r?\n/);
      if (end < 0) return null;
      const event = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const error = this.onEvent(event, atMs);
      if (error !== null) return error;
    }
  }

  endError(): string {
    if (this.buffer.trim() !== "") {
      const error = this.onEvent(this.buffer, performance.now());
      this.buffer = "";
      if (error !== null) return error;
    }
    if (this.outcome.chunkTimesMs.length === 0) return "the stream ended without any token";
    return "";
  }

  private onEvent(event: string, atMs: number): string | null {
    const data = event
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).trimStart())
      .join("\n");
    if (data === "") return null;
    if (data === "[DONE]") return null;
    let chunk: StreamChunk;
    try {
      chunk = JSON.parse(data) as StreamChunk;
    } catch {
      return `the server sent an SSE event that is not JSON: ${data.slice(0, 100)}`;
    }
    if (chunk.error !== undefined) return `the server reported an error mid-stream: ${JSON.stringify(chunk.error).slice(0, 300)}`;
    let usageGrowth: number | null = null;
    const choice = chunk.choices?.[0];
    if (chunk.usage) {
      if (typeof chunk.usage.prompt_tokens === "number") this.outcome.usagePromptTokens = chunk.usage.prompt_tokens;
      if (typeof chunk.usage.completion_tokens === "number") {
        // A usage first seen after tokens arrived is the closing total (transformers puts it on the last choice), not per-chunk growth.
        this.continuousUsage ??= this.outcome.chunkTimesMs.length === 0 && choice !== undefined;
        if (this.continuousUsage) usageGrowth = chunk.usage.completion_tokens - this.usageSoFar;
        this.usageSoFar = chunk.usage.completion_tokens;
        this.outcome.usageOutputTokens = chunk.usage.completion_tokens;
      }
    }
    if (choice === undefined) return null;
    const text = (this.endpoint === "/v1/completions" ? choice.text : (choice.delta?.content ?? choice.delta?.reasoning_content)) ?? "";
    this.outcome.generatedText += text;
    let tokens: number;
    if (Array.isArray(choice.token_ids)) tokens = choice.token_ids.length;
    else if (usageGrowth !== null) tokens = usageGrowth;
    else tokens = text === "" ? 0 : 1;
    if (tokens > 0) {
      // Events that arrived in one read are one delivery: their tokens share the gap before it.
      const last = this.outcome.chunkTimesMs.length - 1;
      if (last >= 0 && this.outcome.chunkTimesMs[last] === atMs) this.outcome.chunkTokens[last] = (this.outcome.chunkTokens[last] as number) + tokens;
      else {
        this.outcome.chunkTimesMs.push(atMs);
        this.outcome.chunkTokens.push(tokens);
      }
    }
    return null;
  }
}
