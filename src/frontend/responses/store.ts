// Stored responses (store: true) for GET, DELETE, cancel, input_items and
// previous_response_id: in memory only (a restart forgets them), bounded by
// bytes and by age. The least recently used entries go first once the byte
// cap is passed; an entry older than the TTL is gone. A response still running
// is pinned: it is neither evicted nor expired until it settles and is put
// again with its final size (a running background response must stay
// reachable for polling and cancel). An entry larger than the whole cap is not
// kept once it is unpinned.

import type { ConversationItem, ResponseObject } from "./items.js";

export interface StoredResponse {
  response: ResponseObject;
  /** The conversation before this response's output: earlier turns' items and this request's input. */
  inputItems: ConversationItem[];
}

export interface ResponseStoreOptions {
  /** The byte cap (JSON size of the entries); 0: nothing is stored. */
  maxBytes: number;
  /** How long an entry lives after it was stored, in milliseconds. */
  ttlMs: number;
  /** The clock (tests move it). */
  now?: () => number;
}

/** 256 MiB, kept a day (a restart forgets them either way). */
export const RESPONSES_STORE_DEFAULTS: ResponseStoreOptions = { maxBytes: 256 * 1024 * 1024, ttlMs: 24 * 3600 * 1000 };

const SWEEP_INTERVAL_MS = 1000;

interface Entry {
  value: StoredResponse;
  bytes: number;
  expiresAt: number;
  pinned: boolean;
}

export class ResponseStore {
  /** Map order is recency: the first entry is the least recently used. */
  private readonly entries = new Map<string, Entry>();
  private total = 0;
  private nextSweep = 0;
  private readonly now: () => number;

  constructor(private readonly options: ResponseStoreOptions) {
    this.now = options.now ?? Date.now;
  }

  /** False when the store keeps nothing (--responses-store-max-bytes 0). */
  get enabled(): boolean {
    return this.options.maxBytes > 0;
  }

  /** Bytes held by unpinned entries (pinned ones count once they settle). */
  get bytes(): number {
    return this.total;
  }

  get size(): number {
    return this.entries.size;
  }

  /** The entry, now the most recently used; undefined when absent or expired. */
  get(id: string): StoredResponse | undefined {
    const entry = this.entries.get(id);
    if (entry === undefined) return undefined;
    if (!entry.pinned && entry.expiresAt <= this.now()) {
      this.remove(id, entry);
      return undefined;
    }
    this.entries.delete(id);
    this.entries.set(id, entry);
    return entry.value;
  }

  /**
   * Stores (or replaces) an entry. Pinned: kept whatever the cap until put
   * again unpinned. Returns whether it is held after the cap was applied.
   */
  put(id: string, value: StoredResponse, pinned = false): boolean {
    if (!this.enabled) return false;
    const old = this.entries.get(id);
    if (old !== undefined) this.remove(id, old);
    const bytes = pinned ? 0 : Buffer.byteLength(JSON.stringify(value));
    // One that could never fit would only push the others out.
    if (bytes > this.options.maxBytes) return false;
    this.entries.set(id, { value, bytes, expiresAt: this.now() + this.options.ttlMs, pinned });
    this.total += bytes;
    this.evict();
    return this.entries.has(id);
  }

  delete(id: string): boolean {
    const entry = this.entries.get(id);
    if (entry === undefined) return false;
    this.remove(id, entry);
    return true;
  }

  private remove(id: string, entry: Entry): void {
    this.entries.delete(id);
    this.total -= entry.bytes;
  }

  /** Expired entries out (a full scan, so at most once a second), then the least recently used until the cap holds. */
  private evict(): void {
    const now = this.now();
    if (now >= this.nextSweep) {
      this.nextSweep = now + SWEEP_INTERVAL_MS;
      for (const [id, entry] of this.entries) if (!entry.pinned && entry.expiresAt <= now) this.remove(id, entry);
    }
    if (this.total <= this.options.maxBytes) return;
    for (const [id, entry] of this.entries) {
      if (entry.pinned) continue;
      this.remove(id, entry);
      if (this.total <= this.options.maxBytes) return;
    }
  }
}
