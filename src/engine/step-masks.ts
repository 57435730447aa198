// The engine core's side of constrained decoding: which rows of a step are
// masked, and their masks, computed by the grammar thread and sent to the
// worker as a StepMask.
//
// Overlap scheduling and masks. With two steps in flight, step N+1 is built
// and sent while N runs, before N's token is known; but a row's mask depends
// on every token before it. So a step's constrained rows are only marked in
// the Step (mask_rows), and the mask itself is computed once every earlier
// step's result has been processed (the engine core starts it right after it
// applies step N's tokens), then sent as StepMask N+1. The worker runs N+1's
// forward pass meanwhile and waits for the mask only to sample: the mask
// costs the step nothing unless computing it takes longer than the forward.
// Without overlap the mask is computed as soon as the step is sent.
//
// Each constrained request has one matcher in the grammar thread, fed the
// request's answer tokens in order (answer-phase.ts: thinking is not
// constrained). Preemption and prefix caching change nothing here: the
// outputs a resumed request brings back are the ones its matcher has seen.
// A step's mask is always sent, even when computing it failed (then the rows
// are unmasked and their requests fail), so the worker is never left waiting.

import type { Request } from "./request.js";
import type { RequestId } from "./types.js";
import type { StepExecutor } from "../worker/types.js";
import type { StepMessage } from "../transport/messages.js";
import { AnswerPhase } from "../structured/answer-phase.js";
import type { MessagePort } from "node:worker_threads";
import { GrammarClient } from "../structured/grammar-client.js";
import type { MaskRow } from "../structured/grammar-messages.js";

/** A step's constrained rows, waiting for the results of the steps before it. */
export interface MaskPlan {
  stepId: number;
  /** The requests of the masked rows, in mask_rows order. */
  requests: Request[];
  started: boolean;
}

interface Progress {
  matcher: number;
  phase: AnswerPhase;
  /** The grammar thread has been told this matcher's grammar. */
  introduced: boolean;
}

/** Where a mask job reports a request that cannot go on. */
export type FailRequest = (request: Request, message: string) => void;

export class StepMasks {
  private readonly progress = new Map<RequestId, Progress>();

  constructor(private readonly client: GrammarClient) {}

  /** Marks the step's constrained sampled rows in message.mask_rows; null when it has none. */
  plan(requests: readonly Request[], message: StepMessage): MaskPlan | null {
    const rows: number[] = [];
    const masked: Request[] = [];
    let k = 0;
    for (let i = 0; i < requests.length; i++) {
      if (message.sample[i] === 0) continue;
      const request = requests[i] as Request;
      if (request.grammar !== null) {
        rows.push(k);
        masked.push(request);
      }
      k++;
    }
    if (rows.length === 0) return null;
    message.mask_rows = Int32Array.from(rows);
    return { stepId: message.step_id, requests: masked, started: false };
  }

  /**
   * Computes the plan's masks from the outputs known now (every earlier step
   * processed) and sends them to `executor`. Requests whose mask cannot be
   * made are reported to `fail`; their rows go unmasked.
   */
  run(plan: MaskPlan, executor: StepExecutor, fail: FailRequest): void {
    plan.started = true;
    const words = this.client.words;
    const bits = new Int32Array(plan.requests.length * words);
    const asked: MaskRow[] = [];
    const at: number[] = [];
    plan.requests.forEach((request, r) => {
      const step = request.isFinished ? null : this.stepOf(request);
      if (step === null) {
        // Thinking, or a request that ended while this row was in flight (its token is dropped): no mask.
        bits.fill(-1, r * words, (r + 1) * words);
        return;
      }
      asked.push(step);
      at.push(r);
    });
    const send = (): void => executor.sendStepMask?.({ kind: "StepMask", step_id: plan.stepId, bitmask: bits });
    if (asked.length === 0) {
      send();
      return;
    }
    this.client.masks(asked).then(
      (reply) => {
        at.forEach((r, j) => {
          bits.set(reply.bits.subarray(j * words, (j + 1) * words), r * words);
          const error = reply.errors[j];
          if (error != null) fail(plan.requests[r] as Request, `structured output: ${error}`);
        });
        send();
      },
      (error: unknown) => {
        bits.fill(-1);
        send();
        for (const r of at) fail(plan.requests[r] as Request, `structured output: ${(error as Error).message}`);
      },
    );
  }

  /** A planned step whose result will be thrown away: unmasked rows, so the worker is not left waiting. */
  abandon(plan: MaskPlan, executor: StepExecutor): void {
    if (plan.started) return;
    plan.started = true;
    executor.sendStepMask?.({ kind: "StepMask", step_id: plan.stepId, bitmask: new Int32Array(plan.requests.length * this.client.words).fill(-1) });
  }

  /** The request has ended: its matcher goes. */
  release(request: Request): void {
    const progress = this.progress.get(request.id);
    if (progress === undefined) return;
    this.progress.delete(request.id);
    if (progress.introduced) this.client.release([progress.matcher]);
  }

  private stepOf(request: Request): MaskRow | null {
    const grammar = request.grammar;
    if (grammar === null) return null;
    let progress = this.progress.get(request.id);
    if (progress === undefined) {
      progress = { matcher: this.client.newMatcher(), phase: new AnswerPhase(grammar), introduced: false };
      this.progress.set(request.id, progress);
    }
    const next = progress.phase.next(request.outputIds);
    if (next === null) return null;
    const row: MaskRow = { matcher: progress.matcher, spec: progress.introduced ? null : grammar.spec, tokens: next.tokens, allow: next.allow };
    progress.introduced = true;
    return row;
  }
}

/** The engine core's StepMasks, or null (structured output refused) without a grammar thread or when its vocabulary is not the worker's. */
export function stepMasks(grammar: { port: MessagePort; vocabSize: number } | null, workerVocabSize: number): StepMasks | null {
  if (grammar === null) return null;
  if (grammar.vocabSize !== workerVocabSize) {
    grammar.port.close();
    return null;
  }
  return new StepMasks(new GrammarClient(grammar.port, grammar.vocabSize));
}
