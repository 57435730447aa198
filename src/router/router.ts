// Which data-parallel replica (engine core + its worker) takes a request.
//
// cache-aware (the default), after SGLang's router: while the replicas' loads
// are balanced, a request goes to the replica that holds the longest prefix
// of its prompt, as far as the router knows (ApproximatePrefixTree: every
// prompt routed so far, by replica); if no replica holds more than
// cacheThreshold of it, to the replica holding the least (most room to cache
// a new prefix). When the loads are out of balance (the busiest has more than
// balanceAbsThreshold requests more than the idlest AND more than
// balanceRelThreshold times as many), the least loaded replica takes it,
// cache or not. Load is the replica's requests routed and not finished.
//
// It routes on token ids, not on text: the frontend has tokenized (and
// rendered the chat template) before a request reaches the engine, token ids
// are what the engines' prefix caches are keyed by (a text match can differ
// from a token match at its end), and every endpoint (completions, chat,
// /generate with token ids) arrives in the same form.
//
// round-robin: the next serving replica in turn.
//
// Replicas whose worker is down are skipped by both (their requests wait for
// the restart in their own engine, under its migration rules); with none
// serving, the least loaded replica takes the request and it waits there.

import { ApproximatePrefixTree } from "./prefix-tree.js";

export type RouterPolicy = "cache-aware" | "round-robin";
export const ROUTER_POLICIES: readonly RouterPolicy[] = ["cache-aware", "round-robin"];

/** Why a replica was chosen (the reason label of baton:router_requests_total). */
export type RouteReason = "cache_hit" | "cache_miss" | "load_balance" | "round_robin";
export const ROUTE_REASONS: readonly RouteReason[] = ["cache_hit", "cache_miss", "load_balance", "round_robin"];

export interface CacheAwareSettings {
  /** A replica holding more than this fraction of the prompt takes it (0..1). */
  cacheThreshold: number;
  /** Loads are out of balance when max - min exceeds this ... */
  balanceAbsThreshold: number;
  /** ... and max exceeds this times min. */
  balanceRelThreshold: number;
}

/** Where a replica's share of the tree is cut to once it passes its KV capacity. */
const EVICT_TO = 0.9;

/** SGLang's router defaults. */
export const CACHE_AWARE_DEFAULTS: CacheAwareSettings = { cacheThreshold: 0.3, balanceAbsThreshold: 64, balanceRelThreshold: 1.5 };

export interface RouteDecision {
  replica: number;
  reason: RouteReason;
}

export interface ReplicaRouter {
  /**
   * Chooses a replica for a prompt and records it there. `serving[i]`: replica
   * i's worker is up; `load[i]`: its requests routed and not finished.
   */
  route(promptIds: readonly number[], serving: readonly boolean[], load: readonly number[]): RouteDecision;
  /** The replica's engine lost its prefix cache (its worker died). */
  forget(replica: number): void;
}

/** Indices of the serving replicas; all of them when none serves. */
function candidates(serving: readonly boolean[]): number[] {
  const up = serving.flatMap((s, i) => (s ? [i] : []));
  return up.length > 0 ? up : serving.map((_, i) => i);
}

/** The candidate with the smallest key, ties to the lower load, then the lower index. */
function smallest(ids: readonly number[], key: (i: number) => number, load: readonly number[]): number {
  let best = ids[0] as number;
  for (const i of ids) {
    const k = key(i);
    const kb = key(best);
    if (k < kb || (k === kb && (load[i] as number) < (load[best] as number))) best = i;
  }
  return best;
}

export class RoundRobinRouter implements ReplicaRouter {
  private next = 0;

  route(_promptIds: readonly number[], serving: readonly boolean[], _load?: readonly number[]): RouteDecision {
    const n = serving.length;
    for (let k = 0; k < n; k++) {
      const i = (this.next + k) % n;
      if (serving[i] === true || !serving.includes(true)) {
        this.next = (i + 1) % n;
        return { replica: i, reason: "round_robin" };
      }
    }
    return { replica: 0, reason: "round_robin" };
  }

  forget(): void {}
}

export class CacheAwareRouter implements ReplicaRouter {
  readonly tree = new ApproximatePrefixTree();

  /** capacityTokens[i]: what replica i's KV cache holds (its share of the tree is capped there). */
  constructor(
    private readonly settings: CacheAwareSettings,
    private readonly capacityTokens: readonly number[],
  ) {}

  route(promptIds: readonly number[], serving: readonly boolean[], load: readonly number[]): RouteDecision {
    const ids = candidates(serving);
    const decision = this.choose(promptIds, ids, load);
    this.tree.insert(promptIds, decision.replica);
    // Past its capacity, a replica's share is cut to 90% of it, so the walk that eviction takes comes once per many requests.
    const capacity = this.capacityTokens[decision.replica] ?? Number.POSITIVE_INFINITY;
    if (this.tree.size(decision.replica) > capacity) this.tree.evict(decision.replica, Math.floor(capacity * EVICT_TO));
    return decision;
  }

  forget(replica: number): void {
    this.tree.removeTenant(replica);
  }

  private choose(promptIds: readonly number[], ids: readonly number[], load: readonly number[]): RouteDecision {
    const loads = ids.map((i) => load[i] as number);
    const max = Math.max(...loads);
    const min = Math.min(...loads);
    const { cacheThreshold, balanceAbsThreshold, balanceRelThreshold } = this.settings;
    if (max - min > balanceAbsThreshold && max > min * balanceRelThreshold) {
      return { replica: smallest(ids, (i) => load[i] as number, load), reason: "load_balance" };
    }
    const matched = this.tree.match(promptIds);
    const best = smallest(ids, (i) => -(matched.get(i) ?? 0), load);
    if ((matched.get(best) ?? 0) > cacheThreshold * promptIds.length) return { replica: best, reason: "cache_hit" };
    return { replica: smallest(ids, (i) => this.tree.size(i), load), reason: "cache_miss" };
  }
}

export interface RouterOptions extends CacheAwareSettings {
  policy: RouterPolicy;
}

export function createRouter(options: RouterOptions, capacityTokens: readonly number[]): ReplicaRouter {
  return options.policy === "round-robin" ? new RoundRobinRouter() : new CacheAwareRouter(options, capacityTokens);
}
