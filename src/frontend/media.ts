// Images and audio of a chat request: image_url and audio parts loaded to bytes
// (data: URLs always; file:// under --allowed-local-media-path; http(s) from
// --allowed-media-domains), counted and sized against the limits, and the
// prompt's image placeholders expanded to the model's image tokens. Decoding and
// preprocessing are the worker's (Pillow, PyAV): TypeScript only carries bytes
// and says where they sit.

import { createHash, type Hash } from "node:crypto";
import { readFile, realpath, stat } from "node:fs/promises";
import { sep } from "node:path";
import { fileURLToPath } from "node:url";
import type { MediaSpan, PromptMedia } from "../engine/types.js";
import { imageSize } from "image-size";
import type { ImageResize, VisionPrompt } from "../config/model-dir.js";
import type { AudioPart, ImagePart } from "../text/chat-template.js";
import { ApiError, badRequest } from "./openai-error.js";

export interface MediaOptions {
  /** Hosts whose http(s) URLs may be fetched (lower case); empty: none. */
  allowedDomains: string[];
  /** file:// URLs must resolve inside this directory; null: none allowed. */
  allowedLocalPath: string | null;
  /** --limit-mm-per-prompt's "image"; null: no limit. */
  maxImagesPerPrompt: number | null;
  maxImageBytes: number;
  /** --limit-mm-per-prompt's "audio"; null: no limit. */
  maxAudiosPerPrompt?: number | null;
}

export const DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024;
// OpenAI's limit on an uploaded audio file, for each audio part.
const MAX_AUDIO_BYTES = 25 * 1024 * 1024;

export const NO_MEDIA_ALLOWED: MediaOptions = { allowedDomains: [], allowedLocalPath: null, maxImagesPerPrompt: null, maxImageBytes: DEFAULT_MAX_IMAGE_BYTES };

/** What a loader checks for one kind of media part. */
interface MediaKind {
  noun: "image" | "audio";
  types: readonly string[];
  maxBytes: number;
  /** The flag that raises maxBytes, for the 413's message; null: none. */
  flag: string | null;
}

const IMAGE_TYPES = ["image/png", "image/jpeg", "image/jpg", "image/webp"];
// What input_audio's formats and audio_url's data: URLs may carry; the worker (PyAV) decides what decodes.
const AUDIO_TYPES = ["audio/wav", "audio/x-wav", "audio/wave", "audio/mpeg", "audio/mp3", "audio/flac", "audio/ogg", "audio/webm", "audio/mp4", "audio/m4a"];
const FETCH_TIMEOUT_MS = 10_000;
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

const imageKind = (options: MediaOptions): MediaKind => ({ noun: "image", types: IMAGE_TYPES, maxBytes: options.maxImageBytes, flag: "--max-image-bytes" });
const AUDIO_KIND: MediaKind = { noun: "audio", types: AUDIO_TYPES, maxBytes: MAX_AUDIO_BYTES, flag: null };

function tooLarge(param: string, bytes: number, kind: MediaKind): ApiError {
  const why = `${param}: the ${kind.noun} has ${bytes} bytes, more than the ${kind.maxBytes} allowed${kind.flag === null ? "" : ` (${kind.flag})`}`;
  return new ApiError(413, why, "invalid_request_error", param);
}

function fromDataUrl(part: ImagePart, kind: MediaKind): Uint8Array {
  const { param, url } = part;
  const comma = url.indexOf(",");
  if (comma < 0) throw badRequest(`${param}: malformed data: URL (no comma)`, param);
  const [mime = "", ...attributes] = url.slice("data:".length, comma).split(";");
  const type = mime.trim().toLowerCase();
  if (!kind.types.includes(type)) {
    throw badRequest(`${param}: unsupported media type ${JSON.stringify(type || "text/plain")}; supported: ${kind.types.join(", ")}`, param);
  }
  if (!attributes.some((a) => a.trim().toLowerCase() === "base64")) throw badRequest(`${param}: a data: URL ${kind.noun} must be base64 (data:${type};base64,...)`, param);
  const payload = url.slice(comma + 1).replace(/\s+/g, "");
  if (payload.length % 4 !== 0 || !BASE64.test(payload)) throw badRequest(`${param}: the data: URL's payload is not valid base64`, param);
  // 3 bytes per 4 characters, less the padding: checked before decoding anything.
  const size = (payload.length / 4) * 3 - (payload.endsWith("==") ? 2 : payload.endsWith("=") ? 1 : 0);
  if (size > kind.maxBytes) throw tooLarge(param, size, kind);
  if (size === 0) throw badRequest(`${param}: the ${kind.noun} is empty (0 bytes)`, param);
  return new Uint8Array(Buffer.from(payload, "base64"));
}

async function fromFile(part: ImagePart, options: MediaOptions, kind: MediaKind): Promise<Uint8Array> {
  const { param, url } = part;
  if (options.allowedLocalPath === null) throw badRequest(`${param}: local files are not allowed (start the server with --allowed-local-media-path)`, param);
  let path: string;
  let root: string;
  try {
    path = await realpath(fileURLToPath(url));
    root = await realpath(options.allowedLocalPath);
  } catch (error) {
    throw badRequest(`${param}: cannot open ${url}: ${(error as Error).message}`, param);
  }
  if (path !== root && !path.startsWith(root.endsWith(sep) ? root : root + sep)) {
    throw badRequest(`${param}: ${url} is outside the allowed local media path`, param);
  }
  const info = await stat(path);
  if (!info.isFile()) throw badRequest(`${param}: ${url} is not a file`, param);
  if (info.size > kind.maxBytes) throw tooLarge(param, info.size, kind);
  return new Uint8Array(await readFile(path));
}

async function fromHttp(part: ImagePart, options: MediaOptions, kind: MediaKind): Promise<Uint8Array> {
  const { param, url } = part;
  const host = new URL(url).hostname.toLowerCase();
  if (!options.allowedDomains.includes(host)) {
    const what = kind.noun === "image" ? "images" : "audio";
    throw badRequest(`${param}: fetching ${what} from ${JSON.stringify(host)} is not allowed (start the server with --allowed-media-domains)`, param);
  }
  let response: Response;
  try {
    response = await fetch(url, { signal: AbortSignal.timeout(FETCH_TIMEOUT_MS), redirect: "error" });
  } catch (error) {
    throw badRequest(`${param}: cannot fetch ${url}: ${(error as Error).message}`, param);
  }
  if (!response.ok) throw badRequest(`${param}: fetching ${url} answered HTTP ${response.status}`, param);
  const declared = Number(response.headers.get("content-length") ?? "0");
  if (declared > kind.maxBytes) throw tooLarge(param, declared, kind);
  const bytes = new Uint8Array(await response.arrayBuffer());
  if (bytes.length > kind.maxBytes) throw tooLarge(param, bytes.length, kind);
  return bytes;
}

async function loadParts(parts: readonly ImagePart[], options: MediaOptions, kind: MediaKind, limit: number | null): Promise<Uint8Array[]> {
  if (limit !== null && parts.length > limit) {
    const what = kind.noun === "image" ? `image${limit === 1 ? "" : "s"}` : `audio part${limit === 1 ? "" : "s"}`;
    throw badRequest(`at most ${limit} ${what} may be provided in one prompt (--limit-mm-per-prompt), got ${parts.length}`, "messages");
  }
  return Promise.all(
    parts.map((part) => {
      const scheme = part.url.slice(0, part.url.indexOf(":") + 1).toLowerCase();
      if (scheme === "data:") return fromDataUrl(part, kind);
      if (scheme === "file:") return fromFile(part, options, kind);
      if (scheme === "http:" || scheme === "https:") return fromHttp(part, options, kind);
      throw badRequest(`${part.param}: unsupported ${kind.noun} URL scheme ${JSON.stringify(scheme || part.url.slice(0, 16))}; use data:, http(s): or file:`, part.param);
    }),
  );
}

/** The bytes of each image part, in order; a 4xx naming the part for anything not allowed or not loadable. */
export function loadImages(parts: readonly ImagePart[], options: MediaOptions): Promise<Uint8Array[]> {
  return loadParts(parts, options, imageKind(options), options.maxImagesPerPrompt);
}

/** The bytes of each audio part (input_audio's base64, or audio_url), in order, as loadImages. */
export function loadAudios(parts: readonly AudioPart[], options: MediaOptions): Promise<Uint8Array[]> {
  return loadParts(parts, options, AUDIO_KIND, options.maxAudiosPerPrompt ?? null);
}

/** Python's round(): halves to even (smart_resize's rounding). */
function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/**
 * The tokens an image takes in the Qwen2-VL family: its size as Qwen2VLImageProcessor's
 * smart_resize makes it (sides rounded to multiples of patch * merge, scaled into
 * [minPixels, maxPixels]), one token per merged patch. 400 for an image whose size
 * cannot be read or whose aspect ratio is over 200.
 */
function resizedImageTokens(image: Uint8Array, resize: ImageResize, param: string): number {
  let width: number;
  let height: number;
  try {
    ({ width, height } = imageSize(image));
  } catch {
    throw badRequest(`${param}: the image's size cannot be read (not a PNG, JPEG, WebP, GIF or BMP image)`, param);
  }
  if (!(width > 0 && height > 0)) throw badRequest(`${param}: the image's size cannot be read`, param);
  if (Math.max(width, height) / Math.min(width, height) > 200) {
    throw badRequest(`${param}: an aspect ratio of ${width}x${height} is over 200, which this model's processor refuses`, param);
  }
  const factor = resize.patch * resize.merge;
  let h = roundHalfEven(height / factor) * factor;
  let w = roundHalfEven(width / factor) * factor;
  if (h * w > resize.maxPixels) {
    const beta = Math.sqrt((height * width) / resize.maxPixels);
    h = Math.max(factor, Math.floor(height / beta / factor) * factor);
    w = Math.max(factor, Math.floor(width / beta / factor) * factor);
  } else if (h * w < resize.minPixels) {
    const beta = Math.sqrt(resize.minPixels / (height * width));
    h = Math.ceil((height * beta) / factor) * factor;
    w = Math.ceil((width * beta) / factor) * factor;
  }
  return (h / factor) * (w / factor);
}

/** 53-bit hash of media bytes and what else shapes the model's input from them (the prefix cache's key). */
export function mediaHash(bytes: Uint8Array, ...salt: number[]): number {
  const sha = createHash("sha256").update(bytes);
  if (salt.length > 0) sha.update(Float64Array.from(salt));
  return hash53(sha);
}

function hash53(sha: Hash): number {
  const digest = sha.digest();
  return (digest.readUInt32LE(4) & 0x1f_ffff) * 0x1_0000_0000 + digest.readUInt32LE(0);
}

/**
 * The prompt with each image placeholder token expanded to the image's tokens
 * (what transformers' LlavaProcessor does to the text), and where each image sits.
 */
export function expandImageTokens(promptIds: readonly number[], vision: VisionPrompt, parts: readonly ImagePart[], images: readonly Uint8Array[]): { promptIds: number[]; media: PromptMedia } {
  const ids: number[] = [];
  const spans: MediaSpan[] = [];
  for (const id of promptIds) {
    if (id !== vision.imageTokenId) {
      ids.push(id);
      continue;
    }
    const image = images[spans.length];
    if (image === undefined) break;
    const length = vision.expandsInWorker ? 1 : (vision.tokensPerImage ?? resizedImageTokens(image, vision.resize!, parts[spans.length]?.param ?? "messages"));
    spans.push({ offset: ids.length, length, hash: mediaHash(image) });
    for (let i = 0; i < length; i++) ids.push(id);
  }
  const placeholders = promptIds.filter((id) => id === vision.imageTokenId).length;
  if (placeholders !== images.length) {
    throw badRequest(`the prompt holds ${placeholders} image placeholders (${JSON.stringify(vision.imageToken)}) for ${images.length} images; the text must not contain the placeholder itself`, "messages");
  }
  return { promptIds: ids, media: { spans, images: [...images], params: parts.map((p) => p.param) } };
}

/** 53-bit hash of every image and audio clip of a prompt, in order (PromptMedia.hash). */
export function promptMediaHash(media: PromptMedia): number {
  const sha = createHash("sha256");
  for (const image of media.images) sha.update(Uint8Array.of(1)).update(Float64Array.of(image.length)).update(image);
  for (const clip of media.clips ?? []) sha.update(Uint8Array.of(2)).update(Float64Array.of(clip.data.length)).update(clip.data);
  return hash53(sha);
}
