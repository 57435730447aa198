import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Request } from "../../src/engine/request.js";
import { checkStop } from "../../src/engine/stop-checker.js";
import type { StopConditions } from "../../src/engine/types.js";
import { makeRequest } from "./fake-executor.js";

function after(tokens: number[], stop: Partial<StopConditions>, prompt = [1, 2]): Request {
  const request = new Request(makeRequest(prompt, stop));
  for (const t of tokens) request.appendOutputToken(t);
  return request;
}

describe("checkStop", () => {
  it("goes on without a stop condition", () => {
    assert.equal(checkStop(after([5], { eosTokenIds: [0] }), 100), null);
  });

  it("EOS and stop tokens stop; EOS wins over length in the same token", () => {
    assert.deepEqual(checkStop(after([5, 0], { eosTokenIds: [0], maxTokens: 2 }), 100), { reason: "stop", stopTokenId: 0 });
    assert.deepEqual(checkStop(after([9], { stopTokenIds: [9] }), 100), { reason: "stop", stopTokenId: 9 });
  });

  it("ignoreEos skips EOS only", () => {
    assert.equal(checkStop(after([0], { eosTokenIds: [0], ignoreEos: true }), 100), null);
    assert.equal(checkStop(after([0], { eosTokenIds: [0], stopTokenIds: [0], ignoreEos: true }), 100)?.reason, "stop");
  });

  it("minTokens holds back EOS and stop tokens but not length", () => {
    assert.equal(checkStop(after([0], { eosTokenIds: [0], stopTokenIds: [0], minTokens: 2 }), 100), null);
    assert.equal(checkStop(after([3, 0], { eosTokenIds: [0], minTokens: 2 }), 100)?.stopTokenId, 0);
    assert.equal(checkStop(after([3], { minTokens: 5, maxTokens: 1 }), 100)?.reason, "length");
  });

  it("max model length counts prompt plus output", () => {
    assert.equal(checkStop(after([3], {}, [1, 2, 3]), 5), null);
    assert.deepEqual(checkStop(after([3, 4], {}, [1, 2, 3]), 5), { reason: "length", stopTokenId: null });
  });
});
