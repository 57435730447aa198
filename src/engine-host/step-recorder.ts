// Wraps a model worker for benchmarks: times each executeStep (call to call)
// and records what the codec did for it. Runs in the thread that owns the
// worker link, because the codec's timings (transport/channel.ts) are per
// thread.

import type { StepExecutor } from "../worker/types.js";
import { codecTimings } from "../transport/channel.js";
import type { StepMaskMessage, StepMessage, StepResultMessage } from "../transport/messages.js";
import type { StepRecord } from "./messages.js";

export class StepRecorder implements StepExecutor {
  recording = false;
  inFlight = 0;
  /** Called on every executeStep, before the step is sent (phase bookkeeping of benchmarks). */
  onStep: ((stepId: number) => void) | null = null;
  private readonly open = new Map<number, StepRecord & { callMs: number }>();
  private lastCall: { stepId: number; callMs: number } | null = null;

  constructor(private readonly inner: StepExecutor) {}

  get ready() {
    return this.inner.ready;
  }

  executeStep(step: StepMessage): Promise<StepResultMessage> {
    const callMs = performance.now();
    this.onStep?.(step.step_id);
    // The previous step's period ends here.
    if (this.lastCall !== null) {
      const previous = this.open.get(this.lastCall.stepId);
      if (previous !== undefined) previous.stepMs = callMs - this.lastCall.callMs;
    }
    this.lastCall = this.recording ? { stepId: step.step_id, callMs } : null;
    const promise = this.inner.executeStep(step);
    const encodeMs = codecTimings.encodeMs;
    this.inFlight++;
    const record = this.recording
      ? { stepId: step.step_id, callMs, stepMs: Number.NaN, encodeMs, decodeMs: 0, postMs: 0, inFlight: this.inFlight, tokens: 0, workerMs: 0 }
      : null;
    if (record !== null) this.open.set(step.step_id, record);
    return promise.then(
      (result) => {
        this.inFlight--;
        if (record !== null) {
          const t = result.timings;
          record.decodeMs = codecTimings.decodeMs;
          record.tokens = result.token_ids.length;
          record.workerMs = t.prepare_ms + t.forward_ms + t.sample_ms;
        }
        return result;
      },
      (error: unknown) => {
        this.inFlight--;
        throw error;
      },
    );
  }

  sendStepMask(mask: StepMaskMessage): void {
    this.inner.sendStepMask?.(mask);
  }

  /** Adds the time spent handing step `stepId`'s outputs to the frontend. */
  addPostMs(stepId: number, ms: number): void {
    const record = this.open.get(stepId);
    if (record !== undefined) record.postMs += ms;
  }

  /** Records whose step period has ended (oldest first); removes them. */
  take(): StepRecord[] {
    const out: StepRecord[] = [];
    for (const [id, record] of this.open) {
      if (Number.isNaN(record.stepMs)) continue;
      this.open.delete(id);
      const { callMs: _callMs, ...plain } = record;
      out.push(plain);
    }
    return out.sort((a, b) => a.stepId - b.stepId);
  }

  /** Forgets everything recorded (between benchmark runs). */
  reset(): void {
    this.open.clear();
    this.lastCall = null;
  }
}
