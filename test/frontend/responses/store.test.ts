// The Responses API's store: least recently used entries go first past the
// byte cap, entries expire after the TTL, running (pinned) entries stay until
// they settle, and an entry larger than the cap is not kept.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { ResponseObject } from "../../../src/frontend/responses/items.js";
import { ResponseStore, type StoredResponse } from "../../../src/frontend/responses/store.js";

/** A stored response whose JSON is about `size` bytes (its instructions pad it). */
function entry(id: string, size = 1000): StoredResponse {
  const response = { id, object: "response", status: "completed", output: [], instructions: "" } as unknown as ResponseObject;
  const base = Buffer.byteLength(JSON.stringify({ response, inputItems: [] }));
  response.instructions = "x".repeat(Math.max(0, size - base));
  return { response, inputItems: [] };
}

function clock(): { now: () => number; advance: (ms: number) => void } {
  let t = 1_000_000;
  return { now: () => t, advance: (ms) => (t += ms) };
}

describe("ResponseStore", () => {
  test("bytes are the entries' JSON size; past the cap the least recently used go first", () => {
    const store = new ResponseStore({ maxBytes: 3000, ttlMs: 60_000 });
    assert.ok(store.put("a", entry("a")));
    assert.ok(store.put("b", entry("b")));
    assert.ok(store.put("c", entry("c")));
    assert.equal(store.bytes, 3000);
    // Reading "a" makes "b" the least recently used.
    assert.equal(store.get("a")?.response.id, "a");
    assert.ok(store.put("d", entry("d")));
    assert.equal(store.get("b"), undefined);
    assert.deepEqual(["a", "c", "d"].map((id) => store.get(id)?.response.id), ["a", "c", "d"]);
    assert.equal(store.size, 3);
    assert.ok(store.bytes <= 3000);
  });

  test("replacing an entry counts its new size only", () => {
    const store = new ResponseStore({ maxBytes: 10_000, ttlMs: 60_000 });
    store.put("a", entry("a", 1000));
    store.put("a", entry("a", 4000));
    assert.equal(store.bytes, 4000);
    assert.equal(store.size, 1);
    assert.ok(store.delete("a"));
    assert.equal(store.bytes, 0);
    assert.equal(store.delete("a"), false);
  });

  test("an entry larger than the whole cap is not kept", () => {
    const store = new ResponseStore({ maxBytes: 2000, ttlMs: 60_000 });
    store.put("small", entry("small"));
    assert.equal(store.put("huge", entry("huge", 5000)), false);
    assert.equal(store.get("huge"), undefined);
    // It pushed nothing out.
    assert.equal(store.get("small")?.response.id, "small");
    assert.equal(store.bytes, 1000);
  });

  test("entries expire after the TTL", () => {
    const time = clock();
    const store = new ResponseStore({ maxBytes: 1_000_000, ttlMs: 10_000, now: time.now });
    store.put("old", entry("old"));
    time.advance(6_000);
    store.put("new", entry("new"));
    time.advance(5_000);
    assert.equal(store.get("old"), undefined, "expired on read");
    assert.equal(store.get("new")?.response.id, "new", "reading does not extend the TTL ...");
    time.advance(5_000);
    assert.equal(store.get("new"), undefined, "... so it expires on time");
    // Expired entries also leave on the next put's sweep.
    store.put("a", entry("a"));
    time.advance(20_000);
    store.put("b", entry("b"));
    assert.equal(store.size, 1);
    assert.equal(store.bytes, 1000);
  });

  test("a pinned (running) entry is neither evicted nor expired; put again unpinned, the rules apply", () => {
    const time = clock();
    const store = new ResponseStore({ maxBytes: 2000, ttlMs: 10_000, now: time.now });
    const running = entry("run", 1500);
    assert.ok(store.put("run", running, true));
    store.put("a", entry("a"));
    store.put("b", entry("b"));
    store.put("c", entry("c"));
    time.advance(60_000);
    assert.equal(store.get("run"), running);
    assert.equal(store.get("a"), undefined);
    // Settled: counted at its size, and the least recently used make room.
    store.put("d", entry("d"));
    assert.ok(store.put("run", running));
    assert.equal(store.get("d"), undefined);
    assert.equal(store.bytes, 1500);
    time.advance(10_000);
    assert.equal(store.get("run"), undefined);
  });

  test("a cap of 0 keeps nothing", () => {
    const store = new ResponseStore({ maxBytes: 0, ttlMs: 10_000 });
    assert.equal(store.enabled, false);
    assert.equal(store.put("a", entry("a"), true), false);
    assert.equal(store.get("a"), undefined);
  });
});
