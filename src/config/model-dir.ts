// Reads what the control plane needs from a Hugging Face model directory:
// architecture, context length and EOS ids (config.json, generation_config.json),
// the tokenizer file, and the chat template and special-token strings
// (tokenizer_config.json, chat_template.jinja). Weights are the worker's business.

import { existsSync, readFileSync, statSync } from "node:fs";
import { basename, join, resolve } from "node:path";

/** A model directory that cannot be used; the message names the directory or file. */
export class ModelDirError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ModelDirError";
  }
}

/** What the served model needs to place images in a prompt. */
export interface VisionPrompt {
  /** The placeholder text an image part becomes before tokenization. */
  imageToken: string;
  imageTokenId: number;
  /** Tokens each image expands to (transformers' LlavaProcessor count); null where it depends on the image's size (resize). */
  tokensPerImage: number | null;
  /** The Qwen2-VL family: an image's tokens follow from the size the processor resizes it to; null otherwise. */
  resize?: ImageResize | null;
  /**
   * The worker's process_prompt expands each placeholder (Qwen3-Omni, whose audio token counts only
   * the decoded audio gives): the prompt keeps one token per image, and the engine takes the worker's ids.
   */
  expandsInWorker?: boolean;
}

/** What the served model needs to place audio in a prompt (chat input_audio parts); the worker expands each placeholder. */
export interface AudioPrompt {
  /** The placeholder text an audio part becomes before tokenization. */
  audioToken: string;
  audioTokenId: number;
}

/** Qwen2VLImageProcessor's resize (preprocessor_config.json): sides made multiples of patch * merge within the pixel bounds. */
export interface ImageResize {
  patch: number;
  merge: number;
  minPixels: number;
  maxPixels: number;
}

export interface ModelDirInfo {
  /** Absolute path of the directory. */
  dir: string;
  /** The directory's basename, the default served model name. */
  name: string;
  /** config.json `architectures` (may be empty). */
  architectures: string[];
  /** config.json `max_position_embeddings`, if present. */
  maxPositionEmbeddings: number | null;
  /** EOS ids: generation_config.json wins, else config.json; deduplicated. */
  eosTokenIds: number[];
  bosTokenId: number | null;
  /** config.json `vocab_size`, if present. */
  vocabSize: number | null;
  /** null when the directory has no tokenizer.json (a model without text in or out, e.g. a graph whose nodes bring their own). */
  tokenizerPath: string | null;
  tokenizer: TokenizerSettings;
  /**
   * generation_config.json's sampling defaults (null: not given), what a
   * speech request that names no temperature samples with (CSM's 0.9 and
   * top-k 50), as vLLM takes a model's generation config for its defaults.
   */
  samplingDefaults: SamplingDefaults;
  /** config.json `image_generation`: what an image model's /v1/images/generations accepts; null for other models. */
  imageGeneration: ImageGenerationSpec | null;
  /** A vision-language model (LlavaForConditionalGeneration): how images sit in its prompts; null otherwise. */
  vision: VisionPrompt | null;
  /** A speech-recognition model (WhisperForConditionalGeneration): its decoder prompt tokens and audio window; null otherwise. */
  speech: SpeechRecognition | null;
  /** A model that hears (Qwen3-Omni): how audio sits in its chat prompts; null otherwise. */
  audio: AudioPrompt | null;
}

/** The special-token layout of a Whisper vocabulary. */
export interface WhisperTokenLayout {
  /** <|endoftext|>; every id >= eot is not text. */
  eot: number;
  /** <|notimestamps|>. */
  noTimestamps: number;
  /** <|0.00|>: right after <|notimestamps|>; timestampBegin + i is i * timePrecision seconds. */
  timestampBegin: number;
  /** Seconds per timestamp step: a 30 s window over 1500 encoder positions. */
  timePrecision: number;
}

export interface SamplingDefaults {
  temperature: number | null;
  topK: number | null;
  /** What a request naming no max_tokens may generate (CSM: 125 frames, 10 s). */
  maxNewTokens: number | null;
}

/** Reads the token layout from a Whisper model's generation_config.json (parsed); throws naming a bad field. */
export function whisperTokenIds(generationConfig: unknown): WhisperTokenLayout {
  if (typeof generationConfig !== "object" || generationConfig === null || Array.isArray(generationConfig)) {
    throw new Error("Whisper generation_config.json must be a JSON object");
  }
  const config = generationConfig as Record<string, unknown>;
  const field = (name: string): number => {
    const value = config[name];
    if (value === undefined || value === null) throw new Error(`Whisper generation_config.json has no ${name}`);
    if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
      throw new Error(`Whisper generation_config.json ${name} must be a non-negative integer, got ${JSON.stringify(value)}`);
    }
    return value;
  };
  const eot = field("eos_token_id");
  const noTimestamps = field("no_timestamps_token_id");
  // Timestamps sit right after <|notimestamps|>, and all specials after text.
  if (noTimestamps <= eot) {
    throw new Error(`Whisper generation_config.json no_timestamps_token_id (${noTimestamps}) must be above eos_token_id (${eot})`);
  }
  return { eot, noTimestamps, timestampBegin: noTimestamps + 1, timePrecision: 0.02 };
}

/** What a transcription needs of a Whisper directory (generation_config.json, preprocessor_config.json, config.json). */
export interface SpeechRecognition {
  tokens: WhisperTokenLayout;
  /** <|startoftranscript|> */
  startOfTranscript: number;
  /** <|startofprev|>: earlier text (a request's prompt) goes after it, before <|startoftranscript|>. */
  startOfPrev: number;
  /** Language code (en, de, ...) -> its token; empty for an English-only model. */
  languageTokens: Map<string, number>;
  transcribe: number;
  translate: number | null;
  samplingRate: number;
  /** Samples in one window (chunk_length seconds). */
  windowSamples: number;
  /** Mel frames per second (sampling_rate / hop_length): what long-form seeks count. */
  framesPerSecond: number;
  /** Decoder positions (max_target_positions): prompt and generated tokens together. */
  maxTargetPositions: number;
}

/** An image model's request bounds, from its config.json `image_generation` block (the model's builder writes it). */
export interface ImageGenerationSpec {
  /** Supported sizes, "WxH". */
  sizes: string[];
  defaultSize: string;
  defaultInferenceSteps: number;
  maxInferenceSteps: number;
  /** Most images one request may ask for. */
  maxN: number;
  /** The text encoder reads at most this many prompt ids (one per UTF-8 byte, plus a start id). */
  maxPromptTokens: number;
  /** Image pixels per latent position along each side (usage counts latent positions as image tokens). */
  latentDownsampling: number;
}

interface TokenizerSettings {
  /** The default chat template, or null when the model has none. */
  chatTemplate: string | null;
  /** Named templates (tokenizer_config.json list form), "default" included when present. */
  namedChatTemplates: Record<string, string>;
  bosToken: string | null;
  eosToken: string | null;
  /**
   * tokenizer_config.json `add_bos_token`; null when absent. transformers' Llama
   * tokenizers prepend BOS on this flag even if tokenizer.json's post-processor does not.
   */
  addBosToken: boolean | null;
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };

function isObject(value: Json | undefined): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function readJsonObject(path: string, required: true): JsonObject;
function readJsonObject(path: string, required: false): JsonObject | null;
function readJsonObject(path: string, required: boolean): JsonObject | null {
  if (!existsSync(path)) {
    if (required) throw new ModelDirError(`${path} not found: the model directory has no ${basename(path)}`);
    return null;
  }
  let parsed: Json;
  try {
    parsed = JSON.parse(readFileSync(path, "utf8")) as Json;
  } catch (error) {
    throw new ModelDirError(`${path} is not valid JSON: ${(error as Error).message}`);
  }
  if (!isObject(parsed)) throw new ModelDirError(`${path} must hold a JSON object`);
  return parsed;
}

function optionalInt(value: Json | undefined, what: string): number | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isInteger(value)) throw new ModelDirError(`${what} must be an integer, got ${JSON.stringify(value)}`);
  return value;
}

/** An EOS entry: an int, a list of ints, or absent. */
function tokenIdList(value: Json | undefined, what: string): number[] | null {
  if (value === undefined || value === null) return null;
  const list = Array.isArray(value) ? value : [value];
  return list.map((entry, i) => {
    if (typeof entry !== "number" || !Number.isInteger(entry) || entry < 0) {
      throw new ModelDirError(`${what}[${i}] must be a non-negative integer, got ${JSON.stringify(entry)}`);
    }
    return entry;
  });
}

/** Special tokens in tokenizer_config.json are strings or AddedToken dicts ({content, ...}). */
function tokenString(value: Json | undefined): string | null {
  if (typeof value === "string") return value;
  if (isObject(value) && typeof value.content === "string") return value.content;
  return null;
}

function readTokenizerSettings(dir: string): TokenizerSettings {
  const configPath = join(dir, "tokenizer_config.json");
  const config = readJsonObject(configPath, false) ?? {};
  const namedChatTemplates: Record<string, string> = {};
  let chatTemplate: string | null = null;
  const raw = config.chat_template;
  if (typeof raw === "string") {
    chatTemplate = raw;
  } else if (Array.isArray(raw)) {
    for (const [i, entry] of raw.entries()) {
      if (!isObject(entry) || typeof entry.name !== "string" || typeof entry.template !== "string") {
        throw new ModelDirError(`${configPath}: chat_template[${i}] must be {"name": string, "template": string}`);
      }
      namedChatTemplates[entry.name] = entry.template;
    }
    chatTemplate = namedChatTemplates.default ?? null;
  } else if (raw !== undefined && raw !== null) {
    throw new ModelDirError(`${configPath}: chat_template must be a string or a list of {name, template}`);
  }
  // transformers lets a chat_template.jinja file beside the config override the
  // inline template (newer checkpoints ship only the file).
  const jinjaPath = join(dir, "chat_template.jinja");
  if (existsSync(jinjaPath)) {
    chatTemplate = readFileSync(jinjaPath, "utf8");
    namedChatTemplates.default = chatTemplate;
  } else if (chatTemplate === null) {
    // Older processor-style checkpoints keep it in chat_template.json.
    const legacy = readJsonObject(join(dir, "chat_template.json"), false);
    if (legacy && typeof legacy.chat_template === "string") chatTemplate = legacy.chat_template;
  }
  const addBos = config.add_bos_token;
  return {
    chatTemplate,
    namedChatTemplates,
    bosToken: tokenString(config.bos_token),
    eosToken: tokenString(config.eos_token),
    addBosToken: typeof addBos === "boolean" ? addBos : null,
  };
}

/** The tokenizer file of a model that takes or produces text; ModelDirError naming it when missing. */
export function requireTokenizer(info: ModelDirInfo): string {
  if (info.tokenizerPath === null) {
    throw new ModelDirError(`${join(info.dir, "tokenizer.json")} not found: Baton needs a fast tokenizer file (tokenizer.json) in the model directory`);
  }
  return info.tokenizerPath;
}

export function readModelDir(dirIn: string): ModelDirInfo {
  const dir = resolve(dirIn);
  if (!existsSync(dir)) throw new ModelDirError(`model directory ${dir} does not exist`);
  if (!statSync(dir).isDirectory()) throw new ModelDirError(`${dir} is not a directory`);

  const configPath = join(dir, "config.json");
  const config = readJsonObject(configPath, true);
  // Multimodal wrappers keep the language model's settings under text_config.
  const textConfig = isObject(config.text_config) ? config.text_config : config;

  const architecturesRaw = config.architectures;
  let architectures: string[] = [];
  if (Array.isArray(architecturesRaw)) {
    architectures = architecturesRaw.filter((a): a is string => typeof a === "string");
  } else if (architecturesRaw !== undefined && architecturesRaw !== null) {
    throw new ModelDirError(`${configPath}: architectures must be a list of strings`);
  }

  const generation = readJsonObject(join(dir, "generation_config.json"), false);
  const eosFromGeneration = generation ? tokenIdList(generation.eos_token_id, "generation_config.json eos_token_id") : null;
  const eosFromConfig = tokenIdList(textConfig.eos_token_id ?? config.eos_token_id, "config.json eos_token_id");
  const eosTokenIds = [...new Set(eosFromGeneration ?? eosFromConfig ?? [])];
  const bosTokenId =
    (generation ? optionalInt(generation.bos_token_id, "generation_config.json bos_token_id") : null) ??
    optionalInt(textConfig.bos_token_id ?? config.bos_token_id, "config.json bos_token_id");

  const tokenizerFile = join(dir, "tokenizer.json");
  const tokenizerPath = existsSync(tokenizerFile) ? tokenizerFile : null;

  return {
    dir,
    name: basename(dir),
    architectures,
    maxPositionEmbeddings: optionalInt(textConfig.max_position_embeddings, "config.json max_position_embeddings"),
    eosTokenIds,
    bosTokenId,
    vocabSize: optionalInt(textConfig.vocab_size, "config.json vocab_size"),
    tokenizerPath,
    tokenizer: readTokenizerSettings(dir),
    imageGeneration: readImageGeneration(config.image_generation, configPath),
    vision: architectures[0] === "LlavaForConditionalGeneration" ? readLlavaPrompt(dir, config)
      : architectures[0] === "Qwen2_5_VLForConditionalGeneration" ? readQwenVlPrompt(dir, config)
      : architectures[0] === QWEN3_OMNI ? readOmniVisionPrompt(config) : null,
    audio: architectures[0] === QWEN3_OMNI ? readOmniAudioPrompt(config) : null,
    speech: architectures[0] === "WhisperForConditionalGeneration" ? readSpeechRecognition(dir, config, generation) : null,
    samplingDefaults: {
      temperature: generation ? optionalNumber(generation.temperature, "generation_config.json temperature") : null,
      topK: generation ? optionalInt(generation.top_k, "generation_config.json top_k") : null,
      maxNewTokens: generation ? optionalInt(generation.max_new_tokens, "generation_config.json max_new_tokens") : null,
    },
  };
}

function optionalNumber(value: unknown, what: string): number | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) throw new ModelDirError(`${what} must be a non-negative number`);
  return value;
}

function readSpeechRecognition(dir: string, config: JsonObject, generation: JsonObject | null): SpeechRecognition {
  const where = join(dir, "generation_config.json");
  if (generation === null) throw new ModelDirError(`${where} not found: a Whisper directory's generation config names its language and task tokens`);
  let tokens: WhisperTokenLayout;
  try {
    tokens = whisperTokenIds(generation);
  } catch (error) {
    throw new ModelDirError(`${where}: ${(error as Error).message}`);
  }
  const id = (key: string): number => {
    const value = optionalInt(generation[key], `${where} ${key}`);
    if (value === null || value < 0) throw new ModelDirError(`${where}: ${key} must be a token id`);
    return value;
  };
  const languageTokens = new Map<string, number>();
  const langs = generation.lang_to_id;
  if (generation.is_multilingual === true && isObject(langs)) {
    for (const [token, value] of Object.entries(langs)) {
      const code = /^<\|(.+)\|>$/.exec(token)?.[1];
      if (code === undefined || typeof value !== "number") throw new ModelDirError(`${where}: lang_to_id entry ${token} is not <|code|> -> id`);
      languageTokens.set(code, value);
    }
  }
  const tasks = isObject(generation.task_to_id) ? generation.task_to_id : {};
  const transcribe = typeof tasks.transcribe === "number" ? tasks.transcribe : null;
  if (languageTokens.size > 0 && transcribe === null) throw new ModelDirError(`${where}: task_to_id has no transcribe token`);
  const pre = readJsonObject(join(dir, "preprocessor_config.json"), true);
  const samplingRate = optionalInt(pre.sampling_rate, "preprocessor_config.json sampling_rate") ?? 16000;
  const hop = optionalInt(pre.hop_length, "preprocessor_config.json hop_length") ?? 160;
  const chunk = optionalInt(pre.chunk_length, "preprocessor_config.json chunk_length") ?? 30;
  return {
    tokens,
    startOfTranscript: id("decoder_start_token_id"),
    startOfPrev: id("prev_sot_token_id"),
    languageTokens,
    transcribe: transcribe ?? -1,
    translate: typeof tasks.translate === "number" ? tasks.translate : null,
    samplingRate,
    windowSamples: chunk * samplingRate,
    framesPerSecond: samplingRate / hop,
    maxTargetPositions: optionalInt(config.max_target_positions, "config.json max_target_positions") ?? 448,
  };
}

function readImageGeneration(raw: Json | undefined, configPath: string): ImageGenerationSpec | null {
  if (raw === undefined || raw === null) return null;
  const where = `${configPath} image_generation`;
  if (!isObject(raw)) throw new ModelDirError(`${where} must be an object`);
  const positive = (key: string): number => {
    const value = optionalInt(raw[key], `${where}.${key}`);
    if (value === null || value < 1) throw new ModelDirError(`${where}.${key} must be a positive integer`);
    return value;
  };
  const sizes = raw.sizes;
  if (!Array.isArray(sizes) || sizes.length === 0 || !sizes.every((s): s is string => typeof s === "string" && /^[1-9][0-9]*x[1-9][0-9]*$/.test(s))) {
    throw new ModelDirError(`${where}.sizes must be a non-empty list of sizes such as "64x64"`);
  }
  const defaultSize = raw.default_size;
  if (typeof defaultSize !== "string" || !sizes.includes(defaultSize)) throw new ModelDirError(`${where}.default_size must be one of sizes`);
  const spec: ImageGenerationSpec = {
    sizes,
    defaultSize,
    defaultInferenceSteps: positive("default_inference_steps"),
    maxInferenceSteps: positive("max_inference_steps"),
    maxN: positive("max_n"),
    maxPromptTokens: positive("max_prompt_tokens"),
    latentDownsampling: positive("latent_downsampling"),
  };
  if (spec.defaultInferenceSteps > spec.maxInferenceSteps) throw new ModelDirError(`${where}.default_inference_steps must not exceed max_inference_steps`);
  return spec;
}

/**
 * Qwen2.5-VL: the image placeholder is <|image_pad|> (its chat template renders an image part as
 * <|vision_start|><|image_pad|><|vision_end|>), expanded by the image's resized size as
 * Qwen2VLImageProcessor resizes it (top-level min_pixels / max_pixels win over size, as there).
 */
function readQwenVlPrompt(dir: string, config: JsonObject): VisionPrompt {
  const path = join(dir, "preprocessor_config.json");
  const pre = readJsonObject(path, true);
  const size = isObject(pre.size) ? pre.size : {};
  const int = (value: Json | undefined, what: string, fallback: number): number => {
    const v = optionalInt(value, `${path} ${what}`) ?? fallback;
    if (v < 1) throw new ModelDirError(`${path} ${what} must be positive`);
    return v;
  };
  const resize: ImageResize = {
    patch: int(pre.patch_size, "patch_size", 14),
    merge: int(pre.merge_size, "merge_size", 2),
    minPixels: int(pre.min_pixels ?? size.shortest_edge, "min_pixels", 56 * 56),
    maxPixels: int(pre.max_pixels ?? size.longest_edge, "max_pixels", 28 * 28 * 1280),
  };
  const imageTokenId = optionalInt(config.image_token_id, "config.json image_token_id") ?? 151655;
  return { imageToken: "<|image_pad|>", imageTokenId, tokensPerImage: null, resize };
}

const QWEN3_OMNI = "Qwen3OmniMoeForConditionalGeneration";

/** Qwen3-Omni's thinker_config (its token ids), or {} where absent. */
function omniThinker(config: JsonObject): JsonObject {
  return isObject(config.thinker_config) ? config.thinker_config : {};
}

/** Qwen3-Omni: an image part is <|vision_start|><|image_pad|><|vision_end|>, the worker expands the pad. */
function readOmniVisionPrompt(config: JsonObject): VisionPrompt {
  const imageTokenId = optionalInt(omniThinker(config).image_token_id, "config.json thinker_config.image_token_id") ?? 151655;
  return { imageToken: "<|image_pad|>", imageTokenId, tokensPerImage: null, resize: null, expandsInWorker: true };
}

/** Qwen3-Omni: an audio part is <|audio_start|><|audio_pad|><|audio_end|>, the worker expands the pad. */
function readOmniAudioPrompt(config: JsonObject): AudioPrompt {
  const audioTokenId = optionalInt(omniThinker(config).audio_token_id, "config.json thinker_config.audio_token_id") ?? 151675;
  return { audioToken: "<|audio_pad|>", audioTokenId };
}

function sizeOf(value: Json | undefined, what: string): { height: number; width: number } | null {
  if (typeof value === "number") return { height: value, width: value };
  if (!isObject(value)) return null;
  const height = optionalInt(value.height ?? value.shortest_edge, `${what}.height`);
  const width = optionalInt(value.width ?? value.shortest_edge, `${what}.width`);
  return height !== null && width !== null ? { height, width } : null;
}

/**
 * The image token and how many tokens one image takes, counted as transformers'
 * LlavaProcessor does: (height / patch) * (width / patch) of the processed
 * image, plus num_additional_image_tokens, less one with the "default" feature
 * strategy (which drops the CLS feature). The worker checks that its vision
 * node gives as many features.
 */
function readLlavaPrompt(dir: string, config: JsonObject): VisionPrompt {
  const processor = readJsonObject(join(dir, "processor_config.json"), false) ?? {};
  const preprocessor = readJsonObject(join(dir, "preprocessor_config.json"), true);
  const visionConfig = isObject(config.vision_config) ? config.vision_config : {};
  const imageTokenId = optionalInt(config.image_token_index ?? config.image_token_id, "config.json image_token_index") ?? 32000;
  const imageToken = typeof processor.image_token === "string" ? processor.image_token : "<image>";
  const patch = optionalInt(processor.patch_size ?? visionConfig.patch_size, "processor_config.json patch_size") ?? 14;
  const additional = optionalInt(processor.num_additional_image_tokens, "processor_config.json num_additional_image_tokens") ?? 0;
  const strategy = processor.vision_feature_select_strategy ?? config.vision_feature_select_strategy ?? "default";
  const cropped = preprocessor.do_center_crop !== false;
  const size = (cropped ? sizeOf(preprocessor.crop_size, "crop_size") : null) ?? sizeOf(preprocessor.size, "size");
  if (size === null) throw new ModelDirError(`${join(dir, "preprocessor_config.json")}: no crop_size or size to count image tokens with`);
  const tokensPerImage = Math.floor(size.height / patch) * Math.floor(size.width / patch) + additional - (strategy === "default" ? 1 : 0);
  if (tokensPerImage < 1) throw new ModelDirError(`${dir}: an image would take ${tokensPerImage} tokens`);
  return { imageToken, imageTokenId, tokensPerImage };
}
