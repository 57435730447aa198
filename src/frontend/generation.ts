// One request's life on the frontend side: submit to the engine core, turn
// each step's token ids into text through the request's detokenizer session,
// and hand ordered deltas to the endpoint (streamed or collected). The engine
// is reached only through submit/abort and the output callback.

import { RequestRejectedError } from "../engine/engine-core.js";
import type { EngineRequest, OutputCallback, RequestOutput } from "../engine/types.js";
import type { DetokenizerSession } from "../text/detokenizer.js";
import { ApiError, badRequest, serverError, serviceUnavailable } from "./openai-error.js";

/** The part of EngineCore the frontend uses. */
export interface EngineHandle {
  submit(req: EngineRequest, onOutput: OutputCallback): void;
  abort(requestId: string): void;
}

export type OpenAIFinishReason = "stop" | "length";

export interface GenerationDelta {
  /** Text that became final with these tokens ("" while held back). */
  text: string;
  /** Generated ids of this step, stop token included. */
  tokenIds: number[];
  finishReason: OpenAIFinishReason | null;
  /** vLLM's stop_reason: the stop_token_ids entry that ended the request; null for EOS and length. */
  stopReason: number | null;
}

export interface GenerationSink {
  onDelta(delta: GenerationDelta): void;
  /** Terminal; no call follows. */
  onError(error: ApiError): void;
}

/** Live generations, so shutdown and worker death can end all of them. */
export class GenerationRegistry {
  private readonly live = new Map<string, Generation>();

  get size(): number {
    return this.live.size;
  }

  add(generation: Generation): void {
    this.live.set(generation.id, generation);
  }

  delete(generation: Generation): void {
    this.live.delete(generation.id);
  }

  /** Ends every live generation with this error (and aborts it in the engine). */
  failAll(error: ApiError): void {
    for (const generation of [...this.live.values()]) generation.fail(error);
  }
}

export class Generation {
  /** Generated tokens so far (what usage.completion_tokens counts). */
  completionTokens = 0;
  /** No more sink calls once closed. */
  private closed = false;
  /** The engine has finished or forgotten the request; no abort needed. */
  private engineDone = false;

  constructor(
    private readonly engine: EngineHandle,
    private readonly registry: GenerationRegistry,
    private readonly detokenizer: DetokenizerSession,
    private readonly request: EngineRequest,
    private readonly sink: GenerationSink,
  ) {}

  get id(): string {
    return this.request.id;
  }

  start(): void {
    this.registry.add(this);
    try {
      this.engine.submit(this.request, (output) => this.onOutput(output));
    } catch (error) {
      this.engineDone = true;
      // A request the engine can never run (e.g. longer than the whole KV cache) is the client's to fix.
      if (error instanceof RequestRejectedError) this.fail(badRequest(error.message));
      else this.fail(error instanceof ApiError ? error : serverError(`the engine refused the request: ${(error as Error).message}`));
    }
  }

  /** The client went away: free the engine's resources, tell nobody. */
  cancel(): void {
    if (this.closed) return;
    this.closed = true;
    this.release();
  }

  /** Ends the request with an error delivered to the client. */
  fail(error: ApiError): void {
    if (this.closed) return;
    this.closed = true;
    this.release();
    this.sink.onError(error);
  }

  private release(): void {
    this.registry.delete(this);
    if (!this.engineDone) {
      this.engineDone = true;
      this.engine.abort(this.request.id);
    }
  }

  private onOutput(output: RequestOutput): void {
    if (this.closed) return;
    if (output.finishReason === "error") {
      this.engineDone = true;
      this.fail(serverError(output.error ?? "the engine failed while generating"));
      return;
    }
    if (output.finishReason === "abort") {
      // Not ours (ours closes first): the engine dropped it, e.g. while shutting down.
      this.engineDone = true;
      this.fail(serviceUnavailable(output.error ?? "the request was aborted by the engine"));
      return;
    }
    const ids = output.newTokenIds;
    this.completionTokens += ids.length;
    const finishReason: OpenAIFinishReason | null = output.finished ? (output.finishReason === "length" ? "length" : "stop") : null;
    // A stop token (EOS or stop_token_ids) counts as generated but is not text (vLLM).
    const endsOnStopToken = output.finished && output.stopTokenId !== null && ids[ids.length - 1] === output.stopTokenId;
    const textIds = endsOnStopToken ? ids.slice(0, -1) : ids;
    const stopReason =
      endsOnStopToken && output.stopTokenId !== null && this.request.stop.stopTokenIds.includes(output.stopTokenId) ? output.stopTokenId : null;
    if (output.finished) {
      this.engineDone = true;
      this.registry.delete(this);
    }
    this.detokenizer.push(textIds, output.finished).then(
      (text) => {
        if (this.closed) return;
        if (output.finished) this.closed = true;
        this.sink.onDelta({ text, tokenIds: ids, finishReason, stopReason });
      },
      (error: unknown) => this.fail(serverError(`detokenization failed: ${(error as Error).message}`)),
    );
  }
}
