// An engine core's link to the grammar thread: one mask request per step with
// constrained rows, answered with the rows' packed bitmasks; matchers
// released when their requests end.

import type { MessagePort } from "node:worker_threads";
import type { FromGrammarThread, MaskRow, MasksReply, ToGrammarThread } from "./grammar-messages.js";

export class GrammarClient {
  /** 32-bit words per row of a mask. */
  readonly words: number;
  private nextId = 0;
  private nextMatcher = 0;
  private readonly pending = new Map<number, { resolve: (reply: MasksReply) => void; reject: (error: Error) => void }>();
  private closed: string | null = null;

  constructor(
    private readonly port: MessagePort,
    readonly vocabSize: number,
  ) {
    this.words = Math.ceil(vocabSize / 32);
    port.on("message", (message: FromGrammarThread) => {
      if (message.kind !== "masks") return;
      const waiter = this.pending.get(message.id);
      this.pending.delete(message.id);
      waiter?.resolve(message);
    });
    port.on("close", () => this.fail("the grammar engine stopped"));
    // An idle engine must not keep the process alive through this port.
    port.unref();
  }

  /** A fresh matcher id (one per constrained engine request). */
  newMatcher(): number {
    return this.nextMatcher++;
  }

  masks(rows: MaskRow[]): Promise<MasksReply> {
    if (this.closed !== null) return Promise.reject(new Error(this.closed));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.post({ kind: "masks", id, rows });
    });
  }

  release(matchers: number[]): void {
    if (matchers.length > 0 && this.closed === null) this.post({ kind: "release", matchers });
  }

  close(): void {
    this.fail("the grammar client is closed");
    this.port.close();
  }

  private fail(why: string): void {
    if (this.closed !== null) return;
    this.closed = why;
    for (const waiter of this.pending.values()) waiter.reject(new Error(why));
    this.pending.clear();
  }

  private post(message: ToGrammarThread): void {
    this.port.postMessage(message);
  }
}
