// An EngineHandle that watches every request on its way to the engine core:
// per-request metrics (RequestRecorder), one log line when a request is
// received and one when it finishes, and the admission hook that learns a
// request has reached the engine. The frontend uses it exactly like the engine.
//
// A request the frontend ends on a stop string (abort with reason "stop")
// finishes as "stop" there and then, as vLLM counts it; the engine's later
// "abort" output for it is not counted again, but the request phases it
// carries (RequestTiming) are still observed.

import { performance } from "node:perf_hooks";
import type { EngineRequest, FinishReason, OutputCallback, RequestTiming } from "../engine/types.js";
import type { EngineHandle } from "../engine/types.js";
import type { Logger } from "./logger.js";
import type { RequestRecorder, RequestTrace } from "./metrics.js";

export interface ObservedEngineOptions {
  recorder?: RequestRecorder | null;
  logger?: Logger | null;
  /** Called right before a request is handed to the engine (admission bookkeeping). */
  onSubmit?: () => void;
}

/** What is known about one live request. */
class Observation {
  private completionTokens = 0;
  private firstTokenMs = -1;
  private done = false;

  constructor(
    private readonly req: EngineRequest,
    private readonly trace: RequestTrace | null,
    private readonly log: Logger | null,
  ) {}

  /** The engine's final output carries the request's phases (possibly after a stop-string finish). */
  phases(timing: RequestTiming | undefined): void {
    if (timing !== undefined) this.trace?.phases(timing);
  }

  tokens(count: number, now: number): void {
    if (count === 0 || this.done) return;
    if (this.firstTokenMs < 0) this.firstTokenMs = now;
    this.completionTokens += count;
    this.trace?.tokens(count, now);
  }

  /** Records the finish once; later calls are ignored. */
  finish(reason: FinishReason, now: number, cachedTokens: number | null, error: string | null): void {
    if (this.done) return;
    this.done = true;
    this.trace?.finish(reason, now);
    const req = this.req;
    this.log?.info(
      {
        request_id: req.id,
        prompt_tokens: req.promptIds.length,
        completion_tokens: this.completionTokens,
        ...(cachedTokens === null ? {} : { cached_tokens: cachedTokens }),
        finish_reason: reason,
        latency_ms: round(now - req.arrivalMs),
        ttft_ms: this.firstTokenMs < 0 ? null : round(this.firstTokenMs - req.arrivalMs),
        ...(error === null ? {} : { error }),
      },
      "request finished",
    );
  }
}

export function observeEngine(engine: EngineHandle, options: ObservedEngineOptions): EngineHandle {
  const { recorder = null, logger = null, onSubmit } = options;
  const live = new Map<string, Observation>();
  return {
    submit(req: EngineRequest, onOutput: OutputCallback): void {
      onSubmit?.();
      const log = logger?.isLevelEnabled("info") ? logger : null;
      const observation = new Observation(req, recorder?.begin(req.id, req.promptIds.length, req.arrivalMs, req.stop.maxTokens) ?? null, log);
      engine.submit(req, (output) => {
        const now = performance.now();
        observation.tokens(output.newTokenIds.length, now);
        if (output.finished) {
          live.delete(req.id);
          observation.finish(output.finishReason ?? "stop", now, output.numCachedTokens, output.error);
          observation.phases(output.timing);
        }
        onOutput(output);
      });
      live.set(req.id, observation);
      // Logged once the engine took it (a rejected submit throws and becomes a 4xx/5xx).
      log?.info({ request_id: req.id, prompt_tokens: req.promptIds.length, max_tokens: req.stop.maxTokens }, "request received");
    },
    abort(requestId: string, reason?: "stop"): void {
      if (reason === "stop") live.get(requestId)?.finish("stop", performance.now(), null, null);
      engine.abort(requestId, reason);
    },
  };
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
