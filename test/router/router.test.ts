// The data-parallel router: its approximate prefix tree (longest prefix per
// replica, LRU eviction to a token cap, forgetting a replica) and the
// cache-aware and round-robin choices. Served end to end by
// test/e2e/data-parallel.test.ts.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ApproximatePrefixTree } from "../../src/router/prefix-tree.js";
import { CacheAwareRouter, RoundRobinRouter, CACHE_AWARE_DEFAULTS } from "../../src/router/router.js";
import { routingKey } from "../../src/engine-host/data-parallel.js";

const range = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i);

describe("ApproximatePrefixTree", () => {
  test("longest prefix per tenant, across split edges", () => {
    const tree = new ApproximatePrefixTree();
    tree.insert([1, 2, 3, 4, 5], 0);
    tree.insert([1, 2, 3, 9], 1);
    tree.insert([1, 2, 7], 0);
    assert.deepEqual(tree.match([1, 2, 3, 4, 5, 6]), new Map([[0, 5], [1, 3]]));
    assert.deepEqual(tree.match([1, 2, 3, 9, 9]), new Map([[0, 3], [1, 4]]));
    assert.deepEqual(tree.match([1, 2, 7, 7]), new Map([[0, 3], [1, 2]]));
    assert.deepEqual(tree.match([5]), new Map());
    // Sizes count each tenant's tokens once: 0 holds 1,2,3,4,5 and 7; 1 holds 1,2,3,9.
    assert.equal(tree.size(0), 6);
    assert.equal(tree.size(1), 4);
  });

  test("eviction drops the tenant's least recently used leaves first, down to the cap", () => {
    const tree = new ApproximatePrefixTree();
    tree.insert([...range(0, 10), ...range(100, 10)], 0); // A: shared 10 + own 10
    tree.insert([...range(0, 10), ...range(200, 10)], 0); // B
    tree.insert([...range(0, 10), ...range(200, 10)], 1); // B on another tenant
    tree.match([...range(0, 10), ...range(100, 10)]); // A used last
    assert.equal(tree.size(0), 30);
    tree.evict(0, 25);
    // B's tail went (least recently used); A and the shared part stay.
    assert.equal(tree.size(0), 20);
    assert.equal(tree.match([...range(0, 10), ...range(100, 10)]).get(0), 20);
    assert.equal(tree.match([...range(0, 10), ...range(200, 10)]).get(0), 10);
    // Tenant 1 keeps B.
    assert.equal(tree.match([...range(0, 10), ...range(200, 10)]).get(1), 20);
    tree.evict(0, 0);
    assert.equal(tree.size(0), 0);
    assert.equal(tree.match(range(0, 5)).get(0), undefined);
    assert.equal(tree.match(range(0, 5)).get(1), 5);
  });

  test("removing a tenant forgets it and frees nodes nobody holds", () => {
    const tree = new ApproximatePrefixTree();
    tree.insert([1, 2, 3], 0);
    tree.insert([1, 2, 4], 1);
    tree.removeTenant(0);
    assert.equal(tree.size(0), 0);
    assert.deepEqual(tree.match([1, 2, 3]), new Map([[1, 2]]));
    assert.equal(tree.nodeCount, 2);
    tree.removeTenant(1);
    assert.equal(tree.nodeCount, 0);
  });
});

describe("CacheAwareRouter", () => {
  const systemA = range(1000, 64);
  const systemB = range(2000, 64);
  const prompt = (system: number[], user: number): number[] => [...system, user, user + 1];

  test("same prefix, same replica; a new prefix goes to the replica holding least", () => {
    const router = new CacheAwareRouter(CACHE_AWARE_DEFAULTS, [1e6, 1e6]);
    const up = [true, true];
    assert.deepEqual(router.route(prompt(systemA, 1), up, [0, 0]), { replica: 0, reason: "cache_miss" });
    assert.deepEqual(router.route(prompt(systemB, 1), up, [1, 0]), { replica: 1, reason: "cache_miss" });
    assert.deepEqual(router.route(prompt(systemA, 5), up, [1, 1]), { replica: 0, reason: "cache_hit" });
    assert.deepEqual(router.route(prompt(systemB, 5), up, [2, 1]), { replica: 1, reason: "cache_hit" });
  });

  test("out of balance: the least loaded replica takes it, cache or not", () => {
    const router = new CacheAwareRouter({ cacheThreshold: 0.3, balanceAbsThreshold: 4, balanceRelThreshold: 1.5 }, [1e6, 1e6]);
    router.route(prompt(systemA, 1), [true, true], [0, 0]);
    // 10 vs 5: 5 more (> 4) and 10 > 1.5 * 5: out of balance.
    assert.deepEqual(router.route(prompt(systemA, 2), [true, true], [10, 5]), { replica: 1, reason: "load_balance" });
    // 6 vs 3: abs 3 <= 4: balanced, the cache decides.
    assert.deepEqual(router.route(prompt(systemA, 1), [true, true], [6, 3]), { replica: 0, reason: "cache_hit" });
  });

  test("a replica that is down is routed around, and its cache is forgotten", () => {
    const router = new CacheAwareRouter(CACHE_AWARE_DEFAULTS, [1e6, 1e6]);
    router.route(prompt(systemA, 1), [true, true], [0, 0]);
    assert.equal(router.route(prompt(systemA, 2), [false, true], [1, 0]).replica, 1);
    router.forget(0);
    // Replica 1 now holds A (it served it while 0 was down); 0 forgot it.
    assert.deepEqual(router.route(prompt(systemA, 3), [true, true], [0, 0]), { replica: 1, reason: "cache_hit" });
    // Nobody serving: still a choice (the request waits there for the restart).
    assert.equal(typeof router.route(prompt(systemB, 1), [false, false], [0, 0]).replica, "number");
  });

  test("what the router believes a replica holds is capped at its KV capacity", () => {
    const router = new CacheAwareRouter(CACHE_AWARE_DEFAULTS, [100, 100]);
    for (let g = 0; g < 10; g++) router.route(prompt(range(10_000 * (g + 1), 64), 0), [true, false], [0, 0]);
    assert.ok(router.tree.size(0) <= 100);
    assert.ok(router.tree.size(0) > 0);
  });
});

describe("RoundRobinRouter", () => {
  test("takes turns over the serving replicas", () => {
    const router = new RoundRobinRouter();
    const turns = [0, 1, 2, 3].map(() => router.route([1], [true, true, true], [0, 0, 0]).replica);
    assert.deepEqual(turns, [0, 1, 2, 0]);
    const skipping = [0, 1, 2].map(() => router.route([1], [true, false, true], [0, 0, 0]).replica);
    assert.deepEqual(skipping, [2, 0, 2]);
  });
});

describe("replicaCudaDevice", () => {
  test("replica i sees the i-th visible GPU, or GPU i with --device cuda", async () => {
    const { replicaCudaDevice } = await import("../../src/engine-host/data-parallel.js");
    assert.equal(replicaCudaDevice(1, "cuda", {}), "1");
    assert.equal(replicaCudaDevice(1, "auto", {}), null);
    assert.equal(replicaCudaDevice(1, "cpu", { CUDA_VISIBLE_DEVICES: "4,5" }), null);
    assert.equal(replicaCudaDevice(1, "auto", { CUDA_VISIBLE_DEVICES: "4,5" }), "5");
    assert.equal(replicaCudaDevice(2, "cuda", { CUDA_VISIBLE_DEVICES: "4,5" }), "4");
  });
});

describe("routing LoRA requests", () => {
  test("the same prompt on another adapter is another prefix; an adapter's requests meet again", () => {
    const router = new CacheAwareRouter(CACHE_AWARE_DEFAULTS, [1e6, 1e6]);
    const prompt = range(0, 40);
    const up = [true, true];
    const base = router.route(routingKey({ promptIds: prompt }), up, [0, 0]);
    // The base model's cached prefix is no hit for adapter 1: it goes where the tree is smaller.
    const first = router.route(routingKey({ promptIds: prompt, loraId: 1 }), up, [1, 0]);
    assert.equal(first.reason, "cache_miss");
    assert.notEqual(first.replica, base.replica);
    const again = router.route(routingKey({ promptIds: [...prompt, 99], loraId: 1 }), up, [1, 1]);
    assert.deepEqual(again, { replica: first.replica, reason: "cache_hit" });
    const other = router.route(routingKey({ promptIds: prompt, loraId: 2 }), up, [1, 2]);
    assert.equal(other.reason, "cache_miss");
    assert.deepEqual(routingKey({ promptIds: [5, 6], loraId: 0 }), [5, 6]);
  });
});
