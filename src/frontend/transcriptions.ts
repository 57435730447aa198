// POST /v1/audio/transcriptions and /v1/audio/translations, as OpenAI's:
// a multipart upload becomes Whisper decoder requests, one per 30 s window.
//
// The decoder prompt is built here from the directory's token ids:
// [<|startofprev|> earlier text] <|startoftranscript|> <|lang|> <|task|>
// [<|notimestamps|>]. Without a `language` a multilingual model first runs
// transformers' language detection: the same audio, the prompt
// <|startoftranscript|> alone, one token restricted to the language tokens.
// Audio up to 30 s is one window (timestamps only where the format needs
// segments); longer audio is decoded window by window with timestamps, each
// window starting where the previous one's last complete segment ended, as
// transformers' long-form generate seeks. The worker decodes the file and
// reports its length (RequestOutput.promptInfo) with the first window.

import type { FastifyReply, FastifyRequest } from "fastify";
import type { SpeechRecognition } from "../config/model-dir.js";
import { RequestRejectedError } from "../engine/engine-core.js";
import type { EngineRequest, RequestOutput, TokenLogprob } from "../engine/types.js";
import {
  formatSrt,
  formatVtt,
  transcriptSegments,
  verboseJson,
  whisperLanguageCode,
  type TranscriptSegment,
} from "../text/whisper-transcript.js";
import type { FrontendContext } from "./context.js";
import { mediaHash } from "./media.js";
import { ApiError, badRequest, serverError, serviceUnavailable } from "./openai-error.js";
import { checkAvailable, checkModel } from "./run-generation.js";
import { samplingOf } from "./sampling.js";
import type { SessionOwner } from "./request-session.js";
import { SseStream } from "./sse.js";

export type TranscriptionTask = "transcribe" | "translate";

const RESPONSE_FORMATS = ["json", "text", "srt", "verbose_json", "vtt"] as const;
type ResponseFormat = (typeof RESPONSE_FORMATS)[number];

/** OpenAI's upload limit. */
const MAX_AUDIO_FILE_BYTES = 25 * 1024 * 1024;

const FIELDS = new Set(["file", "model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]", "timestamp_granularities", "stream"]);

interface TranscriptionForm {
  file: Buffer | null;
  model: string | null;
  language: string | null;
  prompt: string | null;
  responseFormat: ResponseFormat;
  temperature: number;
  granularities: string[];
  stream: boolean;
}

async function readForm(request: FastifyRequest, task: TranscriptionTask): Promise<TranscriptionForm> {
  if (!request.isMultipart()) throw badRequest("the body must be multipart/form-data with the audio in the field file", "file");
  const form: TranscriptionForm = { file: null, model: null, language: null, prompt: null, responseFormat: "json", temperature: 0, granularities: [], stream: false };
  for await (const part of request.parts({ limits: { fileSize: MAX_AUDIO_FILE_BYTES + 1, files: 1 } })) {
    const name = part.fieldname;
    if (!FIELDS.has(name) || (task === "translate" && (name === "language" || name.startsWith("timestamp_granularities")))) {
      throw badRequest(`unknown form field ${JSON.stringify(name)}`, name);
    }
    if (part.type === "file") {
      if (name !== "file") throw badRequest(`form field ${name} must not be a file`, name);
      const data = await part.toBuffer().catch(() => null);
      if (data === null || part.file.truncated || data.length > MAX_AUDIO_FILE_BYTES) {
        throw badRequest(`file: the file is larger than ${MAX_AUDIO_FILE_BYTES} bytes`, "file");
      }
      form.file = data;
      continue;
    }
    const value = String(part.value);
    switch (name) {
      case "file":
        throw badRequest("file must be sent as a file part", "file");
      case "model":
        form.model = value;
        break;
      case "language":
        form.language = value;
        break;
      case "prompt":
        form.prompt = value;
        break;
      case "response_format":
        if (!(RESPONSE_FORMATS as readonly string[]).includes(value)) {
          throw badRequest(`response_format must be one of ${RESPONSE_FORMATS.join(", ")}; got ${JSON.stringify(value)}`, "response_format");
        }
        form.responseFormat = value as ResponseFormat;
        break;
      case "temperature": {
        const t = Number(value);
        if (value.trim() === "" || !Number.isFinite(t) || t < 0 || t > 1) throw badRequest(`temperature must be a number in [0, 1]; got ${JSON.stringify(value)}`, "temperature");
        form.temperature = t;
        break;
      }
      case "stream":
        if (!["true", "false"].includes(value)) throw badRequest("stream must be true or false", "stream");
        form.stream = value === "true";
        break;
      default:
        form.granularities.push(value);
    }
  }
  if (form.file === null) throw badRequest("file is required: the audio to transcribe", "file");
  if (form.file.length === 0) throw badRequest("file: the file is empty (0 bytes)", "file");
  for (const g of form.granularities) {
    if (g !== "segment" && g !== "word") throw badRequest(`timestamp_granularities[] must be segment or word; got ${JSON.stringify(g)}`, "timestamp_granularities[]");
    if (g === "word") throw badRequest("timestamp_granularities[]: word timestamps are not supported; segment timestamps are", "timestamp_granularities[]");
  }
  if (form.granularities.length > 0 && form.responseFormat !== "verbose_json") {
    throw badRequest("timestamp_granularities[] needs response_format verbose_json", "timestamp_granularities[]");
  }
  if (form.stream && form.responseFormat !== "json" && form.responseFormat !== "text") {
    throw badRequest(`stream: a stream carries text deltas; response_format ${form.responseFormat} is not streamed`, "stream");
  }
  return form;
}

/** One decoder request of the transcription: its tokens (and logprobs), gathered as they come. */
class WindowRequest implements SessionOwner {
  readonly ids: number[] = [];
  readonly logprobs: number[] = [];
  promptInfo: Record<string, number[]> | null = null;
  private done = false;
  private engineDone = false;

  constructor(
    private readonly ctx: FrontendContext,
    readonly name: string,
    private readonly request: EngineRequest,
    private readonly onTokens: (ids: number[]) => void,
    private readonly settle: (error: ApiError | null) => void,
  ) {}

  get id(): number {
    return this.request.id;
  }

  start(): void {
    try {
      this.ctx.sessions.submitText(this, this.request, (output) => this.onOutput(output));
    } catch (error) {
      this.engineDone = true;
      this.fail(error instanceof RequestRejectedError ? badRequest(error.message) : serverError(`the engine refused the request: ${(error as Error).message}`));
    }
  }

  /** Ends the request with this error (aborting it in the engine unless the engine is done with it). */
  fail(error: ApiError): void {
    if (this.done) return;
    this.done = true;
    this.ctx.sessions.end(this, this.engineDone);
    this.settle(error);
  }

  private onOutput(output: RequestOutput): void {
    if (this.done) return;
    if (output.promptInfo !== undefined) this.promptInfo = output.promptInfo;
    if (output.finishReason === "error" || output.finishReason === "abort") {
      this.engineDone = true;
      const message = output.error ?? "the engine failed while transcribing";
      this.fail(output.errorStatus === 400 ? badRequest(message, message.startsWith("file:") ? "file" : null) : output.errorStatus === 503 || output.finishReason === "abort" ? serviceUnavailable(message) : serverError(message));
      return;
    }
    const ids = output.finished && output.stopTokenId !== null && output.newTokenIds.at(-1) === output.stopTokenId ? output.newTokenIds.slice(0, -1) : output.newTokenIds;
    for (const id of ids) this.ids.push(id);
    if (output.logprobs !== null) for (const entry of output.logprobs.slice(0, ids.length)) this.logprobs.push(logprobOf(entry));
    if (ids.length > 0) this.onTokens(ids);
    if (!output.finished) return;
    this.engineDone = true;
    this.done = true;
    this.ctx.sessions.end(this, true);
    this.settle(null);
  }
}

function logprobOf(entry: TokenLogprob): number {
  return entry.logprob;
}

interface WindowResult {
  ids: number[];
  logprobs: number[];
  promptInfo: Record<string, number[]> | null;
}

interface Transcription {
  language: string;
  duration: number;
  text: string;
  segments: TranscriptSegment[];
}

/**
 * A long-form window's outcome, as transformers' long-form generate reads it
 * (_retrieve_segment): the tokens it keeps, and where the next window starts
 * (mel frames). Text after the window's last complete segment (up to its last
 * pair of timestamps) is dropped and decoded again by the next window, which
 * starts at that pair; a window ending on a single timestamp, or with no pair,
 * keeps everything and the next starts after it.
 */
function longFormWindow(ids: readonly number[], timestampBegin: number, seekFrames: number, numFrames: number, stride: number): { kept: number[]; nextSeek: number } {
  const isTimestamp = ids.map((t) => t >= timestampBegin);
  const n = ids.length;
  const singleEnding = n >= 2 && !isTimestamp[n - 2] && isTimestamp[n - 1] === true;
  let lastPair = -1;
  for (let i = 1; i < n; i++) if (isTimestamp[i - 1] && isTimestamp[i]) lastPair = i;
  if (lastPair < 0 || singleEnding) return { kept: ids.slice(), nextSeek: seekFrames + numFrames };
  // The pair's second timestamp stays with the last segment (it says the window did not end on a single one).
  return { kept: ids.slice(0, lastPair + 1), nextSeek: seekFrames + (ids[lastPair - 1]! - timestampBegin) * stride };
}

export async function handleTranscription(ctx: FrontendContext, task: TranscriptionTask, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  checkAvailable(ctx);
  const speech = ctx.speech;
  if (speech === null) throw badRequest(`model ${ctx.servedModelName} does not transcribe audio (it is not a speech-recognition model)`);
  const form = await readForm(request, task);
  checkModel(ctx, form.model);
  if (task === "translate" && speech.translate === null) throw badRequest(`model ${ctx.servedModelName} does not translate (it has no translate task)`);
  const multilingual = speech.languageTokens.size > 0;
  let language: string | null = null;
  if (form.language !== null && form.language !== "") {
    language = whisperLanguageCode(form.language);
    if (language === null || (multilingual && !speech.languageTokens.has(language))) throw badRequest(`language: unknown language ${JSON.stringify(form.language)}`, "language");
    if (!multilingual && language !== "en") throw badRequest(`language: model ${ctx.servedModelName} transcribes English only`, "language");
  }
  // Earlier text, as transformers' get_prompt_ids writes it; the newest tokens are kept when it is long.
  let previous: number[] = [];
  if (form.prompt !== null && form.prompt.trim() !== "") {
    const ids = await ctx.tokenizer.encode(` ${form.prompt.trim()}`, false);
    previous = [speech.startOfPrev, ...ids.slice(-(Math.floor(speech.maxTargetPositions / 2) - 1))];
  }
  const file = new Uint8Array(form.file!);
  const transcription = new TranscriptionRun(ctx, speech, task, form, file, previous, reply);
  if (form.stream) {
    transcription.stream();
    return reply;
  }
  const result = await transcription.collect();
  switch (form.responseFormat) {
    case "json":
      return { text: result.text };
    case "text":
      return reply.type("text/plain; charset=utf-8").send(`${result.text}\n`);
    case "srt":
      return reply.type("text/plain; charset=utf-8").send(formatSrt(result.segments));
    case "vtt":
      return reply.type("text/vtt; charset=utf-8").send(formatVtt(result.segments));
    case "verbose_json":
      return verboseJson({ task: task === "transcribe" ? "transcribe" : "translate", language: result.language, duration: result.duration, text: result.text, segments: result.segments });
  }
}

/** One transcription: language detection if needed, then its windows in order. */
class TranscriptionRun {
  private current: WindowRequest | null = null;
  private closed = false;
  private readonly hashes = new Map<number, number>();

  constructor(
    private readonly ctx: FrontendContext,
    private readonly speech: SpeechRecognition,
    private readonly task: TranscriptionTask,
    private readonly form: TranscriptionForm,
    private readonly file: Uint8Array,
    private readonly previous: number[],
    private readonly reply: FastifyReply,
  ) {
    reply.raw.on("close", () => {
      if (reply.raw.writableEnded) return;
      this.close();
    });
  }

  /** The client left: the window in flight is aborted in the engine, and the run ends with a 499 nobody reads. */
  close(): void {
    this.closed = true;
    this.current?.fail(new ApiError(499, "client disconnected", "invalid_request_error"));
  }

  collect(): Promise<Transcription> {
    return this.run(() => {});
  }

  /** SSE: transcript.text.delta events as text is decoded, then transcript.text.done. */
  stream(): void {
    this.reply.hijack();
    let sse: SseStream | null = null;
    const open = (): SseStream => (sse ??= new SseStream(this.reply.raw));
    this.run((delta) => open().send({ type: "transcript.text.delta", delta })).then(
      (result) => {
        open().send({ type: "transcript.text.done", text: result.text });
        open().done();
      },
      (error: ApiError) => {
        if (this.reply.raw.destroyed) return;
        if (sse === null && !this.reply.raw.headersSent) {
          this.reply.raw.writeHead(error.status, { "content-type": "application/json; charset=utf-8" });
          this.reply.raw.end(JSON.stringify(error.toBody()));
          return;
        }
        open().sendError(error.toBody());
        open().done();
      },
    );
  }

  private async run(onText: (delta: string) => void): Promise<Transcription> {
    const speech = this.speech;
    const decode = this.ctx.tokenizer.byteLevel;
    const textOf = (ids: readonly number[]): string => {
      const text = ids.filter((t) => t < speech.tokens.eot);
      return decode !== null ? decode.decode(text) : text.join(" ");
    };
    let language = this.form.language === null || this.form.language === "" ? null : whisperLanguageCode(this.form.language);
    let info: Record<string, number[]> | null = null;
    if (language === null && speech.languageTokens.size > 0) {
      // transformers' detect_language: one decoder step over <|startoftranscript|>, language tokens only.
      const ids = [...speech.languageTokens.values()];
      const detected = await this.window([speech.startOfTranscript], 0, 1, ids, () => {});
      info = detected.promptInfo;
      const token = detected.ids[0];
      language = [...speech.languageTokens].find(([, id]) => id === token)?.[0] ?? null;
      if (language === null) throw serverError(`language detection returned token ${token}, not a language`);
    }
    language ??= "en";
    // The audio's length is known once the worker has decoded it (with the first request): until then a
    // window is taken as short (timestamps only where the format needs segments). Long audio is decoded
    // with timestamps; a first window run without them is run again.
    let totalSamples = info?.audio_samples?.[0] ?? null;
    let frames = info?.audio_frames?.[0] ?? null;
    const isLong = (): boolean => totalSamples !== null && totalSamples > speech.windowSamples;
    const segmentsWanted = this.form.responseFormat === "srt" || this.form.responseFormat === "vtt" || this.form.responseFormat === "verbose_json";
    const promptFor = (timestamps: boolean): number[] => {
      const prompt = [...this.previous, speech.startOfTranscript];
      if (speech.languageTokens.size > 0) prompt.push(speech.languageTokens.get(language)!, this.task === "translate" ? speech.translate! : speech.transcribe);
      if (!timestamps) prompt.push(speech.tokens.noTimestamps);
      return prompt;
    };
    const segments: TranscriptSegment[] = [];
    const texts: string[] = [];
    const windowFrames = Math.round((speech.windowSamples / speech.samplingRate) * speech.framesPerSecond);
    const stride = Math.round(speech.framesPerSecond * speech.tokens.timePrecision);
    let seek = 0;
    for (;;) {
      const timestamps = segmentsWanted || isLong();
      const prompt = promptFor(timestamps);
      let streamed = "";
      const result = await this.window(prompt, seek, speech.maxTargetPositions - prompt.length, null, (all, promptInfo) => {
        totalSamples ??= promptInfo?.audio_samples?.[0] ?? null;
        // Short audio streams as it is decoded; a long-form window's text goes out once the window is done.
        if (totalSamples === null || isLong()) return;
        const text = textOf(all);
        // A byte-level BPE may end mid-character: hold the tail back until it is whole.
        const whole = text.endsWith("\uFFFD") ? text.slice(0, text.lastIndexOf("\uFFFD")) : text;
        if (whole.length > streamed.length && whole.startsWith(streamed)) {
          onText(whole.slice(streamed.length));
          streamed = whole;
        }
      });
      totalSamples ??= result.promptInfo?.audio_samples?.[0] ?? speech.windowSamples;
      frames ??= result.promptInfo?.audio_frames?.[0] ?? windowFrames;
      if (isLong() && !timestamps) continue;
      const windowLength = Math.min(frames - seek, windowFrames);
      const window = isLong() ? longFormWindow(result.ids, speech.tokens.timestampBegin, seek, windowLength, stride) : null;
      const kept = window?.kept ?? result.ids;
      const transcript = transcriptSegments(kept, speech.tokens, textOf, {
        offsetSeconds: seek / speech.framesPerSecond,
        durationSeconds: windowLength / speech.framesPerSecond,
        seek,
        firstId: segments.length,
        temperature: this.form.temperature,
      });
      const full = textOf(kept);
      if (window !== null) onText(full);
      else if (full.length > streamed.length) onText(full.slice(streamed.length));
      texts.push(full);
      segments.push(...transcript.segments);
      if (window === null) break;
      seek = window.nextSeek;
      if (seek >= frames) break;
    }
    return { language, duration: totalSamples / speech.samplingRate, text: texts.join(""), segments };
  }

  /** One decoder request over the window at `seek` (mel frames); resolves with its tokens. */
  private window(
    prompt: number[],
    seek: number,
    maxTokens: number,
    allowed: number[] | null,
    onTokens: (all: readonly number[], promptInfo: Record<string, number[]> | null) => void,
  ): Promise<WindowResult> {
    if (this.closed) return Promise.reject(new ApiError(499, "client disconnected", "invalid_request_error"));
    const ctx = this.ctx;
    let hash = this.hashes.get(seek);
    if (hash === undefined) {
      hash = mediaHash(this.file, seek);
      this.hashes.set(seek, hash);
    }
    const sampling = samplingOf(allowed !== null ? 0 : this.form.temperature, null);
    const request: EngineRequest = {
      id: ctx.sessions.newId(),
      promptIds: prompt,
      sampling: allowed !== null ? { ...sampling, allowed_token_ids: Int32Array.from(allowed) } : sampling,
      stop: { maxTokens: Math.max(1, maxTokens), minTokens: 0, eosTokenIds: [this.speech.tokens.eot], stopTokenIds: [], ignoreEos: false },
      priority: 0,
      arrivalMs: performance.now(),
      media: { spans: [], images: [], params: [], audio: { data: this.file, param: "file", hash, offset: seek } },
    };
    return new Promise<WindowResult>((resolve, reject) => {
      const owner: WindowRequest = new WindowRequest(ctx, `transcription-${request.id}`, request, () => onTokens(owner.ids, owner.promptInfo), (error) => {
        this.current = null;
        if (error !== null) reject(error);
        else resolve({ ids: owner.ids, logprobs: owner.logprobs, promptInfo: owner.promptInfo });
      });
      this.current = owner;
      owner.start();
    });
  }
}
