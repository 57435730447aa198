// Every request the frontend hands the engine, text or graph, goes through
// RequestSessions: admission learns it has left the frontend's queue, it is
// observed (metrics, one log line when the engine takes it and one when it
// ends), it is live in one registry (shutdown and a lost worker end every live
// request with an error), and its abort reaches the engine once. Text
// generations (generation.ts) and graph runs (graph-endpoints.ts) are its two
// kinds of owner.
//
// A request the frontend ends on a stop string (abort with reason "stop")
// finishes as "stop" there and then, as vLLM counts it; the engine's later
// "abort" output for it is not counted again, but the request phases it
// carries (RequestTiming) are still observed.

import { performance } from "node:perf_hooks";
import type { GraphEventCallback, GraphRequest } from "../conductor/graph-engine.js";
import type { EngineRequest, FinishReason, OutputCallback, RequestId, RequestTiming } from "../engine/types.js";
import type { Logger } from "../observability/logger.js";
import type { RequestRecorder, RequestTrace } from "../observability/metrics.js";
import type { ApiError } from "./openai-error.js";

/** The engine as sessions use it (a ServingEngine, or a test's stand-in for the frontend alone). */
export interface SessionEngine {
  submit(req: EngineRequest, onOutput: OutputCallback): void;
  submitGraph?(req: GraphRequest, onEvent: GraphEventCallback): void;
  abort(requestId: RequestId, reason?: "stop"): void;
}

/** What owns a live request: the registry can end it with an error. */
export interface SessionOwner {
  readonly id: RequestId;
  /** What the client knows the request by (the response's id), for the log lines. */
  readonly name: string;
  /** Ends the request with this error, delivered to its client (and aborts it in the engine). */
  fail(error: ApiError): void;
}

export interface RequestSessionsOptions {
  recorder?: RequestRecorder | null;
  logger?: Logger | null;
  /** Called right before a request is handed to the engine (admission bookkeeping). */
  onSubmit?: () => void;
}

/** What is known about one live request. */
class Observation {
  private completionTokens = 0;
  private firstOutputMs = -1;
  private done = false;

  constructor(
    private readonly name: string,
    private readonly promptTokens: number,
    private readonly arrivalMs: number,
    private readonly trace: RequestTrace | null,
    private readonly log: Logger | null,
  ) {}

  /** The engine's final output carries the request's phases (possibly after a stop-string finish). */
  phases(timing: RequestTiming | undefined): void {
    if (timing !== undefined) this.trace?.phases(timing);
  }

  tokens(count: number, now: number): void {
    if (count === 0 || this.done) return;
    if (this.firstOutputMs < 0) this.firstOutputMs = now;
    this.completionTokens += count;
    this.trace?.tokens(count, now);
  }

  /** Records the finish once; later calls are ignored. */
  finish(reason: FinishReason, now: number, cachedTokens: number | null, error: string | null): void {
    if (this.done) return;
    this.done = true;
    this.trace?.finish(reason, now);
    this.log?.info(
      {
        request_id: this.name,
        prompt_tokens: this.promptTokens,
        completion_tokens: this.completionTokens,
        ...(cachedTokens === null ? {} : { cached_tokens: cachedTokens }),
        finish_reason: reason,
        latency_ms: round(now - this.arrivalMs),
        ttft_ms: this.firstOutputMs < 0 ? null : round(this.firstOutputMs - this.arrivalMs),
        ...(error === null ? {} : { error }),
      },
      "request finished",
    );
  }
}

export class RequestSessions {
  private readonly live = new Map<RequestId, { owner: SessionOwner; observation: Observation }>();
  private lastId = 0;

  constructor(
    private readonly engine: SessionEngine,
    private readonly options: RequestSessionsOptions = {},
  ) {}

  /**
   * A new request's id: an int32 counter that wraps, skipping ids still live,
   * so it names the request from here to the worker (RequestId).
   */
  newId(): RequestId {
    do this.lastId = (this.lastId + 1) & 0x7fffffff;
    while (this.lastId === 0 || this.live.has(this.lastId));
    return this.lastId;
  }

  /** Requests live in the engine. */
  get size(): number {
    return this.live.size;
  }

  /**
   * Hands a text request to the engine; it is live until its final output, or
   * until its owner ends it (end). A refusal throws, and nothing is left live.
   */
  submitText(owner: SessionOwner, req: EngineRequest, onOutput: OutputCallback): void {
    const observation = this.open(owner, req.promptIds.length, req.arrivalMs, req.stop.maxTokens);
    try {
      this.engine.submit(req, (output) => {
        const now = performance.now();
        observation.tokens(output.newTokenIds.length, now);
        if (output.finished) {
          this.live.delete(owner.id);
          observation.finish(output.finishReason ?? "stop", now, output.numCachedTokens, output.error);
          observation.phases(output.timing);
        }
        onOutput(output);
      });
    } catch (error) {
      this.live.delete(owner.id);
      throw error;
    }
    this.received(owner.name, req.promptIds.length, req.stop.maxTokens);
  }

  /** Hands a graph request to the engine; its chunks are not tokens, so it counts in request totals and latency only. */
  submitGraph(owner: SessionOwner, req: GraphRequest, onEvent: GraphEventCallback): void {
    const submitGraph = this.engine.submitGraph;
    if (submitGraph === undefined) throw new Error("this engine serves no graph requests");
    const maxTokens = req.maxTokens ?? 0;
    const observation = this.open(owner, 0, req.arrivalMs, maxTokens);
    try {
      submitGraph.call(this.engine, req, (event) => {
        if (event.kind !== "chunk") {
          this.live.delete(owner.id);
          if (event.kind === "done") observation.finish("stop", performance.now(), null, null);
          else observation.finish("error", performance.now(), null, event.message);
        }
        onEvent(event);
      });
    } catch (error) {
      this.live.delete(owner.id);
      throw error;
    }
    this.received(owner.name, 0, maxTokens);
  }

  /**
   * The owner is done with its request: it leaves the registry, and the engine
   * is told to abort it unless `engineDone` (reason "stop": a stop string ended it).
   */
  end(owner: SessionOwner, engineDone: boolean, reason?: "stop"): void {
    const entry = this.live.get(owner.id);
    if (entry === undefined || entry.owner !== owner) {
      if (!engineDone) this.engine.abort(owner.id, reason);
      return;
    }
    this.live.delete(owner.id);
    const now = performance.now();
    if (reason === "stop") entry.observation.finish("stop", now, null, null);
    else if (!engineDone) entry.observation.finish("abort", now, null, null);
    if (!engineDone) this.engine.abort(owner.id, reason);
  }

  /** Ends every live request with this error (each owner aborts its own in the engine). */
  failAll(error: ApiError): void {
    for (const { owner } of [...this.live.values()]) owner.fail(error);
  }

  private open(owner: SessionOwner, promptTokens: number, arrivalMs: number, maxTokens: number): Observation {
    const { recorder = null, logger = null, onSubmit } = this.options;
    onSubmit?.();
    const log = logger?.isLevelEnabled("info") ? logger : null;
    const observation = new Observation(owner.name, promptTokens, arrivalMs, recorder?.begin(promptTokens, arrivalMs, maxTokens) ?? null, log);
    this.live.set(owner.id, { owner, observation });
    return observation;
  }

  /** Logged once the engine took it (a refused submit throws and becomes a 4xx/5xx). */
  private received(name: string, promptTokens: number, maxTokens: number): void {
    const logger = this.options.logger;
    if (logger?.isLevelEnabled("info")) logger.info({ request_id: name, prompt_tokens: promptTokens, max_tokens: maxTokens }, "request received");
  }
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
