// Whisper token ids -> OpenAI transcription formats, with the real GPT-2
// byte-level tokenizer (Whisper's English vocabulary is GPT-2's) for text.
// Expected segment times and texts come from transformers' WhisperTokenizer.

import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, test } from "node:test";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import {
  compressionRatio,
  formatSrt,
  formatVtt,
  transcriptSegments,
  verboseJson,
  whisperLanguageCode,
  whisperLanguageName,
  type TranscriptSegment,
} from "../../src/text/whisper-transcript.js";
import { whisperTokenIds } from "../../src/config/model-dir.js";
import { repoRoot } from "./helpers.js";

const tokenizer = TextTokenizer.fromFile(join(repoRoot, "node_modules", "@lenml", "tokenizer-gpt2", "models", "tokenizer.json"));
const byteLevel = tokenizer.byteLevel;
if (byteLevel === null) throw new Error("GPT-2's tokenizer.json should get the synchronous byte-level decoder");
const decode = (ids: number[]): string => byteLevel.decode(ids);

// The English-only Whisper layout (as in the test model's generation_config.json).
const ids = whisperTokenIds({ eos_token_id: 50256, no_timestamps_token_id: 50362, decoder_start_token_id: 50257 });
const EOT = 50256;
const SOT = 50257;
const EN = 50258;
const TRANSCRIBE = 50358;
/** The timestamp token for `seconds`. */
const T = (seconds: number): number => 50363 + Math.round(seconds / 0.02);

// tok.encode(s, add_special_tokens=False) with WhisperTokenizer.from_pretrained('/tmp/wd') (GPT-2's vocabulary).
const A = [18435, 995, 13]; // " Hello world."
const B = [1374, 389, 345, 30]; // " How are you?"
const C = [17867, 11, 5176, 0]; // " Fine, thanks!"

/** start, end, text of each segment. */
function spans(segments: readonly TranscriptSegment[]): [number, number, string][] {
  return segments.map((s) => [s.start, s.end, s.text]);
}

describe("whisperTokenIds", () => {
  test("reads the layout from generation_config.json", () => {
    assert.deepEqual(ids, { eot: 50256, noTimestamps: 50362, timestampBegin: 50363, timePrecision: 0.02 });
  });

  test("names a missing or malformed field", () => {
    assert.throws(() => whisperTokenIds({ eos_token_id: 50256 }), /no_timestamps_token_id/);
    assert.throws(() => whisperTokenIds({ no_timestamps_token_id: 50362 }), /eos_token_id/);
    assert.throws(() => whisperTokenIds({ eos_token_id: "50256", no_timestamps_token_id: 50362 }), /eos_token_id must be/);
    assert.throws(() => whisperTokenIds({ eos_token_id: 50362, no_timestamps_token_id: 50256 }), /must be above/);
    assert.throws(() => whisperTokenIds([]), /JSON object/);
  });
});

describe("transcriptSegments", () => {
  test("the decoder gives the native tokenizer's text", async () => {
    for (const t of [A, B, C]) assert.equal(decode(t), await tokenizer.decode(t, true));
  });

  test("no timestamps: one segment over the window, controls dropped", () => {
    const tokens = [...A, ...B, EOT];
    const { text, segments } = transcriptSegments(tokens, ids, decode, {
      durationSeconds: 4.2,
      temperature: 0.2,
      logprobs: [-0.5, -0.25, -0.25, -1, 0, 0, -1, -9],
      noSpeechProb: 0.01,
    });
    assert.equal(text, " Hello world. How are you?");
    assert.deepEqual(segments, [
      {
        id: 0,
        seek: 0,
        start: 0,
        end: 4.2,
        text: " Hello world. How are you?",
        tokens: [...A, ...B],
        temperature: 0.2,
        // The eot's logprob is not part of the segment: (-0.5-0.25-0.25-1-1)/7.
        avg_logprob: -3 / 7,
        compression_ratio: compressionRatio(" Hello world. How are you?"),
        no_speech_prob: 0.01,
      },
    ]);
    assert.deepEqual(transcriptSegments([EOT], ids, decode, { durationSeconds: 1 }), { text: "", segments: [] });
  });

  // Expected values: WhisperTokenizer.from_pretrained('/tmp/wd').decode(tokens, output_offsets=True)
  // (transformers 5.18.0), its `offsets` as [start, end, text]; `text` from decode(tokens, skip_special_tokens=True).
  const transformersCases: { name: string; tokens: number[]; offsets: [number, number, string][]; text: string }[] = [
    {
      name: "timestamp pairs mid-sequence and a final single timestamp",
      tokens: [50363, 18435, 995, 13, 50438, 50438, 1374, 389, 345, 30, 50513, 50523, 17867, 11, 5176, 0, 50613],
      offsets: [[0, 1.5, " Hello world."], [1.5, 3, " How are you?"], [3.2, 5, " Fine, thanks!"]],
      text: " Hello world. How are you? Fine, thanks!",
    },
    {
      name: "a trailing single timestamp then eot",
      tokens: [50363, 18435, 995, 13, 50438, 50438, 1374, 389, 345, 30, 50513, 50256],
      offsets: [[0, 1.5, " Hello world."], [1.5, 3, " How are you?"]],
      text: " Hello world. How are you?",
    },
    {
      name: "a single timestamp mid-sequence does not split",
      tokens: [50363, 18435, 995, 13, 50438, 1374, 389, 345, 30, 50513],
      offsets: [[0, 3, " Hello world. How are you?"]],
      text: " Hello world. How are you?",
    },
    {
      // transformers reads the backwards timestamp as the next 30 s window of a concatenated output.
      name: "concatenated windows (timestamps restart)",
      tokens: [50363, 18435, 995, 13, 50438, 50438, 1374, 389, 345, 30, 50513, 50363, 17867, 11, 5176, 0, 50463],
      offsets: [[0, 1.5, " Hello world."], [1.5, 3, " How are you?"], [30, 32, " Fine, thanks!"]],
      text: " Hello world. How are you? Fine, thanks!",
    },
    {
      name: "concatenated windows after a single-timestamp ending",
      tokens: [50363, 18435, 995, 13, 51763, 50388, 17867, 11, 5176, 0, 50463],
      offsets: [[0, 28, " Hello world."], [30.5, 32, " Fine, thanks!"]],
      text: " Hello world. Fine, thanks!",
    },
  ];
  for (const c of transformersCases) {
    test(`matches transformers: ${c.name}`, () => {
      const { text, segments } = transcriptSegments(c.tokens, ids, decode, { durationSeconds: 60 });
      assert.deepEqual(spans(segments), c.offsets);
      assert.equal(text, c.text);
      assert.equal(text, segments.map((s) => s.text).join(""));
      assert.deepEqual(segments.map((s) => s.id), c.offsets.map((_, i) => i));
    });
  }

  test("segment tokens run from the opening to the closing timestamp", () => {
    const { segments } = transcriptSegments(transformersCases[0]!.tokens, ids, decode, { durationSeconds: 30 });
    assert.deepEqual(segments.map((s) => s.tokens), [
      [T(0), ...A, T(1.5)],
      [T(1.5), ...B, T(3)],
      [T(3.2), ...C, T(5)],
    ]);
  });

  test("text after the last timestamp ends at the window's duration", () => {
    // transformers' _compute_offsets gives only [[0, 1.5, " Hello world."]] here and drops the cut-off text.
    const afterPair = transcriptSegments([T(0), ...A, T(1.5), T(1.5), ...B], ids, decode, { durationSeconds: 4.25 });
    assert.deepEqual(spans(afterPair.segments), [[0, 1.5, " Hello world."], [1.5, 4.25, " How are you?"]]);
    assert.deepEqual(afterPair.segments[1]!.tokens, [T(1.5), ...B]);
    assert.equal(afterPair.text, " Hello world. How are you?");

    // After a single closing timestamp, that timestamp also opens the cut-off segment.
    const afterSingle = transcriptSegments([T(0), ...A, T(1.5), ...B, EOT], ids, decode, { durationSeconds: 4.25 });
    assert.deepEqual(spans(afterSingle.segments), [[0, 1.5, " Hello world."], [1.5, 4.25, " How are you?"]]);
    assert.deepEqual(afterSingle.segments[1]!.tokens, B);

    // Only an opening timestamp.
    const opened = transcriptSegments([T(0.5), ...A], ids, decode, { durationSeconds: 2 });
    assert.deepEqual(spans(opened.segments), [[0.5, 2, " Hello world."]]);
  });

  test("text before the first timestamp starts at 0", () => {
    const { segments } = transcriptSegments([...A, T(1.5), T(1.5), ...B, T(3)], ids, decode, { durationSeconds: 30 });
    assert.deepEqual(spans(segments), [[0, 1.5, " Hello world."], [1.5, 3, " How are you?"]]);
    assert.deepEqual(segments[0]!.tokens, [...A, T(1.5)]);
  });

  test("control tokens anywhere are ignored", () => {
    const tokens = [SOT, EN, TRANSCRIBE, T(0), A[0]!, EN, A[1]!, A[2]!, T(1.5), EOT, T(1.5), ...B, T(3), EOT, EOT];
    const { text, segments } = transcriptSegments(tokens, ids, decode, { durationSeconds: 30 });
    assert.deepEqual(spans(segments), [[0, 1.5, " Hello world."], [1.5, 3, " How are you?"]]);
    assert.deepEqual(segments[0]!.tokens, [T(0), ...A, T(1.5)]);
    assert.equal(text, " Hello world. How are you?");
  });

  test("long-form windows add their offset; seek and ids continue", () => {
    const { segments } = transcriptSegments(transformersCases[0]!.tokens, ids, decode, { durationSeconds: 30, offsetSeconds: 30, firstId: 4 });
    assert.deepEqual(spans(segments), [[30, 31.5, " Hello world."], [31.5, 33, " How are you?"], [33.2, 35, " Fine, thanks!"]]);
    assert.deepEqual(segments.map((s) => [s.id, s.seek]), [[4, 3000], [5, 3000], [6, 3000]]);
    // Without timestamps the window spans [offset, offset + duration].
    const plain = transcriptSegments(A, ids, decode, { durationSeconds: 12.5, offsetSeconds: 57.3, seek: 5730 });
    assert.deepEqual(spans(plain.segments), [[57.3, 69.8, " Hello world."]]);
    assert.equal(plain.segments[0]!.seek, 5730);
  });

  test("avg_logprob is the mean over each segment's tokens", () => {
    const tokens = [T(0), ...A, T(1.5), T(1.5), ...B, T(3)];
    const logprobs = [0, -1, -2, -3, -4, -0.5, -1.5, -1.5, -1.5, -1.5, -0.5];
    const { segments } = transcriptSegments(tokens, ids, decode, { durationSeconds: 30, logprobs });
    assert.deepEqual(segments.map((s) => s.avg_logprob), [-10 / 5, -7 / 6]);
    assert.throws(() => transcriptSegments(tokens, ids, decode, { durationSeconds: 30, logprobs: [0] }), /logprobs has 1 entries for 11 tokens/);
  });

  test("rejects bad input", () => {
    assert.throws(() => transcriptSegments([1.5], ids, decode, { durationSeconds: 1 }), /not a token id/);
    assert.throws(() => transcriptSegments(A, ids, decode, { durationSeconds: Number.NaN }), /durationSeconds/);
    assert.throws(() => transcriptSegments(A, ids, decode, { durationSeconds: 1, offsetSeconds: -1 }), /offsetSeconds/);
  });
});

describe("compressionRatio", () => {
  test("equals openai/whisper's zlib ratio", () => {
    // python3 -c "import zlib; b=' Hello world.'.encode(); print(len(b)/len(zlib.compress(b)))"
    assert.equal(compressionRatio(" Hello world."), 0.6190476190476191);
    // python3 -c "import zlib; b=' Hello world. How are you? Fine, thanks!'.encode(); print(len(b)/len(zlib.compress(b)))"
    assert.equal(compressionRatio(" Hello world. How are you? Fine, thanks!"), 0.8333333333333334);
    // python3 -c "import zlib; b=b''; print(len(b)/len(zlib.compress(b)))"
    assert.equal(compressionRatio(""), 0);
  });

  test("stays close to Python's on repetitive text", () => {
    // python3 -c "import zlib; b=(' The quick brown fox jumps over the lazy dog. '*20).encode(); print(len(b)/len(zlib.compress(b)))"
    // -> 14.838709677419354 (920/62). Node 20 bundles Chromium's zlib fork, whose matcher can emit a few more
    // bytes on long repeats (920/64 here), so only closeness holds; the ratio is a hallucination heuristic.
    const ratio = compressionRatio(" The quick brown fox jumps over the lazy dog. ".repeat(20));
    assert.ok(Math.abs(ratio - 14.838709677419354) / 14.838709677419354 < 0.05, String(ratio));
  });
});

describe("formatSrt / formatVtt", () => {
  // Expected strings from openai/whisper's format_timestamp(seconds, always_include_hours=True, decimal_marker)
  // (Python's round() halves to even: 0.0005 -> 000, 0.0015 -> 002, 0.0025 -> 002, 3599.9995 -> 01:00:00,000).
  const segments = [
    { start: 0, end: 1.5, text: " Hello world." },
    { start: 0.0005, end: 0.0015, text: "  a --> b  " },
    { start: 0.0025, end: 59.9996, text: " Fine, thanks!" },
    { start: 3599.9995, end: 3661.0625, text: " Over an hour." },
    { start: 3725.4567, end: 36000.001, text: " Ten hours." },
  ];

  test("SRT", () => {
    assert.equal(
      formatSrt(segments),
      "1\n00:00:00,000 --> 00:00:01,500\nHello world.\n\n" +
        "2\n00:00:00,000 --> 00:00:00,002\na -> b\n\n" +
        "3\n00:00:00,002 --> 00:01:00,000\nFine, thanks!\n\n" +
        "4\n01:00:00,000 --> 01:01:01,062\nOver an hour.\n\n" +
        "5\n01:02:05,457 --> 10:00:00,001\nTen hours.\n\n",
    );
    assert.equal(formatSrt([]), "");
  });

  test("VTT", () => {
    assert.equal(
      formatVtt(segments),
      "WEBVTT\n\n" +
        "00:00:00.000 --> 00:00:01.500\nHello world.\n\n" +
        "00:00:00.000 --> 00:00:00.002\na -> b\n\n" +
        "00:00:00.002 --> 00:01:00.000\nFine, thanks!\n\n" +
        "01:00:00.000 --> 01:01:01.062\nOver an hour.\n\n" +
        "01:02:05.457 --> 10:00:00.001\nTen hours.\n\n",
    );
    assert.equal(formatVtt([]), "WEBVTT\n\n");
  });

  test("rejects negative times", () => {
    assert.throws(() => formatSrt([{ start: -1, end: 0, text: "x" }]), /cannot format timestamp -1/);
  });
});

describe("languages", () => {
  test("code -> name", () => {
    assert.equal(whisperLanguageName("en"), "english");
    assert.equal(whisperLanguageName("HT"), "haitian creole");
    assert.equal(whisperLanguageName("yue"), "cantonese");
    assert.equal(whisperLanguageName("xx"), null);
    assert.equal(whisperLanguageName("toString"), null);
  });

  test("code or name -> code", () => {
    assert.equal(whisperLanguageCode("en"), "en");
    assert.equal(whisperLanguageCode("English"), "en");
    assert.equal(whisperLanguageCode(" GERMAN "), "de");
    assert.equal(whisperLanguageCode("Haitian Creole"), "ht");
    assert.equal(whisperLanguageCode("mandarin"), "zh");
    assert.equal(whisperLanguageCode("klingon"), null);
    assert.equal(whisperLanguageCode(""), null);
  });
});

describe("verboseJson", () => {
  test("OpenAI's body, language as its English name", () => {
    const { text, segments } = transcriptSegments([T(0), ...A, T(1.5), T(1.5), ...B, T(3), EOT], ids, decode, { durationSeconds: 3.4 });
    const body = verboseJson({ task: "transcribe", language: "en", duration: 3.4, text, segments });
    assert.deepEqual(Object.keys(body), ["task", "language", "duration", "text", "segments"]);
    assert.equal(body.language, "english");
    assert.equal(body.text, " Hello world. How are you?");
    assert.deepEqual(Object.keys(body.segments[0]!), [
      "id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob",
    ]);
    assert.equal(verboseJson({ task: "translate", language: "French", duration: 1, text: "", segments: [] }).language, "french");
    assert.throws(() => verboseJson({ task: "transcribe", language: "klingon", duration: 1, text: "", segments: [] }), /unknown Whisper language: klingon/);
  });
});
