// The acknowledgement half of worker-to-worker tensors: a worker reads another
// worker's tensor from shared memory while it runs a pass, so the owner may
// free the block only after that pass has answered. The conductor drops its
// reference as soon as nothing in the walk state needs a value, which for an
// aborted request can be while a pass reading it is still queued or running on
// another worker; such a release is parked here until the reading step is done.

import type { PassBatch } from "../transport/messages.js";

export class RemoteReads {
  /** Per owner rank: handle -> passes in flight on other workers that read it. */
  private readonly reading: Map<number, number>[];
  /** Per owner rank: releases waiting for their readers. */
  private readonly parked: number[][];

  constructor(
    ranks: number,
    /** Hands releases to the owner's lane. */
    private readonly release: (owner: number, handles: readonly number[]) => void,
  ) {
    this.reading = Array.from({ length: ranks }, () => new Map());
    this.parked = Array.from({ length: ranks }, () => []);
  }

  /** Handles of worker `owner` the control plane has no reference to any more. */
  released(owner: number, handles: readonly number[]): void {
    const reading = this.reading[owner];
    if (reading === undefined || reading.size === 0) {
      this.release(owner, handles);
      return;
    }
    const now: number[] = [];
    for (const h of handles) (reading.has(h) ? this.parked[owner]! : now).push(h);
    if (now.length > 0) this.release(owner, now);
  }

  /** A batch goes to worker `rank`: its inputs held by other workers are being read until it answers. */
  sent(rank: number, batch: PassBatch): void {
    this.each(rank, batch, (owner, handle) => {
      const reading = this.reading[owner]!;
      reading.set(handle, (reading.get(handle) ?? 0) + 1);
    });
  }

  /** The step carrying the batch answered, or failed: its reads are over. */
  answered(rank: number, batch: PassBatch): void {
    this.each(rank, batch, (owner, handle) => {
      const reading = this.reading[owner]!;
      const n = reading.get(handle) ?? 0;
      if (n > 1) {
        reading.set(handle, n - 1);
        return;
      }
      reading.delete(handle);
      const parked = this.parked[owner]!;
      const at = parked.indexOf(handle);
      if (at < 0) return;
      parked.splice(at, 1);
      this.release(owner, [handle]);
    });
  }

  /** Reads in flight (leak checks). */
  get size(): number {
    let n = 0;
    for (const r of this.reading) n += r.size;
    return n;
  }

  private each(rank: number, batch: PassBatch, fn: (owner: number, handle: number) => void): void {
    for (const p of batch.passes) {
      for (const named of p.inputs) {
        for (const v of named.values) if (v.form === "tensor" && v.worker !== rank && this.reading[v.worker] !== undefined) fn(v.worker, v.handle);
      }
    }
  }
}
