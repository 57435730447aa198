// Incremental detokenization, vLLM's prefix-offset/read-offset scheme.
//
// Each request keeps its token ids and two offsets: text for tokens before
// readOffset has been emitted; tokens from prefixOffset to readOffset are
// decoded again as context, because most decoders only produce the right text
// for a token when they see its neighbours (SentencePiece/Metaspace strips the
// leading space of the first token it decodes; byte-level BPE and byte-fallback
// split one character over several tokens). Per step we decode
// [prefixOffset, readOffset) and [prefixOffset, end); the difference is the new
// text, emitted only if it does not end in U+FFFD (an incomplete UTF-8
// sequence that the next token may complete). The prompt's last few tokens seed
// the context so the first generated token gets its leading space right.
//
// The binding's decode is async (it runs on libuv's pool), so all requests that
// received tokens in one engine step are decoded with one decodeBatch call: the
// engine calls its output callbacks synchronously per step, and the batch is
// cut at the next microtask.
//
// Fast path: when the tokenizer offers a ByteLevelDecoder (plain byte-level
// BPE, e.g. Qwen, Llama 3), the batch is decoded synchronously in JS with the
// same offsets and the same hold-back rule, and the text is identical to the
// native decode; a step whose new tokens are all whole characters costs one
// string concatenation per request.

import type { ByteLevelDecoder } from "./byte-level.js";

/** What the detokenizer needs from a tokenizer. */
export interface BatchDecoder {
  decodeBatch(batch: number[][], skipSpecialTokens: boolean): Promise<string[]>;
  /** A synchronous decoder equal to decodeBatch's, when the tokenizer has one. */
  readonly byteLevel?: ByteLevelDecoder | null;
}

/** Event-loop time spent detokenizing in this process, all batchers together (for `baton bench`). */
export const detokenizerTimings = { busyMs: 0 };

/** Prompt tokens kept as decoding context (vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET). */
const PROMPT_CONTEXT_TOKENS = 5;

const REPLACEMENT_CHAR = "\uFFFD";

interface PendingPush {
  final: boolean;
  resolve: (text: string) => void;
  reject: (error: Error) => void;
}

interface Work {
  session: DetokenizerSession;
  /** Token count this work covers. */
  end: number;
  final: boolean;
  pushes: PendingPush[];
  /** Indices into the decode batch, -1 when nothing needs decoding. */
  prefixIndex: number;
  fullIndex: number;
}

/** One request's incremental detokenizer; create it with DetokenizerBatcher.session(). */
export class DetokenizerSession {
  private readonly tokens: number[];
  private prefixOffset: number;
  private readOffset: number;
  private pending: PendingPush[] = [];
  private finished = false;

  constructor(
    private readonly batcher: DetokenizerBatcher,
    promptIds: readonly number[],
    readonly skipSpecialTokens: boolean,
  ) {
    // Only the prompt's tail matters as context; copying all of it would waste memory.
    this.tokens = promptIds.slice(Math.max(promptIds.length - PROMPT_CONTEXT_TOKENS, 0));
    this.prefixOffset = 0;
    this.readOffset = this.tokens.length;
  }

  /**
   * Adds generated ids and resolves with the text they make final (possibly "").
   * Promises resolve in push order. With final=true, text held back so far is
   * flushed even if it ends in an incomplete character.
   */
  push(ids: readonly number[], final = false): Promise<string> {
    if (this.finished) return Promise.reject(new Error("detokenizer session already finished"));
    if (final) this.finished = true;
    for (const id of ids) this.tokens.push(id);
    return new Promise<string>((resolve, reject) => {
      this.pending.push({ final, resolve, reject });
      this.batcher.enqueue(this);
    });
  }

  /** @internal Called by the batcher: claims the pending pushes and adds slices to decode. */
  takeWork(batch: number[][]): Work {
    const pushes = this.pending;
    this.pending = [];
    const end = this.tokens.length;
    const final = pushes.some((p) => p.final);
    const work: Work = { session: this, end, final, pushes, prefixIndex: -1, fullIndex: -1 };
    if (end > this.readOffset) {
      work.prefixIndex = batch.push(this.tokens.slice(this.prefixOffset, this.readOffset)) - 1;
      work.fullIndex = batch.push(this.tokens.slice(this.prefixOffset, end)) - 1;
    }
    return work;
  }

  /** @internal The fast path: decodes this session's pending pushes synchronously and resolves them. */
  completeSync(decoder: ByteLevelDecoder): void {
    const pushes = this.pending;
    this.pending = [];
    let final = false;
    for (let i = 0; i < pushes.length; i++) if ((pushes[i] as PendingPush).final) final = true;
    const end = this.tokens.length;
    let text = "";
    if (end > this.readOffset) {
      const skip = this.skipSpecialTokens;
      // When every token in the window is a whole character sequence, the full text
      // is the prefix text plus the new tokens' text: no need to decode the prefix.
      let added = decoder.isWhole(this.tokens, this.prefixOffset, this.readOffset, skip) ? decoder.joinWhole(this.tokens, this.readOffset, end, skip) : null;
      let prefixLength = 0;
      if (added === null) {
        const prefixText = decoder.decode(this.tokens, this.prefixOffset, this.readOffset, skip);
        const fullText = decoder.decode(this.tokens, this.prefixOffset, end, skip);
        prefixLength = prefixText.length;
        added = fullText.length > prefixLength ? fullText.slice(prefixLength) : "";
      }
      if (added.length > 0 && (final || !added.endsWith(REPLACEMENT_CHAR))) {
        text = added;
        this.prefixOffset = this.readOffset;
        this.readOffset = end;
      } else if (final) {
        this.readOffset = end;
      }
    }
    const last = pushes.length - 1;
    for (let i = 0; i < last; i++) (pushes[i] as PendingPush).resolve("");
    if (last >= 0) (pushes[last] as PendingPush).resolve(text);
  }

  /** @internal Called by the batcher with the decoded slices. */
  complete(work: Work, texts: readonly string[]): void {
    let text = "";
    if (work.fullIndex >= 0) {
      const prefixText = texts[work.prefixIndex] ?? "";
      const fullText = texts[work.fullIndex] ?? "";
      if (fullText.length > prefixText.length && (work.final || !fullText.endsWith(REPLACEMENT_CHAR))) {
        text = fullText.slice(prefixText.length);
        this.prefixOffset = this.readOffset;
        this.readOffset = work.end;
      } else if (work.final) {
        // Nothing printable (e.g. only skipped special tokens): nothing to flush.
        this.readOffset = work.end;
      }
    }
    // Earlier pushes merged into this batch get "", the last one carries the text,
    // so the concatenation over pushes stays exact.
    work.pushes.forEach((push, i) => push.resolve(i === work.pushes.length - 1 ? text : ""));
  }

  /** @internal */
  failPending(error: Error): void {
    this.finished = true;
    const pushes = this.pending;
    this.pending = [];
    for (const push of pushes) push.reject(error);
  }

  /** @internal */
  fail(work: Work, error: Error): void {
    this.finished = true;
    for (const push of work.pushes) push.reject(error);
  }
}

/** Shares one decodeBatch call per engine step among all live sessions. */
export class DetokenizerBatcher {
  private readonly queued = new Set<DetokenizerSession>();
  private running = false;
  private scheduled = false;
  /** Number of decodeBatch calls made, or synchronous batches on the fast path (for tests and metrics). */
  decodeCalls = 0;
  /** Milliseconds spent decoding on the event loop (the fast path's batches, the native path's JS side). */
  busyMs = 0;
  private readonly fast: ByteLevelDecoder | null;

  constructor(private readonly decoder: BatchDecoder) {
    this.fast = decoder.byteLevel ?? null;
  }

  session(promptIds: readonly number[], skipSpecialTokens = true): DetokenizerSession {
    return new DetokenizerSession(this, promptIds, skipSpecialTokens);
  }

  /** @internal */
  enqueue(session: DetokenizerSession): void {
    this.queued.add(session);
    this.kick();
  }

  private kick(): void {
    if (this.running || this.scheduled || this.queued.size === 0) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      void this.run();
    });
  }

  private async run(): Promise<void> {
    if (this.fast !== null) {
      this.runSync(this.fast);
      return;
    }
    this.running = true;
    const t0 = performance.now();
    const sessions = [...this.queued];
    this.queued.clear();
    // One batch per skip-special-tokens setting (the binding takes one flag per call).
    const groups = new Map<boolean, { batch: number[][]; works: Work[] }>();
    for (const session of sessions) {
      let group = groups.get(session.skipSpecialTokens);
      if (!group) {
        group = { batch: [], works: [] };
        groups.set(session.skipSpecialTokens, group);
      }
      group.works.push(session.takeWork(group.batch));
    }
    this.addBusy(performance.now() - t0);
    try {
      await Promise.all(
        [...groups].map(async ([skip, { batch, works }]) => {
          let texts: string[] = [];
          try {
            if (batch.length > 0) {
              this.decodeCalls++;
              texts = await this.decoder.decodeBatch(batch, skip);
            }
          } catch (error) {
            const err = error instanceof Error ? error : new Error(String(error));
            for (const work of works) work.session.fail(work, err);
            return;
          }
          const t1 = performance.now();
          for (const work of works) work.session.complete(work, texts);
          this.addBusy(performance.now() - t1);
        }),
      );
    } finally {
      this.running = false;
      this.kick();
    }
  }

  private addBusy(ms: number): void {
    this.busyMs += ms;
    detokenizerTimings.busyMs += ms;
  }

  private runSync(decoder: ByteLevelDecoder): void {
    const t0 = performance.now();
    this.decodeCalls++;
    for (const session of this.queued) {
      try {
        session.completeSync(decoder);
      } catch (error) {
        // A bug in the fast path must reach the request, not the event loop.
        session.failPending(error instanceof Error ? error : new Error(String(error)));
      }
    }
    this.queued.clear();
    this.addBusy(performance.now() - t0);
  }
}
