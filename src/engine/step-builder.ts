// Turns a SchedulerOutput into the wire Step: only deltas cross the seam.
// A request's tokens and sampling parameters go once, in `added`; its block
// ids go once, when first assigned (Request.numSentBlocks tracks what the
// worker has). Per-row arrays are views into one buffer: one allocation per
// step, sized by rows and new blocks, never by total tokens.

import type { AddedRequest, KvTransfer, LoraWork, StepMessage } from "../transport/messages.js";
import type { Request } from "./request.js";
import type { KvLoad, SchedulerOutput } from "./scheduler.js";

/** lora: the adapter loads and unloads that go first (engine/lora.ts); null: none. */
export function buildStepMessage(out: SchedulerOutput, stepId: number, lora: LoraWork | null = null): StepMessage {
  const numRows = out.requests.length;
  let numNewBlocks = 0;
  for (const request of out.requests) numNewBlocks += request.blockIds.length - request.numSentBlocks;

  const ints = new Int32Array(out.removed.length + 4 * numRows + numNewBlocks);
  let at = 0;
  const view = (length: number): Int32Array => ints.subarray(at, (at += length));
  const removed = view(out.removed.length);
  const reqIds = view(numRows);
  const numNewTokens = view(numRows);
  const numComputed = view(numRows);
  const newBlockCounts = view(numRows);
  const newBlockIds = view(numNewBlocks);
  const sample = new Uint8Array(numRows);

  for (let i = 0; i < out.removed.length; i++) removed[i] = out.removed[i] as number;
  let blockAt = 0;
  for (let i = 0; i < numRows; i++) {
    const request = out.requests[i] as Request;
    reqIds[i] = request.id;
    numNewTokens[i] = out.numNewTokens[i] as number;
    numComputed[i] = out.numComputedBefore[i] as number;
    sample[i] = out.sample[i] as number;
    const table = request.blockIds;
    newBlockCounts[i] = table.length - request.numSentBlocks;
    for (let b = request.numSentBlocks; b < table.length; b++) newBlockIds[blockAt++] = table[b] as number;
    request.numSentBlocks = table.length;
  }

  return {
    kind: "Step",
    step_id: stepId,
    added: out.added.map(addedRequest),
    removed,
    req_ids: reqIds,
    num_new_tokens: numNewTokens,
    num_computed: numComputed,
    new_block_counts: newBlockCounts,
    new_block_ids: newBlockIds,
    sample,
    // Grammar-constrained rows are marked by the engine core after building (engine/step-masks.ts).
    mask_rows: NO_IDS,
    // Graph work (prompts, stateless passes, releases) is attached by the worker lane that sends the step.
    graph: null,
    // KV connector: loads and cancels are this engine's own; a prefill worker's sends are attached by its lane.
    kv: out.kvLoads.length === 0 && out.kvCancels.length === 0 ? null : { sends: [], loads: out.kvLoads.map(kvLoadOf), cancels: Int32Array.from(out.kvCancels) },
    lora,
    spec: out.draftIds.length === 0 ? null : { draft_counts: Int32Array.from(out.numDrafts), draft_ids: Int32Array.from(out.draftIds) },
  };
}

const NO_IDS = new Int32Array(0);

function kvLoadOf(load: KvLoad): KvTransfer {
  return {
    transfer_id: load.transferId,
    request_id: load.request.id,
    peer_rank: load.request.kvTransfer?.role === "consumer" ? load.request.kvTransfer.peerRank : -1,
    block_ids: Int32Array.from(load.blockIds),
    num_tokens: load.numTokens,
  };
}

/** Everything the worker keeps for a request; a resumed request brings its outputs so far. */
function addedRequest(request: Request): AddedRequest {
  return {
    req_id: request.id,
    token_ids: Int32Array.from(request.tokenIds),
    num_prompt_tokens: request.numWorkerPromptTokens,
    sampling: request.sampling,
    prompt_logprobs: request.needsPromptLogprobs ? request.promptLogprobs : -1,
    embeds: request.embeds,
    lora_id: request.loraId,
    positions: request.positions,
    encoder_states: request.encoderStates,
    cross_block_ids: request.crossBlockIds.length === 0 ? NO_IDS : Int32Array.from(request.crossBlockIds),
  };
}
