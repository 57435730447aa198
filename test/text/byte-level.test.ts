// The pure-JS byte-level decoder must equal the native tokenizers decode
// exactly: every id alone, random id sequences (partial characters, special
// and unknown ids), and streamed through the detokenizer.

import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, test } from "node:test";
import { DetokenizerBatcher, type BatchDecoder } from "../../src/text/detokenizer.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { fixturesDir, qwenTokenizerPath } from "./helpers.js";

/** A deterministic PRNG (mulberry32). */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const TEXTS = [
  " The quick brown fox jumps over the lazy dog.",
  " Hello 世界! 日本語のテキストも処理できますか？ 한국어도요.",
  " emoji 🙂🚀👩‍👩‍👧🫠𝔘 and flags 🇩🇪🇯🇵 mixed with ñ, é, ß, ﬁ, Ω.",
  "\n\n  leading spaces and  double  spaces\tand tabs\r\n",
  "😀",
  "```ts\nconst x = `${a}` + '\\u00e9';\n```",
];

describe("ByteLevelDecoder: Qwen3", () => {
  const tokenizer = TextTokenizer.fromFile(qwenTokenizerPath);
  const fast = tokenizer.byteLevel;

  test("is built for the byte-level BPE tokenizer", () => {
    assert.ok(fast !== null);
  });

  for (const skip of [true, false]) {
    test(`every id alone decodes as the native tokenizer does (skipSpecialTokens=${skip})`, async () => {
      const size = tokenizer.vocabSize + 300; // past the end too: unknown ids are dropped
      const batch: number[][] = [];
      for (let id = 0; id < size; id++) batch.push([id]);
      const native = await tokenizer.decodeBatch(batch, skip);
      for (let id = 0; id < size; id++) {
        if (fast!.decode([id], 0, 1, skip) !== native[id]) assert.fail(`id ${id}: ${JSON.stringify(fast!.decode([id], 0, 1, skip))} vs ${JSON.stringify(native[id])}`);
      }
    });
  }

  test("random id sequences (partial characters, special and unknown ids) decode exactly", async () => {
    const random = rng(7);
    const vocab = tokenizer.vocabSize;
    const seqs: number[][] = [];
    for (let n = 0; n < 3000; n++) {
      const len = 1 + Math.floor(random() * 8);
      const seq: number[] = [];
      for (let i = 0; i < len; i++) {
        const r = random();
        // Byte tokens (0..255) and the top of the vocabulary are where the edge cases live.
        seq.push(r < 0.4 ? Math.floor(random() * 256) : r < 0.5 ? vocab - 40 + Math.floor(random() * 80) : Math.floor(random() * vocab));
      }
      seqs.push(seq);
    }
    for (const skip of [true, false]) {
      const native = await tokenizer.decodeBatch(seqs, skip);
      seqs.forEach((seq, i) => assert.equal(fast!.decode(seq, 0, seq.length, skip), native[i], JSON.stringify(seq)));
    }
  });

  test("encoded text round-trips", async () => {
    for (const text of TEXTS) {
      const ids = await tokenizer.encode(text, false);
      assert.equal(fast!.decode(ids), await tokenizer.decode(ids, true));
    }
  });

  test("streaming through the fast path equals the native path, piece by piece", async () => {
    // The same tokenizer without its byte-level decoder: the native decodeBatch path.
    const nativeOnly: BatchDecoder = { decodeBatch: (batch, skip) => tokenizer.decodeBatch(batch, skip) };
    const random = rng(11);
    const cases: { prompt: number[]; output: number[] }[] = [];
    for (const text of TEXTS) cases.push({ prompt: await tokenizer.encode("Prompt:", false), output: await tokenizer.encode(text, false) });
    for (let n = 0; n < 200; n++) {
      const output: number[] = [];
      for (let i = 0; i < 1 + Math.floor(random() * 24); i++) output.push(random() < 0.5 ? Math.floor(random() * 256) : Math.floor(random() * tokenizer.vocabSize));
      cases.push({ prompt: [9707, 11], output });
    }
    for (const skip of [true, false]) {
      for (const { prompt, output } of cases) {
        const fastBatcher = new DetokenizerBatcher(tokenizer);
        const slowBatcher = new DetokenizerBatcher(nativeOnly);
        const a = fastBatcher.session(prompt, skip);
        const b = slowBatcher.session(prompt, skip);
        for (let i = 0; i < output.length; ) {
          const step = 1 + Math.floor(random() * 3);
          const ids = output.slice(i, i + step);
          i += step;
          const final = i >= output.length;
          assert.equal(await a.push(ids, final), await b.push(ids, final), JSON.stringify({ prompt, output, i }));
        }
      }
    }
  });
});

describe("ByteLevelDecoder: other tokenizers keep the native path", () => {
  for (const fixture of ["llama2-style.json", "metaspace.json"]) {
    test(fixture, () => {
      assert.equal(TextTokenizer.fromFile(join(fixturesDir, fixture)).byteLevel, null);
    });
  }
});
