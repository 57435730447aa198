// Prefill/decode disaggregation: the KV connector's scheduler half.
//
// One kv_cache node whose prefill walk runs on one worker and decode walk on
// another is served by two engine cores joined here, the way vLLM's P/D
// serving joins two engines through a KV connector:
//
// 1. Prefill: the request runs on the prefill core with max_tokens 1 as a
//    KV producer. Its first token goes to the client; when it ends on that
//    length limit its blocks are held (EngineCore.releaseHeld frees them).
// 2. Decode: the decode core gets it as a KV consumer with the prompt plus
//    the first token, and the prefill side's block ids for the prompt's
//    tokens. Its scheduler (get_num_new_matched_tokens / update_state_after_alloc
//    in vLLM's terms) takes local prefix-cache hits first, allocates blocks
//    for the rest and names them in its next step's kv.loads; once that step
//    is sent (loadsStarted, vLLM's build_connector_meta) the same transfer ids
//    go to the prefill worker as kv.sends, and the two workers move the bytes
//    with their transfer library (python/baton_worker/kv_connector/).
// 3. The decode worker reports each load finished or failed in a StepResult:
//    a loaded request runs from its first token on; a failed load makes it
//    compute its prompt on the decode side (recompute, never an error). Either
//    way the prefill side's blocks are released then (vLLM's request_finished
//    -> delayed free), after transferTimeoutMs at the latest, and at once when
//    the request ends before its load starts or while it runs: the prefill
//    worker copies a send's blocks out at the start of the step carrying it,
//    before any later step can reuse them.
//
// Requests with max_tokens 1, and prompts with images (their features live
// on the prefill worker), simply run on the prefill core. Structured output
// is not served here (the first token is sampled without the mask).

import { EngineCore, RequestRejectedError, type EngineConfig, type EngineStats, type KvLoadListener } from "../engine/engine-core.js";
import { EngineOutputs, type OutputSink } from "../engine/outputs.js";
import type { KvLoad } from "../engine/scheduler.js";
import type { StepTimingRing } from "../engine/step-timings.js";
import type { EngineRequest, RequestId, RequestOutput } from "../engine/types.js";
import type { StepExecutor } from "../worker/types.js";
import type { KvTransfer } from "../transport/messages.js";

/**
 * Where a kv_cache node's engine runs, from the rank of each of its walks:
 * one rank for all of them (one engine core), or its prefill and decode walks
 * on two ranks (a DisaggregatedCore). Anything else is refused.
 */
export function kvNodeRanks(node: string, rankOfWalk: ReadonlyMap<string, number>): { rank: number } | { prefill: number; decode: number } {
  const ranks = new Set(rankOfWalk.values());
  const prefill = rankOfWalk.get("prefill");
  const decode = rankOfWalk.get("decode");
  if (ranks.size === 2 && prefill !== undefined && decode !== undefined && prefill !== decode) return { prefill, decode };
  if (ranks.size !== 1) throw new Error(`kv_cache node ${node} must run on one rank for all its walks (or prefill and decode on two), not ${[...ranks].join(", ")}`);
  return { rank: [...ranks][0]! };
}

/** Where the prefill worker's KV sends go: its lane, which carries them in its next step. */
export interface KvSendLane extends StepExecutor {
  readonly rank: number;
  addKvSends(sends: readonly KvTransfer[]): void;
}

export interface DisaggregatedCoreOptions {
  prefill: { lane: KvSendLane; config: EngineConfig };
  decode: { lane: KvSendLane; config: EngineConfig };
  /** Where the pair's outputs go, as the client sees them: one batch per step of either core. */
  onOutputs: OutputSink;
  /** Longest the prefill side holds a request's blocks for a started transfer (default 60 s). */
  transferTimeoutMs?: number;
}

interface SplitRequest {
  readonly request: EngineRequest;
  phase: "prefill" | "decode";
  /** The prefill side holds this request's blocks (not released yet). */
  held: boolean;
  /** The transfer loading its KV, -1 before one starts. */
  transferId: number;
  /** Prompt tokens the prefill side served from its prefix cache (the client's cached_tokens). */
  numCachedTokens: number;
}

export class DisaggregatedCore implements KvLoadListener {
  readonly prefill: EngineCore;
  readonly decode: EngineCore;
  private readonly prefillLane: KvSendLane;
  private readonly decodeRank: number;
  private readonly decodeMaxModelLen: number;
  private readonly transferTimeoutMs: number;
  private readonly live = new Map<RequestId, SplitRequest>();
  /** Transfer id -> the request whose prefill blocks it reads, with its timeout. */
  private readonly transfers = new Map<number, { requestId: RequestId; timer: NodeJS.Timeout }>();
  private numLoadFailures = 0;
  private readonly onOutputs: OutputSink;

  constructor(options: DisaggregatedCoreOptions) {
    this.prefillLane = options.prefill.lane;
    this.decodeRank = options.decode.lane.rank;
    this.decodeMaxModelLen = options.decode.config.maxModelLen;
    this.transferTimeoutMs = options.transferTimeoutMs ?? 60_000;
    this.onOutputs = options.onOutputs;
    this.prefill = new EngineCore(options.prefill.lane, options.prefill.config, { onOutputs: (batch) => this.onPrefillOutputs(batch) });
    this.decode = new EngineCore(options.decode.lane, options.decode.config, { onOutputs: (batch) => this.onDecodeOutputs(batch), kvLoads: this });
  }

  /** The first token is sampled on the prefill side, where no grammar mask applies. */
  get takesGrammars(): boolean {
    return false;
  }

  get timings(): StepTimingRing {
    return this.decode.timings;
  }

  /** The decode side's KV blocks and queues, both sides' requests and counters, the prefill side's blocks apart. */
  get stats(): EngineStats {
    const p = this.prefill.stats;
    const d = this.decode.stats;
    return {
      ...d,
      numRunning: p.numRunning + d.numRunning,
      numWaiting: p.numWaiting + d.numWaiting,
      numPreemptions: p.numPreemptions + d.numPreemptions,
      numSteps: p.numSteps + d.numSteps,
      numPrefixQueryTokens: p.numPrefixQueryTokens + d.numPrefixQueryTokens,
      numPrefixHitTokens: p.numPrefixHitTokens + d.numPrefixHitTokens,
      numSinkErrors: p.numSinkErrors + d.numSinkErrors,
      numKvTransferBytes: d.numKvTransferBytes ?? 0,
      prefillKv: { numFreeBlocks: p.numFreeBlocks, numBlocks: p.numBlocks, numHeldBlocks: this.prefill.numHeldBlocks },
    };
  }

  /** Loads that failed and were recomputed on the decode side. */
  get kvLoadFailures(): number {
    return this.numLoadFailures;
  }

  submit(req: EngineRequest): void {
    if (req.grammar != null) throw new RequestRejectedError(`request ${req.id}: structured outputs are not available with prefill/decode disaggregation`);
    if (this.live.has(req.id)) throw new RequestRejectedError(`request ${req.id}: a request with this id is already running`);
    // Nothing to decode, or image features that live on the prefill worker (a failed load could not recompute
    // them on the decode side): the prefill side serves the request alone.
    if (req.stop.maxTokens <= 1 || (req.media?.spans.length ?? 0) > 0 || req.embedsHandle !== undefined || req.positionsHandle !== undefined || req.encoderStatesHandle !== undefined) {
      this.prefill.submit(req);
      return;
    }
    const split: SplitRequest = { request: req, phase: "prefill", held: false, transferId: -1, numCachedTokens: 0 };
    this.prefill.submit({ ...req, stop: { ...req.stop, maxTokens: 1 }, kvTransfer: { role: "producer" } });
    this.live.set(req.id, split);
  }

  abort(requestId: RequestId): void {
    const split = this.live.get(requestId);
    if (split === undefined) {
      this.prefill.abort(requestId);
      return;
    }
    if (split.phase === "prefill") this.prefill.abort(requestId);
    else this.decode.abort(requestId);
  }

  async close(): Promise<void> {
    for (const t of this.transfers.values()) clearTimeout(t.timer);
    this.transfers.clear();
    await Promise.all([this.prefill.close(), this.decode.close()]);
  }

  checkIntegrity(): void {
    this.prefill.checkIntegrity();
    this.decode.checkIntegrity();
  }

  // ------------------------------------------------------------ the decode core's loads

  loadsStarted(loads: readonly KvLoad[]): void {
    const sends: KvTransfer[] = [];
    for (const load of loads) {
      const split = this.live.get(load.request.id);
      if (split === undefined) continue;
      split.transferId = load.transferId;
      const timer = setTimeout(() => this.endTransfer(load.transferId), this.transferTimeoutMs);
      timer.unref();
      this.transfers.set(load.transferId, { requestId: split.request.id, timer });
      sends.push({
        transfer_id: load.transferId,
        request_id: split.request.id,
        peer_rank: this.decodeRank,
        block_ids: Int32Array.from(load.remoteBlockIds),
        num_tokens: load.numTokens,
      });
    }
    if (sends.length > 0) this.prefillLane.addKvSends(sends);
  }

  loadFinished(transferId: number, ok: boolean, _error: string | null): void {
    // A load cancelled because its request ended is no failure of the transfer.
    if (!ok && this.transfers.has(transferId)) this.numLoadFailures++;
    this.endTransfer(transferId);
  }

  // ------------------------------------------------------------ outputs

  /** Requests the prefill side serves alone pass through; a split request's first token moves it to the decode side. */
  private onPrefillOutputs(batch: EngineOutputs): void {
    const client = new EngineOutputs(batch.numPlain);
    batch.forEach((out) => {
      const split = this.live.get(out.requestId);
      if (split === undefined || split.phase !== "prefill") client.add(out);
      else this.onPrefillOutput(split, out, client);
    });
    if (client.size > 0) this.onOutputs(client);
  }

  private onPrefillOutput(split: SplitRequest, out: RequestOutput, client: EngineOutputs): void {
    const req = split.request;
    const heldBlocks = out.finished && out.finishReason === "length" ? this.prefill.heldBlocks(req.id) : null;
    const firstToken = out.newTokenIds[0];
    if (heldBlocks === null || firstToken === undefined || req.promptIds.length + 1 >= this.decodeMaxModelLen) {
      // Ended on the prefill side (a stop token, the length limit, an abort or an error).
      this.prefill.releaseHeld(req.id);
      this.live.delete(req.id);
      client.add(out);
      return;
    }
    split.held = true;
    split.phase = "decode";
    split.numCachedTokens = out.numCachedTokens;
    const decodeRequest: EngineRequest = {
      id: req.id,
      promptIds: [...req.promptIds, firstToken],
      // The worker counts the first token as an output (Request.numWorkerPromptTokens): sampling goes as it is.
      sampling: req.sampling,
      stop: { ...req.stop, maxTokens: req.stop.maxTokens - 1, minTokens: Math.max(0, req.stop.minTokens - 1) },
      priority: req.priority,
      arrivalMs: req.arrivalMs,
      kvTransfer: { role: "consumer", peerRank: this.prefillLane.rank, remoteBlockIds: [...heldBlocks], numTokens: req.promptIds.length },
    };
    // The first token reaches the client as a token of a request that goes on.
    const first: RequestOutput = { ...out, finished: false, finishReason: null, stopTokenId: null, error: null };
    delete first.timing;
    try {
      this.decode.submit(decodeRequest);
    } catch (error) {
      this.releaseHeld(split);
      this.live.delete(req.id);
      client.add({ ...out, finishReason: "error", error: (error as Error).message });
      return;
    }
    client.add(first);
  }

  /** The decode side's batch goes on as it is, with the client's cached-token count (the prefill side's hits). */
  private onDecodeOutputs(batch: EngineOutputs): void {
    const plain = batch.plain;
    for (let i = 0, at = 0; i < batch.numPlain; i++, at += 3) {
      const split = this.live.get(plain[at] as number);
      if (split !== undefined) plain[at + 2] = split.numCachedTokens;
    }
    const rich = batch.rich;
    for (let i = 0; i < rich.length; i++) {
      const out = rich[i] as RequestOutput;
      const split = this.live.get(out.requestId);
      if (split === undefined) continue;
      if (out.finished) {
        this.live.delete(split.request.id);
        // Ended before its load started, or while it ran (the cancel keeps the late bytes out of the decode cache).
        if (split.transferId >= 0) this.endTransfer(split.transferId);
        else this.releaseHeld(split);
      }
      if (out.numCachedTokens !== split.numCachedTokens) rich[i] = { ...out, numCachedTokens: split.numCachedTokens };
    }
    this.onOutputs(batch);
  }

  private endTransfer(transferId: number): void {
    const transfer = this.transfers.get(transferId);
    if (transfer === undefined) return;
    this.transfers.delete(transferId);
    clearTimeout(transfer.timer);
    this.prefill.releaseHeld(transfer.requestId);
  }

  private releaseHeld(split: SplitRequest): void {
    if (!split.held) return;
    split.held = false;
    this.prefill.releaseHeld(split.request.id);
  }
}
