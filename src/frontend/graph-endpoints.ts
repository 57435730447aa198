// Endpoints of models whose outputs are not (only) text: POST /v1/audio/speech
// (OpenAI's, streamed as it is decoded), POST /v1/images/generations (OpenAI's,
// b64_json PNGs; each image is one graph request, so the n images of a request
// and concurrent requests batch together in every node) and M*'s multipart form of POST
// /generate (NDJSON chunks {modality, data (base64), metadata}, an error as a
// final {modality: "error"} chunk; or one JSON body when not streaming).
// Both submit a GraphRequest: the model's process_prompt runs on the worker,
// `model_kwargs` (the voice...) reach it and every node, and the sampling
// fields drive the graph's kv_cache nodes, so the same text, voice and seed
// give the same bytes through either endpoint.

import type { FastifyReply, FastifyRequest } from "fastify";
import type { GraphEvent, GraphEventCallback, GraphRequest } from "../conductor/graph-engine.js";
import type { RequestId } from "../engine/types.js";
import { RequestRejectedError } from "../engine/engine-core.js";
import type { SamplingParams } from "../transport/messages.js";
import { SPEECH_CONTENT_TYPES, wavHeader } from "./audio-encoding.js";
import { samplingOf } from "./sampling.js";
import { ApiError, badRequest, serverError, serviceUnavailable } from "./openai-error.js";
import type { RequestSessions, SessionOwner } from "./request-session.js";
import { parseImageRequest, parseSpeechRequest } from "./request-validation.js";
import type { ImageGenerationSpec, SamplingDefaults } from "../config/model-dir.js";
import { randomInt } from "node:crypto";
import { mediaHash } from "./media.js";

/** The engine's graph side, as the server builds the sessions over it. */
export interface GraphEngineHandle {
  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void;
}

export interface GraphEndpointsOptions {
  /** Where the runs' requests go (admission, metrics, the live registry, the engine). */
  sessions: RequestSessions;
  /** The modalities the model's graph emits to the client. */
  outputModalities: readonly string[];
  unavailableReason(): string | null;
  /** Time to first audio byte, per request (seconds). */
  onFirstAudio?: (seconds: number) => void;
  /** An image model's request bounds (config.json image_generation); null: /v1/images/generations answers 400. */
  imageGeneration?: ImageGenerationSpec | null;
  /** The model speaks in the voice of reference clips sent to /generate as files (CSM's context utterances). */
  voicePrompting?: boolean;
  /** generation_config.json's temperature and top-k (what a request naming no temperature samples with) and max_new_tokens. */
  samplingDefaults?: SamplingDefaults;
}

/** A graph request's sampling: the client's temperature, else the model's default, else 1; the model's top-k. */
function graphSampling(options: GraphEndpointsOptions, temperature: number | null, seed: number | null): SamplingParams {
  const defaults = options.samplingDefaults;
  return samplingOf(temperature ?? defaults?.temperature ?? 1.0, seed, defaults?.topK ?? 0);
}

/** When a model's chunks do not say (24 kHz, as OpenAI's speech). */
const DEFAULT_SAMPLE_RATE = 24_000;


/**
 * A graph request's events as a pull queue; a client that leaves aborts it
 * (everything it holds on every worker is freed), and failing it (shutdown,
 * a lost worker) ends the queue with that error.
 */
class GraphRun implements SessionOwner {
  private readonly events: GraphEvent[] = [];
  private waiting: ((event: GraphEvent) => void) | null = null;
  private ended = false;

  readonly id: RequestId;
  /** What the client knows the request by (its x-request-id). */
  readonly name: string;

  /** request: the client whose leaving aborts the run (null: the caller watches it); name: the client's name for it. */
  constructor(
    private readonly sessions: RequestSessions,
    request: FastifyRequest | null,
    name: (id: RequestId) => string,
  ) {
    this.id = sessions.newId();
    this.name = name(this.id);
    request?.raw.socket?.once("close", () => this.abort());
  }

  start(req: Omit<GraphRequest, "id">): void {
    try {
      this.sessions.submitGraph(this, { ...req, id: this.id }, (event) => this.push(event));
    } catch (error) {
      if (error instanceof RequestRejectedError) throw badRequest(error.message);
      throw error;
    }
  }

  next(): Promise<GraphEvent> {
    const event = this.events.shift();
    if (event !== undefined) return Promise.resolve(event);
    return new Promise((resolve) => (this.waiting = resolve));
  }

  abort(): void {
    if (this.ended) return;
    this.ended = true;
    this.sessions.end(this, false);
  }

  fail(error: ApiError): void {
    if (this.ended) return;
    this.abort();
    this.deliver({ kind: "error", message: error.message, status: error.status === 400 ? 400 : error.status === 503 ? 503 : 500 });
  }

  private push(event: GraphEvent): void {
    if (this.ended) return;
    if (event.kind !== "chunk") this.ended = true;
    this.deliver(event);
  }

  private deliver(event: GraphEvent): void {
    const waiting = this.waiting;
    if (waiting !== null) {
      this.waiting = null;
      waiting(event);
    } else this.events.push(event);
  }
}

function errorOf(event: Extract<GraphEvent, { kind: "error" }>): ApiError {
  if (event.status === 400) return badRequest(event.message);
  return event.status === 503 ? serviceUnavailable(event.message) : serverError(event.message);
}

/** POST /v1/audio/speech: chunked audio; the first bytes leave with the first decoded window. */
export async function handleSpeech(options: GraphEndpointsOptions, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  const unavailable = options.unavailableReason();
  if (unavailable !== null) throw serviceUnavailable(unavailable);
  if (!options.outputModalities.includes("audio")) throw badRequest("this model does not produce audio; /v1/audio/speech needs a speech model");
  const body = parseSpeechRequest(request.body);
  const startedAt = performance.now();
  const run = new GraphRun(options.sessions, request, (id) => `speech-${id}`);
  run.start({
    prompt: { text: body.input, inputModalities: ["text"], outputModalities: ["audio"] },
    modelKwargs: { voice: body.voice },
    sampling: graphSampling(options, body.temperature, body.seed),
    maxTokens: body.maxTokens ?? options.samplingDefaults?.maxNewTokens ?? null,
    priority: 0,
    arrivalMs: startedAt,
  });
  const first = await run.next();
  // Before any byte: an error is still an HTTP status.
  if (first.kind === "error") throw errorOf(first);
  const raw = reply.raw;
  reply.hijack();
  raw.writeHead(200, { "content-type": SPEECH_CONTENT_TYPES[body.format], "transfer-encoding": "chunked", "x-request-id": run.name });
  // The worker's chunks say their sample rate (the model's get_output_sample_rate).
  const rate = first.kind === "chunk" && typeof first.metadata.sample_rate === "number" ? first.metadata.sample_rate : DEFAULT_SAMPLE_RATE;
  if (body.format === "wav") raw.write(wavHeader({ sampleRate: rate, channels: 1, bitsPerSample: 16 }, null));
  let firstAudio = true;
  for (let event: GraphEvent = first; ; event = await run.next()) {
    if (event.kind === "done") break;
    if (event.kind === "error") {
      // Mid-stream: raw audio has no room for an error; the connection ends without its last chunk.
      raw.destroy(new Error(event.message));
      return;
    }
    if (event.modality !== "audio" || event.data.length === 0) continue;
    if (firstAudio) {
      firstAudio = false;
      options.onFirstAudio?.((performance.now() - startedAt) / 1000);
    }
    if (raw.destroyed) return;
    raw.write(event.data);
  }
  raw.end();
}

// ---- POST /v1/images/generations -------------------------------------------

/** Seeds the server draws for requests without one (randomInt's widest range). */
const MAX_DRAWN_SEED = 2 ** 48 - 1;

/**
 * POST /v1/images/generations: n graph requests (image i gets the request's
 * seed and index i, which pick its noise), answered together once every
 * image is done. Usage counts the prompt ids the text encoder read as input
 * tokens and the latent positions of the images as output (image) tokens.
 */
export async function handleImageGeneration(options: GraphEndpointsOptions, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const unavailable = options.unavailableReason();
  if (unavailable !== null) throw serviceUnavailable(unavailable);
  const spec = options.imageGeneration ?? null;
  if (spec === null || !options.outputModalities.includes("image")) {
    throw badRequest(`this model does not generate images (it produces ${options.outputModalities.join(", ") || "nothing"}); /v1/images/generations needs an image model`);
  }
  const body = parseImageRequest(request.body, spec);
  const seed = body.seed ?? randomInt(MAX_DRAWN_SEED);
  const created = Math.floor(Date.now() / 1000);
  const arrivalMs = performance.now();
  const runs: GraphRun[] = [];
  const abortAll = (): void => runs.forEach((run) => run.abort());
  request.raw.socket?.once("close", abortAll);
  try {
    for (let index = 0; index < body.n; index++) {
      const run = new GraphRun(options.sessions, null, (id) => `image-${id}`);
      runs.push(run);
      run.start({
        prompt: { text: body.prompt, inputModalities: ["text"], outputModalities: ["image"] },
        modelKwargs: { size: body.size, seed, index, num_inference_steps: body.numInferenceSteps },
        sampling: samplingOf(0, seed),
        maxTokens: null,
        priority: 0,
        arrivalMs,
      });
    }
    const images = await Promise.all(runs.map(imageOf));
    const inputTokens = Math.min(Buffer.byteLength(body.prompt, "utf8") + 1, spec.maxPromptTokens);
    const [width, height] = body.size.split("x").map(Number) as [number, number];
    const outputTokens = body.n * (width / spec.latentDownsampling) * (height / spec.latentDownsampling);
    return reply.header("x-request-id", runs[0]!.name).send({
      created,
      data: images.map((png) => ({ b64_json: png.toString("base64") })),
      background: "opaque",
      output_format: "png",
      size: body.size,
      usage: {
        input_tokens: inputTokens,
        input_tokens_details: { text_tokens: inputTokens, image_tokens: 0 },
        output_tokens: outputTokens,
        total_tokens: inputTokens + outputTokens,
      },
    });
  } catch (error) {
    abortAll();
    throw error;
  } finally {
    request.raw.socket?.off("close", abortAll);
  }
}

/** The one PNG a graph request for an image produces. */
async function imageOf(run: GraphRun): Promise<Buffer> {
  let png: Buffer | null = null;
  for (;;) {
    const event = await run.next();
    if (event.kind === "error") throw errorOf(event);
    if (event.kind === "done") break;
    if (event.modality === "image") png = Buffer.from(event.data);
  }
  if (png === null) throw serverError(`request ${run.id} ended without an image`);
  return png;
}

// ---- POST /generate, multipart (M*'s form) ---------------------------------

interface MultipartForm {
  text: string | null;
  files: { name: string; data: Buffer; contentType: string }[];
  inputModalities: string[] | null;
  outputModalities: string[] | null;
  streaming: boolean;
  modelKwargs: Record<string, unknown>;
  requestId: string | null;
}

function jsonField(name: string, value: string): unknown {
  try {
    return JSON.parse(value);
  } catch (error) {
    throw badRequest(`${name} is not valid JSON: ${(error as Error).message}`, name);
  }
}

function listField(name: string, value: string): string[] {
  // M*'s clients send a JSON list, or one modality, or several separated by commas.
  const trimmed = value.trim();
  const parsed: unknown = trimmed.startsWith("[") ? jsonField(name, trimmed) : trimmed.split(",").map((s) => s.trim());
  if (!Array.isArray(parsed) || !parsed.every((m) => typeof m === "string" && m !== "")) throw badRequest(`${name} must be a list of modality names`, name);
  return parsed as string[];
}

const FORM_FIELDS = new Set(["text", "files", "input_modalities", "output_modalities", "streaming", "model_kwargs", "request_id"]);

async function readForm(request: FastifyRequest): Promise<MultipartForm> {
  const form: MultipartForm = { text: null, files: [], inputModalities: null, outputModalities: null, streaming: false, modelKwargs: {}, requestId: null };
  for await (const part of request.parts()) {
    if (!FORM_FIELDS.has(part.fieldname)) throw badRequest(`unknown form field ${JSON.stringify(part.fieldname)} (fields: ${[...FORM_FIELDS].join(", ")})`, part.fieldname);
    if (part.type === "file") {
      if (part.fieldname !== "files") throw badRequest(`form field ${part.fieldname} must not be a file`, part.fieldname);
      form.files.push({ name: part.filename, data: await part.toBuffer(), contentType: part.mimetype });
      continue;
    }
    const value = String(part.value);
    switch (part.fieldname) {
      case "text":
        form.text = value;
        break;
      case "input_modalities":
        form.inputModalities = listField("input_modalities", value);
        break;
      case "output_modalities":
        form.outputModalities = listField("output_modalities", value);
        break;
      case "streaming":
        if (!["true", "false", "1", "0"].includes(value.toLowerCase())) throw badRequest("streaming must be true or false", "streaming");
        form.streaming = value.toLowerCase() === "true" || value === "1";
        break;
      case "model_kwargs": {
        const kwargs = jsonField("model_kwargs", value);
        if (typeof kwargs !== "object" || kwargs === null || Array.isArray(kwargs)) throw badRequest("model_kwargs must be a JSON object", "model_kwargs");
        form.modelKwargs = kwargs as Record<string, unknown>;
        break;
      }
      case "request_id":
        if (value === "" || value.length > 128) throw badRequest("request_id must be 1 to 128 characters", "request_id");
        form.requestId = value;
        break;
      case "files":
        throw badRequest("files must be sent as file parts", "files");
    }
  }
  return form;
}

/** The sampling fields M*'s model_kwargs carry beside the model's own options. */
function samplingFromKwargs(options: GraphEndpointsOptions, kwargs: Record<string, unknown>): { sampling: SamplingParams; maxTokens: number | null; modelKwargs: Record<string, unknown> } {
  const { seed, temperature, max_tokens: maxTokens, ...modelKwargs } = kwargs;
  if (seed !== undefined && seed !== null && !Number.isSafeInteger(seed)) throw badRequest("model_kwargs.seed must be an integer", "model_kwargs.seed");
  if (temperature !== undefined && (typeof temperature !== "number" || !(temperature >= 0) || temperature > 100)) {
    throw badRequest("model_kwargs.temperature must be a number in [0, 100]", "model_kwargs.temperature");
  }
  if (maxTokens !== undefined && maxTokens !== null && (!Number.isSafeInteger(maxTokens) || (maxTokens as number) < 1)) {
    throw badRequest("model_kwargs.max_tokens must be a positive integer", "model_kwargs.max_tokens");
  }
  return {
    sampling: graphSampling(options, (temperature as number | undefined) ?? null, (seed as number | null | undefined) ?? null),
    maxTokens: (maxTokens as number | null | undefined) ?? options.samplingDefaults?.maxNewTokens ?? null,
    modelKwargs,
  };
}

/** Reference clips a request may send (each with its transcript). */
const MAX_VOICE_PROMPT_CLIPS = 8;

/**
 * A voice prompt: every file of the form is a reference clip, said before the
 * request's text; model_kwargs.context_text gives their transcripts (a string
 * for one clip, else a list, one each) and context_voice, optionally, their
 * speakers. Taken out of the model kwargs: only process_prompt reads them.
 */
function readVoicePrompt(form: MultipartForm): { kwargs: Record<string, unknown>; hash: number } {
  if (form.files.length > MAX_VOICE_PROMPT_CLIPS) throw badRequest(`at most ${MAX_VOICE_PROMPT_CLIPS} reference clips`, "files");
  const { context_text: text, context_voice: voice, ...rest } = form.modelKwargs;
  const texts = typeof text === "string" ? [text] : text;
  if (!Array.isArray(texts) || texts.length !== form.files.length || !texts.every((t) => typeof t === "string" && t !== "")) {
    throw badRequest(`model_kwargs.context_text must give each of the ${form.files.length} reference clip(s) its transcript (a string, or a list of strings)`, "model_kwargs.context_text");
  }
  const voices = voice === undefined || voice === null ? [] : typeof voice === "string" ? [voice] : voice;
  if (!Array.isArray(voices) || voices.length > form.files.length || !voices.every((v) => typeof v === "string" && v !== "")) {
    throw badRequest("model_kwargs.context_voice must be a speaker, or a list of speakers, one per reference clip", "model_kwargs.context_voice");
  }
  form.modelKwargs = rest;
  for (const [i, f] of form.files.entries()) if (f.data.length === 0) throw badRequest(`files[${i}] is empty`, `files[${i}]`);
  return {
    kwargs: { context_audio: form.files.map((f) => new Uint8Array(f.data)), context_text: texts, context_voice: voices },
    hash: mediaHash(Buffer.concat(form.files.map((f) => f.data)), ...form.files.map((f) => f.data.length)),
  };
}

/** POST /generate with a multipart body (M*'s client form). */
export async function handleMultipartGenerate(options: GraphEndpointsOptions, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const unavailable = options.unavailableReason();
  if (unavailable !== null) throw serviceUnavailable(unavailable);
  const form = await readForm(request);
  if (form.files.length > 0 && options.voicePrompting !== true) throw badRequest("this model takes no files (input modalities: text)", "files");
  if (form.text === null) throw badRequest("the form needs a text field", "text");
  const voicePrompt = form.files.length > 0 ? readVoicePrompt(form) : null;
  const inputModalities = form.inputModalities ?? ["text"];
  const outputModalities = form.outputModalities ?? [...options.outputModalities];
  for (const m of outputModalities) {
    if (!options.outputModalities.includes(m)) {
      throw badRequest(`output modality ${JSON.stringify(m)} is not produced by this model (it produces ${options.outputModalities.join(", ")})`, "output_modalities");
    }
  }
  const { sampling, maxTokens, modelKwargs } = samplingFromKwargs(options, form.modelKwargs);
  const startedAt = performance.now();
  // The client's name for its request, echoed back; the engine's id is run.id.
  const run = new GraphRun(options.sessions, request, (id) => form.requestId ?? `generate-${id}`);
  const id = run.name;
  run.start({
    prompt: { text: form.text, inputModalities, outputModalities },
    modelKwargs,
    sampling,
    maxTokens,
    priority: 0,
    arrivalMs: startedAt,
    ...(voicePrompt === null ? {} : { inputHash: voicePrompt.hash, promptKwargs: voicePrompt.kwargs }),
  });
  const first = await run.next();
  if (first.kind === "error") throw errorOf(first);

  if (!form.streaming) {
    const outputs: Record<string, { data: string; metadata: Readonly<Record<string, unknown>> }[]> = {};
    for (let event: GraphEvent = first; ; event = await run.next()) {
      if (event.kind === "done") break;
      if (event.kind === "error") throw errorOf(event);
      if (event.modality === "audio" && event.data.length > 0 && !outputs.audio) options.onFirstAudio?.((performance.now() - startedAt) / 1000);
      (outputs[event.modality] ??= []).push({ data: Buffer.from(event.data).toString("base64"), metadata: event.metadata });
    }
    return reply.send({ request_id: id, outputs });
  }

  const raw = reply.raw;
  reply.hijack();
  raw.writeHead(200, { "content-type": "application/x-ndjson", "transfer-encoding": "chunked", "x-request-id": id });
  let firstAudio = true;
  for (let event: GraphEvent = first; ; event = await run.next()) {
    if (event.kind === "done") break;
    if (raw.destroyed) return;
    if (event.kind === "error") {
      raw.write(`${JSON.stringify({ modality: "error", data: event.message, metadata: { request_id: id } })}\n`);
      break;
    }
    if (event.modality === "audio" && firstAudio && event.data.length > 0) {
      firstAudio = false;
      options.onFirstAudio?.((performance.now() - startedAt) / 1000);
    }
    raw.write(`${JSON.stringify({ modality: event.modality, data: Buffer.from(event.data).toString("base64"), metadata: event.metadata })}\n`);
  }
  raw.end();
  return reply;
}
