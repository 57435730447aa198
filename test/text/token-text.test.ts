// Logprob token strings on real tokenizers: a sequence's per-token strings
// (and bytes) join to its decoded text, on Qwen's byte-level BPE and on
// SentencePiece-style tokenizers (leading spaces kept, characters split over
// byte tokens); lone tokens keep their leading space and show partial
// characters as "bytes:\xNN".

import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, test } from "node:test";
import { DetokenizerBatcher } from "../../src/text/detokenizer.js";
import { TokenTextSession, textLength } from "../../src/text/token-text.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { fixturesDir, qwenTokenizerPath } from "./helpers.js";

const TEXTS = [
  "Hello world, the quick brown fox.",
  " leading space and  double  spaces",
  "naïve café 世界 日本語のテキスト",
  "emoji 🙂🚀👩‍👩‍👧 and ñ, é, ß.",
  "😀",
];

const utf8 = new TextEncoder();

const tokenizers: [string, TextTokenizer][] = [
  ["Qwen3 (byte-level BPE)", TextTokenizer.fromFile(qwenTokenizerPath)],
  ["Llama 2 style (SentencePiece, byte fallback)", TextTokenizer.fromFile(join(fixturesDir, "llama2-style.json"))],
  ["Metaspace (byte fallback)", TextTokenizer.fromFile(join(fixturesDir, "metaspace.json"))],
];

for (const [name, tokenizer] of tokenizers) {
  describe(`token strings: ${name}`, () => {
    const vocab = tokenizer.vocabulary;

    for (const text of TEXTS) {
      test(`a text's token strings and bytes join to it: ${JSON.stringify(text)}`, async () => {
        const ids = await tokenizer.encode(text, false);
        const decoded = await tokenizer.decode(ids, false);
        const session = new TokenTextSession(vocab, [], false);
        // Token by token, as a stream would deliver them.
        const entries = ids.flatMap((id, i) => session.push([id], i === ids.length - 1));
        assert.equal(entries.length, ids.length);
        assert.equal(entries.map((e) => e.text).join(""), decoded);
        assert.deepEqual(entries.flatMap((e) => e.bytes), [...utf8.encode(decoded)]);
        if (!decoded.includes("\uFFFD")) assert.ok(entries.every((e) => !e.text.includes("\uFFFD")));
      });
    }

    test("a completion's token strings equal the detokenizer's text after the same prompt", async () => {
      const prompt = await tokenizer.encode("Once upon a time", false);
      const both = await tokenizer.encode("Once upon a time there lived 世界 🙂 a naïve fox", false);
      const output = both.slice(prompt.length);
      const session = new TokenTextSession(vocab, prompt, true);
      const strings = output.flatMap((id, i) => session.push([id], i === output.length - 1).map((e) => e.text));
      const detok = new DetokenizerBatcher(tokenizer).session(prompt);
      const pieces: string[] = [];
      for (const [i, id] of output.entries()) pieces.push(await detok.push([id], i === output.length - 1));
      assert.equal(strings.join(""), pieces.join(""));
      assert.ok(strings.join("").startsWith(" there"), "the first output token keeps its leading space");
    });

    test("a character split over tokens: the tokens before the last add \"\", the last adds the character", async () => {
      const ids = await tokenizer.encode("世界🙂𠮷🫠", false);
      const session = new TokenTextSession(vocab, [], false);
      // One token at a time, keeping each entry's bytes array as a caller would.
      const entries = ids.flatMap((id, i) => session.push([id], i === ids.length - 1));
      const bytesSeen = entries.map((e) => e.bytes);
      assert.equal(entries.map((e) => e.text).join(""), "世界🙂𠮷🫠");
      assert.ok(entries.some((e) => e.text === "" && e.bytes.length > 0), "some token holds bytes but no text");
      assert.deepEqual(bytesSeen.flat(), [...utf8.encode("世界🙂𠮷🫠")], "held tokens' bytes arrays were filled in place");
    });

    test("lone tokens keep their leading space; a partial character is bytes:\\xNN", async () => {
      const [, world] = await tokenizer.encode("Hello world", false);
      assert.equal(vocab.lone(world as number), " world");
      // Rare characters are split into byte tokens by every tokenizer here.
      const ids = await tokenizer.encode("世𠮷🫠", false);
      const partial = ids.find((id) => vocab.lone(id).startsWith("bytes:"));
      assert.ok(partial !== undefined, `some token is a partial character: ${ids.map((id) => vocab.lone(id))}`);
      const raw = [...(vocab.rawBytes(partial) as Uint8Array)];
      assert.equal(vocab.lone(partial), `bytes:${raw.map((b) => `\\x${b.toString(16).padStart(2, "0")}`).join("")}`);
      assert.deepEqual(vocab.loneBytes(partial), raw);
    });
  });
}

test("textLength counts code points, as Python's len() does", () => {
  assert.equal(textLength("a🙂é"), 3);
  assert.equal("a🙂é".length, 4);
});
