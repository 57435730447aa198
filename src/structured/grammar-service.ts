// The main thread's handle on the grammar thread: starts it, compiles grammars
// for the frontend (a grammar that cannot be compiled is the client's 400),
// and hands out ports for engine cores to ask for token masks on.

import { MessageChannel, Worker, type MessagePort } from "node:worker_threads";
import { GrammarClient } from "./grammar-client.js";
import type { FromGrammarThread, GrammarThreadInit, ToGrammarThread } from "./grammar-messages.js";
import type { GrammarSpec } from "./grammar-spec.js";

/** The grammar engine itself is unavailable (its thread failed); not the request's fault. */
export class GrammarUnavailableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "GrammarUnavailableError";
  }
}

export class GrammarService {
  private readonly worker: Worker;
  private nextId = 0;
  private readonly pending = new Map<number, { resolve: (error: string | null) => void; reject: (error: Error) => void }>();
  private dead: string | null = null;

  private constructor(readonly init: GrammarThreadInit) {
    this.worker = new Worker(new URL("./grammar-thread.js", import.meta.url), { workerData: init });
    // The thread must not keep the process alive on its own.
    this.worker.unref();
    this.worker.on("message", (message: FromGrammarThread) => {
      if (message.kind !== "compiled") return;
      const waiter = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (message.unavailable) waiter?.reject(new GrammarUnavailableError(`structured outputs are unavailable: ${message.error ?? "the grammar engine did not start"}`));
      else waiter?.resolve(message.error);
    });
    const die = (why: string): void => {
      if (this.dead !== null) return;
      this.dead = why;
      for (const waiter of this.pending.values()) waiter.reject(new GrammarUnavailableError(why));
      this.pending.clear();
    };
    this.worker.on("error", (error) => die(`the grammar engine failed: ${error.message}`));
    this.worker.on("exit", (code) => die(`the grammar engine stopped (exit code ${code})`));
  }

  static start(init: GrammarThreadInit): GrammarService {
    return new GrammarService(init);
  }

  get vocabSize(): number {
    return this.init.vocabSize;
  }

  /**
   * Compiles `spec` (cached in the grammar thread). Resolves with null when it
   * compiled, or with the reason it cannot be; rejects with
   * GrammarUnavailableError when the grammar engine is gone.
   */
  compile(spec: GrammarSpec): Promise<string | null> {
    if (this.dead !== null) return Promise.reject(new GrammarUnavailableError(this.dead));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.post({ kind: "compile", id, spec });
    });
  }

  /** A port to the grammar thread for a client in another thread (an engine thread). */
  connectPort(): MessagePort {
    const { port1, port2 } = new MessageChannel();
    this.post({ kind: "connect", port: port2 }, [port2]);
    return port1;
  }

  /** A client in this thread (the engine core on the main thread). */
  client(): GrammarClient {
    return new GrammarClient(this.connectPort(), this.init.vocabSize);
  }

  async close(): Promise<void> {
    await this.worker.terminate();
  }

  private post(message: ToGrammarThread, transfer: MessagePort[] = []): void {
    this.worker.postMessage(message, transfer);
  }
}
