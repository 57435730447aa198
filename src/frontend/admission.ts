// Admission control for generation routes, checked before a request is parsed
// into an engine request:
// - 503 + Retry-After while the server is unavailable (shutting down, worker dead);
// - 429 + Retry-After when the engine's waiting queue is at --max-num-queued-requests.
// A request admitted here but not yet submitted (still tokenizing) holds a
// ticket that counts as waiting, so a burst cannot slip past the bound while
// its prompts are being tokenized. The ticket is released when the request
// reaches the engine (its session's onSubmit, request-session.ts, matched through the
// request's async context) or when its HTTP exchange ends.
// Every admitted request counts as open until its response is finished or its
// connection closes; a draining server waits for that count to reach 0.

import { AsyncLocalStorage } from "node:async_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import { ApiError } from "./openai-error.js";

/** POST routes that queue work in the engine. */
const GENERATION_ROUTES: ReadonlySet<string> = new Set([
  "/v1/completions",
  "/v1/chat/completions",
  "/v1/responses",
  "/generate",
  "/v1/audio/speech",
  "/v1/images/generations",
  // Pooling: prefill-only work, queued in the same engine (and waited for by a drain).
  "/v1/embeddings",
  "/score",
  "/v1/score",
  "/rerank",
  "/v1/rerank",
  "/v2/rerank",
]);

/** Seconds a client should wait before retrying a 429 (queue full). */
const RETRY_AFTER_BUSY_S = 1;
/** Seconds a client should wait before retrying a 503 (draining, worker down). */
export const RETRY_AFTER_UNAVAILABLE_S = 5;

export interface AdmissionOptions {
  /** Most requests waiting (engine queue plus admitted, not yet submitted). */
  maxNumQueuedRequests: number;
  /** The engine's waiting-queue length now. */
  numWaiting(): number;
  /** null while requests can be served; otherwise why not. */
  unavailableReason(): string | null;
  /** Told about each request turned away. */
  onReject?(reason: "queue_full" | "unavailable"): void;
}

class Ticket {
  released = false;
  constructor(private readonly owner: Admission) {}
  release(): void {
    if (this.released) return;
    this.released = true;
    this.owner.pending--;
  }
}

/** The 429 body: OpenAI's error shape. */
function queueFullBody(max: number): object {
  return {
    error: {
      message: `the server is busy: ${max} requests are already waiting (--max-num-queued-requests); retry later`,
      type: "rate_limit_error",
      param: null,
      code: "queue_full",
    },
  };
}

export class Admission {
  pending = 0;
  /** Admitted requests whose response has not finished. */
  private open = 0;
  private idleWaiters: (() => void)[] = [];
  private readonly context = new AsyncLocalStorage<Ticket>();

  constructor(private readonly options: AdmissionOptions) {}

  /** Generation requests admitted and not finished (streams included). */
  get openRequests(): number {
    return this.open;
  }

  /** Resolves once no admitted request is open. */
  idle(): Promise<void> {
    if (this.open === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** The admitted request's ticket, if the caller runs in its async context. */
  releaseCurrent(): void {
    this.context.getStore()?.release();
  }

  /** A fastify preHandler (callback style, so the handler runs inside the ticket's async context). */
  readonly preHandler = (request: FastifyRequest, reply: FastifyReply, done: (error?: Error) => void): void => {
    if (request.method !== "POST" || !GENERATION_ROUTES.has(request.routeOptions.url ?? "")) {
      done();
      return;
    }
    const unavailable = this.options.unavailableReason();
    if (unavailable !== null) {
      this.options.onReject?.("unavailable");
      void reply
        .code(503)
        .header("retry-after", String(RETRY_AFTER_UNAVAILABLE_S))
        .send(new ApiError(503, unavailable, "service_unavailable").toBody());
      return;
    }
    const max = this.options.maxNumQueuedRequests;
    if (this.options.numWaiting() + this.pending >= max) {
      this.options.onReject?.("queue_full");
      void reply.code(429).header("retry-after", String(RETRY_AFTER_BUSY_S)).send(queueFullBody(max));
      return;
    }
    const ticket = new Ticket(this);
    this.pending++;
    this.open++;
    reply.raw.once("close", () => {
      ticket.release();
      this.open--;
      if (this.open === 0) for (const resolve of this.idleWaiters.splice(0)) resolve();
    });
    this.context.run(ticket, () => done());
  };
}
