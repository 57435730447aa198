// Whisper decoder output -> OpenAI's transcription response formats (json
// text, verbose_json segments, srt, vtt). Pure text work: the caller runs the
// model, strips the decoder prompt and hands over the generated ids plus a
// synchronous decode function for text ids.
//
// Segmenting follows transformers' WhisperTokenizer._compute_offsets (itself
// openai/whisper's transcribe loop): a segment runs from a timestamp token to
// the next timestamp that either precedes another timestamp (a pair
// <|a|><|b|> ends one segment and starts the next) or is the last one. Two
// extensions keep every text token in some segment, so `text` equals the
// concatenation of the segments: text before the first timestamp starts at
// <|0.00|>, and text after the last timestamp (the model was cut off) becomes
// a segment ending at the audio's duration, as transformers' ASR pipeline
// keeps it rather than _compute_offsets dropping it.

import { deflateSync } from "node:zlib";

/** The special-token layout of a Whisper vocabulary (read from its directory by config/model-dir.ts). */
export interface WhisperTokenIds {
  /** <|endoftext|>; every id >= eot is not text. */
  eot: number;
  /** <|notimestamps|>. */
  noTimestamps: number;
  /** <|0.00|>; timestampBegin + i is i * timePrecision seconds. */
  timestampBegin: number;
  /** Seconds per timestamp step (0.02: 30 s window over 1500 encoder positions). */
  timePrecision: number;
}

/** One segment of OpenAI's verbose_json, field order as OpenAI returns it. */
export interface TranscriptSegment {
  id: number;
  /** Start of the decoded window in mel frames (100 per second). */
  seek: number;
  start: number;
  end: number;
  text: string;
  /** The segment's ids: its timestamp tokens and text tokens. */
  tokens: number[];
  temperature: number;
  avg_logprob: number;
  compression_ratio: number;
  no_speech_prob: number;
}

export interface TranscriptOptions {
  /** Audio length (s) the tokens cover, from offsetSeconds: the end of a segment without a closing timestamp. */
  durationSeconds: number;
  /** Where this window starts in the whole audio (long-form decoding), added to every time. */
  offsetSeconds?: number;
  /** verbose_json `seek`; defaults to offsetSeconds in mel frames. */
  seek?: number;
  /** id of the first segment (long-form: continue the previous window's numbering). */
  firstId?: number;
  temperature?: number;
  /** Per-token logprobs aligned with `tokens`; avg_logprob is their mean over each segment's tokens. */
  logprobs?: readonly number[];
  noSpeechProb?: number;
}

export interface Transcript {
  text: string;
  segments: TranscriptSegment[];
}

/** The length of one window (30 s), for transformers' window-reset rule. */
const WINDOW_SECONDS = 30;
/** verbose_json's seek counts mel frames: a 10 ms hop. */
const FRAMES_PER_SECOND = 100;

/** len(utf8) / len(zlib.compress(utf8)), as openai/whisper computes it (zlib wrapper, level 6 on both sides). */
export function compressionRatio(text: string): number {
  const bytes = Buffer.from(text, "utf8");
  return bytes.length / deflateSync(bytes).length;
}

/** Times in milliseconds: drops float noise such as 0.1 * 3 without losing what SRT/VTT can show. */
function roundMs(seconds: number): number {
  return Math.round(seconds * 1000) / 1000;
}

interface Token {
  id: number;
  /** Position in the caller's token list (for logprobs). */
  index: number;
}

/**
 * Splits a window's generated ids into segments. Control tokens (ids >= eot
 * that are not timestamps: sot, language, task, eot itself) are dropped
 * first; text tokens are ids < eot.
 */
export function transcriptSegments(
  tokens: readonly number[],
  ids: WhisperTokenIds,
  decode: (ids: number[]) => string,
  options: TranscriptOptions,
): Transcript {
  const offset = options.offsetSeconds ?? 0;
  if (!Number.isFinite(options.durationSeconds) || options.durationSeconds < 0) {
    throw new Error(`durationSeconds must be a non-negative number, got ${options.durationSeconds}`);
  }
  if (!Number.isFinite(offset) || offset < 0) throw new Error(`offsetSeconds must be a non-negative number, got ${offset}`);
  const logprobs = options.logprobs;
  if (logprobs !== undefined && logprobs.length !== tokens.length) {
    throw new Error(`logprobs has ${logprobs.length} entries for ${tokens.length} tokens`);
  }
  const seek = options.seek ?? Math.round(offset * FRAMES_PER_SECOND);
  const temperature = options.temperature ?? 0;
  const noSpeechProb = options.noSpeechProb ?? 0;
  const end = offset + options.durationSeconds;

  const isTimestamp = (id: number): boolean => id >= ids.timestampBegin;
  const seq: Token[] = [];
  tokens.forEach((id, index) => {
    if (!Number.isInteger(id) || id < 0) throw new Error(`token ${index} is not a token id: ${id}`);
    if (id < ids.eot || isTimestamp(id)) seq.push({ id, index });
  });

  const segments: TranscriptSegment[] = [];
  const allText: number[] = [];
  const push = (slice: readonly Token[], start: number, stop: number): void => {
    const text = slice.filter((t) => !isTimestamp(t.id)).map((t) => t.id);
    allText.push(...text);
    const segmentText = decode(text);
    let avg = 0;
    if (logprobs !== undefined && slice.length > 0) {
      avg = slice.reduce((sum, t) => sum + (logprobs[t.index] ?? 0), 0) / slice.length;
    }
    segments.push({
      id: (options.firstId ?? 0) + segments.length,
      seek,
      start: roundMs(start),
      end: roundMs(stop),
      text: segmentText,
      tokens: slice.map((t) => t.id),
      temperature,
      avg_logprob: avg,
      compression_ratio: compressionRatio(segmentText),
      no_speech_prob: noSpeechProb,
    });
  };

  const stamps: number[] = [];
  seq.forEach((t, i) => {
    if (isTimestamp(t.id)) stamps.push(i);
  });
  const lastStamp = stamps[stamps.length - 1];
  if (lastStamp === undefined) {
    // <|notimestamps|> decoding: one segment over the whole window, as openai/whisper does.
    if (seq.length > 0) push(seq, offset, end);
    return { text: decode(allText), segments };
  }

  // Slice ends: the second token of every timestamp pair, then past the last timestamp.
  const cuts: number[] = [];
  for (let i = 1; i < seq.length; i++) {
    if (isTimestamp(seq[i - 1]!.id) && isTimestamp(seq[i]!.id)) cuts.push(i);
  }
  if (cuts[cuts.length - 1] !== lastStamp + 1) cuts.push(lastStamp + 1);

  // transformers reads timestamps going backwards as a new 30 s window of a
  // concatenated long-form output; windowShift (in timestamp steps) carries that.
  const windowSteps = Math.round(WINDOW_SECONDS / ids.timePrecision);
  let windowShift = 0;
  let maxStep = 0;
  const seconds = (step: number): number => offset + (step + windowShift) * ids.timePrecision;
  const startStep = (at: number): number => {
    const step = seq[at]!.id - ids.timestampBegin;
    if (step < maxStep) {
      const singleEnding = at >= 2 && !(isTimestamp(seq[at - 2]!.id) && isTimestamp(seq[at - 1]!.id));
      windowShift += singleEnding ? windowSteps : maxStep;
    }
    return step;
  };

  // Text before the first timestamp starts the first segment at <|0.00|>.
  let from = isTimestamp(seq[0]!.id) ? 0 : -1;
  let lastEmitted = -1;
  for (const cut of cuts) {
    const slice = seq.slice(Math.max(from, 0), cut);
    if (slice.length > 1 || from < 0) {
      const start = from < 0 ? 0 : startStep(from);
      const stop = seq[cut - 1]!.id - ids.timestampBegin;
      const startSeconds = seconds(start);
      maxStep = stop;
      push(slice, startSeconds, seconds(stop));
      lastEmitted = cut - 1;
    } else if (slice.length === 1 && cut === seq.length && segments.length > 0) {
      // A window ending on a pair: its second timestamp stays with the last segment, as transformers keeps it.
      segments[segments.length - 1]!.tokens.push(slice[0]!.id);
    }
    from = cut;
  }

  // Text after the last timestamp: the window cut the speech off; it ends with the audio.
  const tail = lastStamp + 1;
  if (tail < seq.length) {
    const startSeconds = seconds(startStep(lastStamp));
    // The last timestamp opens this segment unless it already closed the previous one.
    const slice = seq.slice(lastEmitted === lastStamp ? tail : lastStamp);
    push(slice, startSeconds, Math.max(end, startSeconds));
  }
  return { text: decode(allText), segments };
}

/** openai/whisper's format_timestamp with hours always shown. */
function formatTimestamp(seconds: number, decimalMarker: string): string {
  if (!Number.isFinite(seconds) || seconds < 0) throw new Error(`cannot format timestamp ${seconds}`);
  // Python's round() rounds halves to even.
  const raw = seconds * 1000;
  let ms = Math.round(raw);
  if (raw % 1 === 0.5 && ms % 2 !== 0) ms -= 1;
  const hours = Math.floor(ms / 3_600_000);
  ms -= hours * 3_600_000;
  const minutes = Math.floor(ms / 60_000);
  ms -= minutes * 60_000;
  const secs = Math.floor(ms / 1000);
  ms -= secs * 1000;
  const two = (n: number): string => String(n).padStart(2, "0");
  return `${two(hours)}:${two(minutes)}:${two(secs)}${decimalMarker}${String(ms).padStart(3, "0")}`;
}

/** A cue's text as openai/whisper writes it: trimmed, and "-->" cannot end the cue early. */
function cueText(text: string): string {
  return text.trim().replaceAll("-->", "->");
}

type CueSegment = Pick<TranscriptSegment, "start" | "end" | "text">;

/** SubRip, as openai/whisper's WriteSRT: every cue ends with a blank line. */
export function formatSrt(segments: readonly CueSegment[]): string {
  return segments
    .map((s, i) => `${i + 1}\n${formatTimestamp(s.start, ",")} --> ${formatTimestamp(s.end, ",")}\n${cueText(s.text)}\n\n`)
    .join("");
}

/** WebVTT, as openai/whisper's WriteVTT (with hours always shown, as OpenAI's API does). */
export function formatVtt(segments: readonly CueSegment[]): string {
  return "WEBVTT\n\n" + segments.map((s) => `${formatTimestamp(s.start, ".")} --> ${formatTimestamp(s.end, ".")}\n${cueText(s.text)}\n\n`).join("");
}

/** Whisper's language codes and the English names OpenAI reports (transformers' LANGUAGES). */
const LANGUAGES: Readonly<Record<string, string>> = {
  en: "english", zh: "chinese", de: "german", es: "spanish", ru: "russian", ko: "korean", fr: "french",
  ja: "japanese", pt: "portuguese", tr: "turkish", pl: "polish", ca: "catalan", nl: "dutch", ar: "arabic",
  sv: "swedish", it: "italian", id: "indonesian", hi: "hindi", fi: "finnish", vi: "vietnamese", he: "hebrew",
  uk: "ukrainian", el: "greek", ms: "malay", cs: "czech", ro: "romanian", da: "danish", hu: "hungarian",
  ta: "tamil", no: "norwegian", th: "thai", ur: "urdu", hr: "croatian", bg: "bulgarian", lt: "lithuanian",
  la: "latin", mi: "maori", ml: "malayalam", cy: "welsh", sk: "slovak", te: "telugu", fa: "persian",
  lv: "latvian", bn: "bengali", sr: "serbian", az: "azerbaijani", sl: "slovenian", kn: "kannada",
  et: "estonian", mk: "macedonian", br: "breton", eu: "basque", is: "icelandic", hy: "armenian",
  ne: "nepali", mn: "mongolian", bs: "bosnian", kk: "kazakh", sq: "albanian", sw: "swahili",
  gl: "galician", mr: "marathi", pa: "punjabi", si: "sinhala", km: "khmer", sn: "shona", yo: "yoruba",
  so: "somali", af: "afrikaans", oc: "occitan", ka: "georgian", be: "belarusian", tg: "tajik",
  sd: "sindhi", gu: "gujarati", am: "amharic", yi: "yiddish", lo: "lao", uz: "uzbek", fo: "faroese",
  ht: "haitian creole", ps: "pashto", tk: "turkmen", nn: "nynorsk", mt: "maltese", sa: "sanskrit",
  lb: "luxembourgish", my: "myanmar", bo: "tibetan", tl: "tagalog", mg: "malagasy", as: "assamese",
  tt: "tatar", haw: "hawaiian", ln: "lingala", ha: "hausa", ba: "bashkir", jw: "javanese",
  su: "sundanese", yue: "cantonese",
};

/** Name -> code, with transformers' TO_LANGUAGE_CODE aliases. */
const LANGUAGE_CODES: ReadonlyMap<string, string> = new Map([
  ...Object.entries(LANGUAGES).map(([code, name]): [string, string] => [name, code]),
  ["burmese", "my"], ["valencian", "ca"], ["flemish", "nl"], ["haitian", "ht"], ["letzeburgesch", "lb"],
  ["pushto", "ps"], ["panjabi", "pa"], ["moldavian", "ro"], ["moldovan", "ro"], ["sinhalese", "si"],
  ["castilian", "es"], ["mandarin", "zh"],
]);

/** "en" -> "english"; null for a code Whisper does not know. */
export function whisperLanguageName(code: string): string | null {
  const key = code.trim().toLowerCase();
  return Object.hasOwn(LANGUAGES, key) ? LANGUAGES[key]! : null;
}

/** A Whisper code from a code or English name ("en", "English", "mandarin"), case-insensitive; null if unknown. */
export function whisperLanguageCode(nameOrCode: string): string | null {
  const key = nameOrCode.trim().toLowerCase();
  if (Object.hasOwn(LANGUAGES, key)) return key;
  return LANGUAGE_CODES.get(key) ?? null;
}

export interface VerboseTranscription {
  task: "transcribe" | "translate";
  language: string;
  duration: number;
  text: string;
  segments: TranscriptSegment[];
}

/** OpenAI's verbose_json body; `language` may be a code or name and is reported as the English name. */
export function verboseJson(input: {
  task: "transcribe" | "translate";
  language: string;
  duration: number;
  text: string;
  segments: TranscriptSegment[];
}): VerboseTranscription {
  const code = whisperLanguageCode(input.language);
  if (code === null) throw new Error(`unknown Whisper language: ${input.language}`);
  return { task: input.task, language: LANGUAGES[code]!, duration: input.duration, text: input.text, segments: input.segments };
}
