// The LoRA adapters an engine core's worker holds. Loading and unloading
// ride on steps (Step.lora: loads before the step's rows, unloads after its
// removals). A request of an adapter is admitted only once the worker has
// answered the adapter's load (ready()), so a failed load can never meet a
// request on the worker. The engine keeps every loaded adapter's directory so
// that a restarted worker gets them all again with its first step; a reload
// that fails ends the requests waiting for that adapter.

import type { LoraLoad, LoraWork, StepMessage, StepResultMessage } from "../transport/messages.js";

/** An adapter as the engine loads it: its id on the wire (>= 1, never reused), name (for messages) and PEFT directory. */
export interface LoraAdapterRef {
  id: number;
  name: string;
  path: string;
}

/** The worker refused an adapter (its one line names the adapter and the problem). */
export class LoraLoadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "LoraLoadError";
  }
}

interface PendingLoad {
  ref: LoraAdapterRef;
  resolve(): void;
  reject(error: Error): void;
}

export class LoraAdapters {
  /** Adapters loaded on the worker or on their way there, by id. */
  private readonly loaded = new Map<number, LoraAdapterRef>();
  /** Adapters the current worker has answered for: their requests may be added. */
  private readonly confirmed = new Set<number>();
  /** Live requests per adapter id (an adapter is unloaded on the wire only when none is left). */
  private readonly users = new Map<number, number>();
  /** Asked to go: no new request may use them; sent once their last user ends. */
  private readonly unloading = new Set<number>();
  private loadsToSend: PendingLoad[] = [];
  /** Loads sent in a step, by step id, until its result. */
  private readonly loadsInFlight = new Map<number, PendingLoad[]>();

  /** Whether a step must go out for the adapters alone. */
  get hasWork(): boolean {
    if (this.loadsToSend.length > 0) return true;
    for (const id of this.unloading) if ((this.users.get(id) ?? 0) === 0) return true;
    return false;
  }

  /** Whether a request may be submitted with the adapter (loaded or loading, and not going). */
  usable(id: number): boolean {
    return this.loaded.has(id) && !this.unloading.has(id);
  }

  /** Whether a request of the adapter may be added to the worker now (its load answered). */
  ready(id: number): boolean {
    return id === 0 || this.confirmed.has(id);
  }

  load(ref: LoraAdapterRef): Promise<void> {
    if (this.loaded.has(ref.id)) return Promise.reject(new LoraLoadError(`adapter ${ref.name}: id ${ref.id} is already loaded`));
    return new Promise((resolve, reject) => {
      this.loaded.set(ref.id, ref);
      this.loadsToSend.push({ ref, resolve, reject });
    });
  }

  /** New requests may no longer use it; the worker drops it once its live requests end. */
  unload(id: number): void {
    if (this.loaded.has(id)) this.unloading.add(id);
  }

  requestStarted(id: number): void {
    if (id !== 0) this.users.set(id, (this.users.get(id) ?? 0) + 1);
  }

  requestEnded(id: number): void {
    if (id === 0) return;
    const n = (this.users.get(id) ?? 1) - 1;
    if (n > 0) this.users.set(id, n);
    else this.users.delete(id);
  }

  /** The loads and unloads that go with step `stepId` (null: none). */
  takeWork(stepId: number): LoraWork | null {
    const unloads: number[] = [];
    for (const id of this.unloading) {
      if ((this.users.get(id) ?? 0) > 0) continue;
      unloads.push(id);
      this.unloading.delete(id);
      this.loaded.delete(id);
      this.confirmed.delete(id);
    }
    if (this.loadsToSend.length === 0 && unloads.length === 0) return null;
    const loads: LoraLoad[] = this.loadsToSend.map((p) => ({ lora_id: p.ref.id, name: p.ref.name, path: p.ref.path }));
    if (this.loadsToSend.length > 0) this.loadsInFlight.set(stepId, this.loadsToSend);
    this.loadsToSend = [];
    return { loads, unloads: Int32Array.from(unloads) };
  }

  /** A step's result: its loads are answered (a failed one is forgotten). Returns the failed ids with their lines. */
  stepAnswered(message: StepMessage, result: StepResultMessage): Map<number, string> {
    const failed = new Map<number, string>();
    const pending = this.loadsInFlight.get(message.step_id);
    if (pending === undefined) return failed;
    this.loadsInFlight.delete(message.step_id);
    result.lora_load_failed.forEach((id, i) => failed.set(id, result.lora_load_errors[i] ?? "the worker refused it"));
    for (const p of pending) {
      const why = failed.get(p.ref.id);
      if (why === undefined) {
        this.confirmed.add(p.ref.id);
        p.resolve();
      } else {
        this.loaded.delete(p.ref.id);
        p.reject(new LoraLoadError(why));
      }
    }
    return failed;
  }

  /** A step never got its result (the worker failed): its loads fail with the step. */
  stepLost(message: StepMessage, reason: string): void {
    const pending = this.loadsInFlight.get(message.step_id);
    if (pending === undefined) return;
    this.loadsInFlight.delete(message.step_id);
    for (const p of pending) {
      this.loaded.delete(p.ref.id);
      p.reject(new LoraLoadError(`adapter ${p.ref.name}: ${reason}`));
    }
  }

  /** A new worker holds no adapter: every loaded one goes again with its first step. */
  workerReplaced(): void {
    this.confirmed.clear();
    const waiting = new Set(this.loadsToSend.map((p) => p.ref.id));
    for (const ref of this.loaded.values()) {
      if (!waiting.has(ref.id) && !this.unloading.has(ref.id)) this.loadsToSend.push({ ref, resolve() {}, reject() {} });
    }
  }

  /** Everything still waiting for an answer fails (the engine closes or its worker is gone). */
  failAll(reason: string): void {
    const all = [...this.loadsToSend, ...[...this.loadsInFlight.values()].flat()];
    this.loadsToSend = [];
    this.loadsInFlight.clear();
    for (const p of all) {
      this.loaded.delete(p.ref.id);
      p.reject(new LoraLoadError(`adapter ${p.ref.name}: ${reason}`));
    }
  }
}

/** What holds adapters: an engine core, a model's engines, a data-parallel replica. */
export interface LoraHolder {
  loadLora(ref: LoraAdapterRef): Promise<void>;
  unloadLora(id: number): void;
}

/** Loads the adapter on every holder, or on none: one that took it lets it go again when another refused. */
export async function loadOnAll(holders: readonly LoraHolder[], ref: LoraAdapterRef): Promise<void> {
  const loads = await Promise.allSettled(holders.map((h) => h.loadLora(ref)));
  const failed = loads.find((l) => l.status === "rejected");
  if (failed === undefined) return;
  for (const h of holders) h.unloadLora(ref.id);
  throw failed.reason instanceof Error ? failed.reason : new LoraLoadError(String(failed.reason));
}
