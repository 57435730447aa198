// The text-to-speech shape: llm (prefill + decode loop, kv_cache) streams its
// sampled tokens over sliding_window(28, 7) to a stateless codec partition whose
// pass emits audio. Codec passes, chunk contents and order per token count.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { ttsLayout } from "../graph/builders.js";
import { Executor } from "./executor.js";

interface CodecPass {
  index: number;
  final: boolean;
  start: number;
  context: number;
  tokens: number[];
}

function speak(tokens: number, requests = 1): { ex: Executor; passes: Map<string, CodecPass[]> } {
  // 0 tokens: prefill's token is not streamed (the model's first sampled id is
  // end-of-audio); otherwise prefill's token is the first streamed one.
  const ex = new Executor(ttsLayout({ prefillStreams: tokens > 0 }));
  ex.placement = (name) => (name === "codec" ? 1 : 0);
  ex.tokenScripts.set("llm", (_r, i) => ({ token: 1000 + i, finish: i === Math.max(tokens, 1) - 1 ? "eos" : null }));
  const passes = new Map<string, CodecPass[]>();
  ex.on("codec", (p, e) => {
    const c = p.chunks[0]!;
    const ids = p.inputs[0]!.map((v) => (v.kind === "tokens" ? v.ids[0]! - 1000 : -1));
    const list = passes.get(e.labelOf(p.requestId)) ?? [];
    list.push({ index: c.index, final: c.final, start: c.start, context: c.contextCount, tokens: ids });
    passes.set(e.labelOf(p.requestId), list);
    // The codec decodes only the new frames of a window (the context is overlap).
    return { outputs: { audio: [e.tensor(`pcm[${ids.slice(c.contextCount).join(",")}]`, 1)] } };
  });
  for (let r = 0; r < requests; r++) ex.admit(`r${r}`, { text_inputs: [Executor.tokens(1, 2, 3)] });
  ex.run();
  return { ex, passes };
}

const range = (from: number, to: number): number[] => Array.from({ length: to - from }, (_, i) => from + i);

describe("TTS shape: llm -> sliding_window(28, 7) -> codec", () => {
  const cases: { tokens: number; chunks: [start: number, end: number, context: number][] }[] = [
    { tokens: 0, chunks: [[0, 0, 0]] },
    { tokens: 1, chunks: [[0, 1, 0]] },
    { tokens: 27, chunks: [[0, 27, 0]] },
    { tokens: 28, chunks: [[0, 28, 0], [7, 28, 21]] },
    { tokens: 29, chunks: [[0, 28, 0], [7, 29, 21]] },
    { tokens: 42, chunks: [[0, 28, 0], [7, 35, 21], [14, 42, 21], [21, 42, 21]] },
  ];
  for (const { tokens, chunks } of cases) {
    it(`${tokens} tokens: ${chunks.length} codec pass${chunks.length > 1 ? "es" : ""}, the last one final`, () => {
      const { ex, passes } = speak(tokens);
      const got = passes.get("r0")!;
      assert.deepEqual(
        got,
        chunks.map(([start, end, context], index) => ({ index, final: index === chunks.length - 1, start, context, tokens: range(start, end) })),
      );
      // Audio reaches the client in chunk order and covers every token exactly once.
      const audio = ex.clientOf("r0", "audio");
      assert.deepEqual(audio, got.map((p) => `pcm[${p.tokens.slice(p.context).join(",")}]`));
      assert.deepEqual(
        audio.flatMap((a) => a.slice(4, -1).split(",").filter((t) => t !== "")).map(Number),
        range(0, tokens),
      );
      assert.equal(ex.log[ex.log.length - 1], "done r0", "done after the last audio");
      assert.equal(ex.liveTensors(), 0, "every audio tensor released on the codec's worker");
    });
  }

  it("the first window is decoded while the LLM still decodes", () => {
    const ex = new Executor(ttsLayout());
    ex.tokenScripts.set("llm", (_r, i) => ({ token: i, finish: i === 41 ? "eos" : null }));
    const sampledAtCodec: number[] = [];
    ex.on("codec", (_p, e) => {
      sampledAtCodec.push(ex.engine.get("r/llm")?.produced ?? 42);
      return { outputs: { audio: [e.tensor("pcm")] } };
    });
    ex.admit("r", { text_inputs: [Executor.tokens(1)] });
    ex.run();
    assert.deepEqual(sampledAtCodec, [28, 35, 42, 42], "each window is decoded as soon as its last token is sampled");
  });

  it("many requests stream independently, each in order", () => {
    const { ex, passes } = speak(29, 8);
    for (let r = 0; r < 8; r++) {
      assert.deepEqual(
        passes.get(`r${r}`)!.map((p) => [p.index, p.final]),
        [
          [0, false],
          [1, true],
        ],
      );
    }
    assert.equal(ex.done.length, 8);
    assert.ok(ex.batchesSeen.some((b) => b.passes.length === 8), "codec passes of all requests batch together");
  });
});
