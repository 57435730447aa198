// An EngineHandle that watches every request on its way to the engine core:
// per-request metrics (RequestRecorder), one log line when a request is
// received and one when it finishes, and the admission hook that learns a
// request has reached the engine. The frontend uses it exactly like the engine.

import { performance } from "node:perf_hooks";
import type { EngineRequest, OutputCallback } from "../engine/types.js";
import type { EngineHandle } from "../frontend/generation.js";
import type { Logger } from "./logger.js";
import type { RequestRecorder } from "./metrics.js";

export interface ObservedEngineOptions {
  recorder?: RequestRecorder | null;
  logger?: Logger | null;
  /** Called right before a request is handed to the engine (admission bookkeeping). */
  onSubmit?: () => void;
}

export function observeEngine(engine: EngineHandle, options: ObservedEngineOptions): EngineHandle {
  const { recorder = null, logger = null, onSubmit } = options;
  return {
    submit(req: EngineRequest, onOutput: OutputCallback): void {
      onSubmit?.();
      const trace = recorder?.begin(req.id, req.promptIds.length, req.arrivalMs) ?? null;
      let completionTokens = 0;
      let firstTokenMs = -1;
      const log = logger?.isLevelEnabled("info") ? logger : null;
      engine.submit(req, (output) => {
        const now = performance.now();
        const n = output.newTokenIds.length;
        if (n > 0) {
          if (firstTokenMs < 0) firstTokenMs = now;
          completionTokens += n;
          trace?.tokens(n, now);
        }
        if (output.finished) {
          const reason = output.finishReason ?? "stop";
          trace?.finish(reason, now);
          log?.info(
            {
              request_id: req.id,
              prompt_tokens: req.promptIds.length,
              completion_tokens: completionTokens,
              cached_tokens: output.numCachedTokens,
              finish_reason: reason,
              latency_ms: round(now - req.arrivalMs),
              ttft_ms: firstTokenMs < 0 ? null : round(firstTokenMs - req.arrivalMs),
              ...(output.error === null ? {} : { error: output.error }),
            },
            "request finished",
          );
        }
        onOutput(output);
      });
      // Logged once the engine took it (a rejected submit throws and becomes a 4xx/5xx).
      log?.info({ request_id: req.id, prompt_tokens: req.promptIds.length, max_tokens: req.stop.maxTokens }, "request received");
    },
    abort(requestId: string): void {
      engine.abort(requestId);
    },
  };
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
