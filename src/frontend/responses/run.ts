// One response being generated: its engine request (a Generation, as a chat
// choice runs), its text split by the chat machinery (reasoning parser, tool
// calls) into output items, its status from queued or in_progress to
// completed, incomplete (max_output_tokens), failed or cancelled, and its
// events with their sequence numbers for whoever streams them. The run does
// not belong to an HTTP exchange: a background response outlives its request,
// and cancel ends it from another one.

import type { ChatChoiceOutput, ChatPiece } from "../chat-answer.js";
import type { PreparedChat } from "../chat-completions.js";
import type { FrontendContext } from "../context.js";
import type { Generation, GenerationDelta } from "../generation.js";
import type { ApiError } from "../openai-error.js";
import { newGeneration, unixSeconds } from "../run-generation.js";
import type { ResponseObject } from "./items.js";
import { OutputBuilder, type OutputEvent } from "./output-builder.js";

/** An event as the stream carries it. */
export type ResponseEvent = OutputEvent & { sequence_number: number };

export interface RunListener {
  event(event: ResponseEvent): void;
  /** The run settled; no event follows. */
  end(): void;
}

export class ResponseRun {
  /** Set when the run failed: the error the client gets. */
  error: ApiError | null = null;
  /** Resolves once the response settled (completed, incomplete, failed or cancelled). */
  readonly settled: Promise<void>;
  private resolveSettled!: () => void;
  private done = false;
  private started = false;
  private readonly listeners: RunListener[] = [];
  private sequence = 0;
  private readonly output: ChatChoiceOutput;
  private readonly builder: OutputBuilder;
  private readonly generation: Generation;
  /** Generated tokens counted as reasoning; pending ones (their text held back) await the next text. */
  private reasoningTokens = 0;
  private pendingTokens = 0;
  private reasoningOver: boolean;
  private readonly promptTokens: number;

  constructor(
    ctx: FrontendContext,
    prepared: PreparedChat,
    /** The response object, updated in place as the run goes (a stored response is this object). */
    readonly response: ResponseObject,
    /** An engine error in the route's words (the worker names chat parameters, e.g. an image that does not decode). */
    private readonly rename: (error: ApiError) => ApiError = (error) => error,
  ) {
    this.settled = new Promise((resolve) => (this.resolveSettled = resolve));
    this.output = prepared.answer.newChoice();
    this.reasoningOver = ctx.reasoningParser === null;
    this.promptTokens = prepared.promptIds.length;
    const listeners = this.listeners;
    this.builder = new OutputBuilder(response.output, {
      get listening() {
        return listeners.length > 0;
      },
      event: (event) => this.emit(event),
    });
    const spec = prepared.specs[0];
    if (spec === undefined) throw new Error("a response runs one generation");
    this.generation = newGeneration(ctx, spec, prepared.answer.generationRequest, {
      onDelta: (delta) => this.onDelta(delta),
      onError: (error) => this.onError(error),
    });
  }

  listen(listener: RunListener): void {
    this.listeners.push(listener);
  }

  /**
   * Submits the engine request. A refusal there (a request the engine can
   * never run) comes back at once, and the run is over; nothing was announced.
   */
  start(): ApiError | null {
    this.generation.start();
    if (this.done) return this.error;
    this.started = true;
    return null;
  }

  /** The opening events of a stream: response.created, then response.in_progress, or response.queued for a background response (in_progress follows with its first output). */
  announce(): void {
    this.emit({ type: "response.created", response: structuredClone(this.response) });
    const status = this.response.status;
    if (status === "in_progress" || status === "queued") this.emit({ type: `response.${status}`, response: structuredClone(this.response) });
  }

  /** Ends the response now (cancel, or its client left): the engine request is aborted, the output so far kept. */
  cancel(): void {
    if (this.done) return;
    this.generation.cancel();
    this.builder.close("incomplete");
    this.response.status = "cancelled";
    this.response.usage = this.usage();
    this.settle();
  }

  private emit(event: OutputEvent): void {
    if (this.listeners.length === 0) return;
    const sequenced = { ...event, sequence_number: this.sequence++ } as ResponseEvent;
    for (const listener of [...this.listeners]) listener.event(sequenced);
  }

  private onDelta(delta: GenerationDelta): void {
    if (this.done) return;
    if (this.response.status === "queued") {
      this.response.status = "in_progress";
      this.emit({ type: "response.in_progress", response: structuredClone(this.response) });
    }
    this.add(this.output.push(delta.text), delta.tokenIds.length);
    if (delta.finishReason === null) return;
    this.add(this.output.finish(), 0);
    const incomplete = delta.finishReason === "length";
    this.builder.close(incomplete ? "incomplete" : "completed");
    const response = this.response;
    response.status = incomplete ? "incomplete" : "completed";
    response.incomplete_details = incomplete ? { reason: "max_output_tokens" } : null;
    response.usage = this.usage();
    if (!incomplete) response.completed_at = unixSeconds();
    this.emit({ type: incomplete ? "response.incomplete" : "response.completed", response: structuredClone(response) });
    this.settle();
  }

  private add(piece: ChatPiece, tokens: number): void {
    this.countReasoning(piece, tokens);
    this.builder.push(piece);
  }

  /**
   * Tokens whose text was reasoning count as reasoning tokens; tokens whose
   * text is held back count with the text they end up in, except that after
   * some reasoning, those before the answer are its closing tag (reasoning
   * too). Once the answer starts, nothing more is reasoning.
   */
  private countReasoning(piece: ChatPiece, tokens: number): void {
    if (this.reasoningOver) return;
    if (piece.content !== "" || piece.toolCalls.length > 0) {
      if (this.reasoningTokens > 0) this.reasoningTokens += this.pendingTokens;
      this.reasoningOver = true;
      return;
    }
    this.pendingTokens += tokens;
    if (piece.reasoning === "") return;
    this.reasoningTokens += this.pendingTokens;
    this.pendingTokens = 0;
  }

  private onError(engineError: ApiError): void {
    if (this.done) return;
    const error = this.rename(engineError);
    this.error = error;
    if (!this.started) {
      // Refused at submission: start() reports it, nothing was announced.
      this.settle();
      return;
    }
    this.builder.close("incomplete");
    const response = this.response;
    response.status = "failed";
    response.error = { code: error.status >= 500 ? "server_error" : "invalid_prompt", message: error.message };
    response.usage = this.usage();
    this.emit({ type: "error", code: error.code ?? error.type, message: error.message, param: error.param });
    this.emit({ type: "response.failed", response: structuredClone(response) });
    this.settle();
  }

  private usage(): ResponseObject["usage"] {
    const input = this.promptTokens;
    const output = this.generation.completionTokens;
    return {
      input_tokens: input,
      input_tokens_details: { cached_tokens: this.generation.numCachedTokens },
      output_tokens: output,
      output_tokens_details: { reasoning_tokens: Math.min(this.reasoningTokens, output) },
      total_tokens: input + output,
    };
  }

  private settle(): void {
    this.done = true;
    for (const listener of this.listeners.splice(0)) listener.end();
    this.resolveSettled();
  }
}
