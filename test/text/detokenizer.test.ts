// Incremental detokenization against real tokenizers: streamed pieces must
// concatenate to the full decode, and never show U+FFFD for a character that
// is still being completed by later tokens.

import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, test } from "node:test";
import { DetokenizerBatcher } from "../../src/text/detokenizer.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { fixturesDir, qwenTokenizerPath } from "./helpers.js";

const TEXTS = [
  " The quick brown fox jumps over the lazy dog.",
  " Hello 世界! 日本語のテキストも処理できますか？",
  " emoji 🙂🚀👩‍👩‍👧🫠𝔘 and flags 🇩🇪🇯🇵 mixed with ñ, é, ß.",
  "\n\n  leading spaces and  double  spaces\tand tabs",
  "😀",
];

interface Streamed {
  pieces: string[];
  expected: string;
}

/**
 * Streams the ids of `outputText` one step at a time after the prompt; returns
 * the pieces and the reference: decode(prompt + output) minus decode(prompt).
 * joint: take the output ids from encoding prompt and output together (so a
 * SentencePiece normalizer does not prepend a second space to the output).
 */
async function stream(tokenizer: TextTokenizer, promptText: string, outputText: string, stepSize = 1, joint = false): Promise<Streamed> {
  const prompt = await tokenizer.encode(promptText, false);
  let output: number[];
  if (joint) {
    const both = await tokenizer.encode(promptText + outputText, false);
    assert.deepEqual(both.slice(0, prompt.length), prompt, "the prompt's ids are a prefix of the joint encoding");
    output = both.slice(prompt.length);
  } else {
    // Any id sequence is a possible model output; encoding the text alone gives a realistic one.
    output = await tokenizer.encode(outputText, false);
  }
  const full = [...prompt, ...output];
  const batcher = new DetokenizerBatcher(tokenizer);
  const session = batcher.session(prompt);
  const pieces: string[] = [];
  for (let i = 0; i < output.length; i += stepSize) {
    const last = i + stepSize >= output.length;
    pieces.push(await session.push(output.slice(i, i + stepSize), last));
  }
  if (output.length === 0) pieces.push(await session.push([], true));
  const promptDecoded = await tokenizer.decode(prompt, true);
  const fullDecoded = await tokenizer.decode(full, true);
  assert.ok(fullDecoded.startsWith(promptDecoded));
  return { pieces, expected: fullDecoded.slice(promptDecoded.length) };
}

function assertGood({ pieces, expected }: Streamed): void {
  assert.equal(pieces.join(""), expected);
  if (!expected.includes("\uFFFD")) {
    pieces.forEach((piece, i) => assert.ok(!piece.includes("\uFFFD"), `piece ${i} ${JSON.stringify(piece)} has U+FFFD`));
  }
}

describe("detokenizer: Qwen3 (byte-level BPE)", () => {
  const tokenizer = TextTokenizer.fromFile(qwenTokenizerPath);

  for (const text of TEXTS) {
    test(`streams ${JSON.stringify(text.slice(0, 24))} one token per step`, async () => {
      const result = await stream(tokenizer, "Some prompt:", text);
      assertGood(result);
    });
  }

  test("multi-byte characters really are split across tokens here", async () => {
    // Guards the test's premise: some emoji take several byte-level tokens each.
    const ids = await tokenizer.encode("🫠𝔘", false);
    const pieces = await Promise.all(ids.map((id) => tokenizer.decode([id], true)));
    assert.ok(pieces.some((p) => p.includes("\uFFFD")), JSON.stringify(pieces));
  });

  test("several tokens per step give the same text", async () => {
    for (const stepSize of [2, 3, 7]) assertGood(await stream(tokenizer, "Prompt", TEXTS[2]!, stepSize));
  });

  test("special tokens are skipped by default and kept on request", async () => {
    const im_end = tokenizer.tokenToId("<|im_end|>");
    assert.ok(im_end !== null);
    const prompt = await tokenizer.encode("Hi", false);
    const batcher = new DetokenizerBatcher(tokenizer);
    const skipped = batcher.session(prompt, true);
    const kept = batcher.session(prompt, false);
    const ids = [...(await tokenizer.encode(" there", false)), im_end];
    assert.equal(await skipped.push(ids, true), " there");
    assert.equal(await kept.push(ids, true), " there<|im_end|>");
  });

  test("a held-back incomplete character is flushed at the end", async () => {
    const ids = await tokenizer.encode("🫠", false);
    assert.ok(ids.length > 1);
    const session = new DetokenizerBatcher(tokenizer).session([]);
    assert.equal(await session.push(ids.slice(0, 1)), "");
    const flushed = await session.push([], true);
    assert.equal(flushed, await tokenizer.decode(ids.slice(0, 1), true));
  });

  test("sessions that receive tokens in the same tick share one decodeBatch call", async () => {
    const batcher = new DetokenizerBatcher(tokenizer);
    const sessions = await Promise.all(TEXTS.map(async (text) => ({ s: batcher.session([1, 2, 3]), ids: await tokenizer.encode(text, false) })));
    const before = batcher.decodeCalls;
    const results = await Promise.all(sessions.map(({ s, ids }) => s.push(ids.slice(0, 3))));
    assert.equal(batcher.decodeCalls - before, 1);
    assert.equal(results.length, TEXTS.length);
  });

  test("pushes made while a batch is in flight resolve in order and lose nothing", async () => {
    const ids = await tokenizer.encode(TEXTS[1]!, false);
    const batcher = new DetokenizerBatcher(tokenizer);
    const session = batcher.session([]);
    // Not awaited one by one: later pushes queue behind the batch in flight.
    const promises = ids.map((id, i) => session.push([id], i === ids.length - 1));
    const pieces = await Promise.all(promises);
    assert.equal(pieces.join(""), TEXTS[1]);
    assert.ok(batcher.decodeCalls < ids.length, "pushes queued during a batch are merged");
  });
});

for (const fixture of ["llama2-style.json", "metaspace.json"]) {
  describe(`detokenizer: SentencePiece-style ${fixture}`, () => {
    const tokenizer = TextTokenizer.fromFile(join(fixturesDir, fixture));

    for (const text of [" the quick brown fox", " Hello world, hello there.", " naïve 世界 🙂 café", "  double  spaces"]) {
      test(`keeps leading spaces: ${JSON.stringify(text)}`, async () => {
        const result = await stream(tokenizer, "Hello world", text, 1, true);
        assertGood(result);
        assert.equal(result.pieces.join(""), text);
      });
    }

    test("decoding token by token without context would lose the spaces (the bug this scheme avoids)", async () => {
      const ids = await tokenizer.encode("Hello world the fox", false);
      const naive = (await Promise.all(ids.map((id) => tokenizer.decode([id], true)))).join("");
      assert.notEqual(naive, await tokenizer.decode(ids, true));
    });

    test("byte-fallback characters are held back until complete", async () => {
      const result = await stream(tokenizer, "Hello", " 🙂世界");
      assertGood(result);
      assert.ok(result.pieces.some((p) => p === ""), "some steps emitted nothing while a character was incomplete");
    });
  });
}
