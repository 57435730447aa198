// What the engine core does about a worker that died with requests on it
// (request migration, maxRequestMigrations set): the engine holds every
// request's tokens, so a request the worker knew is carried over to the
// restarted worker and recomputed there, as after a preemption, and charged
// one migration; past the limit it ends with "abort" and the reason.
//
// Blame. Requests that were being added in the steps the worker never
// answered are suspects: after the restart they are held back and
// re-admitted one at a time, each once the one before it has run a step and
// once the carried-over requests have run one on the new worker. A death
// while a suspect is being added again is charged to it alone, so a request
// that crashes the worker every time fails by itself and the others go on.

import type { Request } from "./request.js";
import type { Scheduler } from "./scheduler.js";

export class WorkerLossRecovery {
  /** Requests added to the worker in steps it never answered. */
  private readonly addedInLostSteps = new Set<Request>();
  /** Suspects held back, re-admitted one at a time. */
  private readonly heldBack: Request[] = [];
  /** The suspect being re-admitted now. */
  private probation: Request | null = null;
  /** A step has come back since the worker was (re)placed: the carried-over requests ran. */
  private answeredSinceSwap = false;

  constructor(
    /** --max-request-migrations: how many worker deaths one request may be carried over. */
    private readonly limit: number,
  ) {}

  /** Suspects held back and not ended (they count as waiting). */
  get numHeldBack(): number {
    let n = 0;
    for (const request of this.heldBack) if (!request.isFinished) n++;
    return n;
  }

  /** A step the worker never answered added these requests. */
  noteLostStep(added: readonly Request[]): void {
    for (const request of added) this.addedInLostSteps.add(request);
  }

  /** The worker answered a step: the requests it added ran without killing it. */
  stepAnswered(added: readonly Request[]): void {
    this.answeredSinceSwap = true;
    for (const request of added) request.suspect = false;
  }

  /** A new worker took over: nothing has run on it yet. */
  workerSwapped(): void {
    this.answeredSinceSwap = false;
  }

  /**
   * The worker died (nothing in flight any more): charges the migration to
   * the suspects being added, else to every request the worker knew, and
   * marks the requests it was adding as suspects. Returns the live requests
   * past the limit, which end here.
   */
  charge(live: readonly Request[]): Request[] {
    const added = [...this.addedInLostSteps].filter((r) => !r.isFinished);
    this.addedInLostSteps.clear();
    const blamed = added.filter((r) => r.suspect);
    const onWorker = live.filter((r) => r.onWorker || added.includes(r));
    for (const request of blamed.length > 0 ? blamed : onWorker) request.numMigrations++;
    if (blamed.length === 0) for (const request of added) request.suspect = true;
    this.probation = null;
    this.answeredSinceSwap = false;
    return live.filter((r) => r.numMigrations > this.limit);
  }

  /** After charge() and the scheduler's reset: suspects leave the waiting queue to come back one at a time. */
  holdBackSuspects(live: readonly Request[], scheduler: Scheduler): void {
    const held = new Set(this.heldBack);
    for (const request of live) {
      if (request.isFinished || !request.suspect || held.has(request)) continue;
      scheduler.withdraw(request);
      this.heldBack.push(request);
    }
  }

  /**
   * Re-admits the next held-back suspect once the one before it has run a
   * step (or ended), and not before the other carried-over requests have run
   * one on the new worker: a death then is the suspect's alone.
   */
  releaseNext(scheduler: Scheduler): void {
    if (this.heldBack.length === 0) return;
    const current = this.probation;
    if (current !== null && !current.isFinished && current.suspect) return;
    if (!this.answeredSinceSwap && scheduler.hasUnfinished) return;
    this.probation = null;
    while (this.heldBack.length > 0) {
      const next = this.heldBack.shift() as Request;
      if (next.isFinished) continue;
      this.probation = next;
      scheduler.requeueFront(next);
      return;
    }
  }

  /** The worker is gone for good: nothing is held back any more. */
  clear(): void {
    this.heldBack.length = 0;
    this.probation = null;
    this.addedInLostSteps.clear();
  }

  /** Why `request` was not carried over to the restarted worker. */
  notCarriedOver(reason: string, request: Request): string {
    const limit = this.limit;
    const flag = `--max-request-migrations ${limit}`;
    if (limit === 0) return `${reason}; requests are not carried over to a restarted worker (${flag})`;
    if (request.suspect) return `${reason}; the worker died each time it ran this request, so it is not retried (${flag})`;
    return `${reason}; this request was already carried over to a restarted worker ${limit} time${limit === 1 ? "" : "s"} (${flag})`;
  }
}
