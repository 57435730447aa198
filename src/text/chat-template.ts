// Chat prompts rendered with the model's own Jinja template, the way
// transformers' apply_chat_template does: messages, bos_token, eos_token,
// add_generation_prompt, plus any extra template variables the caller passes
// (vLLM's chat_template_kwargs, e.g. enable_thinking for Qwen3).

import { Template } from "@huggingface/jinja";

/** A problem with the chat request or the template; the frontend answers 400. */
export class ChatTemplateError extends Error {
  constructor(
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
    this.name = "ChatTemplateError";
  }
}

/** A content part as a template that loops over content sees it (transformers' processors' form). */
type TemplatePart = { type: "text"; text: string } | { type: "image" } | { type: "audio" };

/** The message's content parts, in order, kept beside the joined string for "openai"-format templates (a symbol: templates never see it). */
const CONTENT_PARTS: unique symbol = Symbol("content parts");

/** A message as the template sees it: content is a string ("string" format) or its parts ("openai" format). */
export interface TemplateMessage {
  role: string;
  content: string;
  [CONTENT_PARTS]?: TemplatePart[];
  [key: string]: unknown;
}

/**
 * How a template reads message content, as vLLM's --chat-template-content-format
 * detects it: "openai" when it loops over a message's content (vision models'
 * templates emit their image token per {"type": "image"} part), or over a
 * variable named content (Qwen3-Omni's template hands each message's content to
 * a macro), else "string".
 */
export type ContentFormat = "string" | "openai";

const CONTENT_LOOP = /\{%-?\s*for\s+\w+\s+in\s+(?:\w+(?:\[\s*['"]content['"]\s*\]|\.content)|content)(?![\w.[])/;

function detectContentFormat(source: string): ContentFormat {
  return CONTENT_LOOP.test(source) ? "openai" : "string";
}

export interface RenderOptions {
  addGenerationPrompt: boolean;
  /** Extra template variables; they cannot override messages or the special tokens. */
  extra?: Record<string, unknown>;
}

export interface SpecialTokens {
  bosToken: string | null;
  eosToken: string | null;
}

type ContentPart = { type?: unknown; text?: unknown; image_url?: unknown; input_audio?: unknown; audio_url?: unknown };

/** An image_url content part: where it is in the request and its URL. */
export interface ImagePart {
  param: string;
  url: string;
}

/** How image parts become text: the model's image placeholder, and where the parts found go. */
export interface ImageCollector {
  placeholder: string;
  found: ImagePart[];
}

/** An audio content part: where it is in the request and its bytes' URL (input_audio's base64 as a data: URL). */
export type AudioPart = ImagePart;

/** How audio parts (input_audio, vLLM's audio_url) become text, as ImageCollector for images. */
export interface AudioCollector {
  placeholder: string;
  found: AudioPart[];
}

// OpenAI's input_audio formats, as the data: URL's media type.
const AUDIO_FORMATS: Record<string, string> = { wav: "audio/wav", mp3: "audio/mpeg", flac: "audio/flac", ogg: "audio/ogg", webm: "audio/webm", m4a: "audio/mp4" };

/**
 * OpenAI content is a string, null (assistant turns with tool calls), or a list
 * of parts. Text parts are joined with "\n" (vLLM's "string" content format);
 * an image_url part becomes the model's image placeholder (`images`) in its
 * place, and is refused for a model without one; other part types are refused.
 */
function normalizeContent(
  content: unknown,
  param: string,
  images: ImageCollector | null = null,
  parts: TemplatePart[] = [],
  audios: AudioCollector | null = null,
): string {
  if (typeof content === "string") {
    parts.push({ type: "text", text: content });
    return content;
  }
  if (content === null || content === undefined) return "";
  if (!Array.isArray(content)) throw new ChatTemplateError(`${param} must be a string or a list of content parts`, param);
  const texts: string[] = [];
  content.forEach((part: unknown, i) => {
    const where = `${param}[${i}]`;
    if (typeof part === "string") {
      texts.push(part);
      parts.push({ type: "text", text: part });
      return;
    }
    if (typeof part !== "object" || part === null) throw new ChatTemplateError(`${where} must be a content part object`, where);
    const { type, text } = part as ContentPart;
    if (type === "image_url") {
      if (images === null) throw new ChatTemplateError(`${where}: this model does not take images`, where);
      const value = (part as ContentPart).image_url;
      const url = typeof value === "string" ? value : typeof value === "object" && value !== null ? (value as { url?: unknown }).url : undefined;
      if (typeof url !== "string" || url === "") throw new ChatTemplateError(`${where}.image_url.url must be a non-empty string`, where);
      images.found.push({ param: where, url });
      texts.push(images.placeholder);
      parts.push({ type: "image" });
      return;
    }
    if (type === "input_audio" || type === "audio_url") {
      if (audios === null) throw new ChatTemplateError(`${where}: this model does not take audio`, where);
      audios.found.push(audioPart(part as ContentPart, type, where));
      texts.push(audios.placeholder);
      parts.push({ type: "audio" });
      return;
    }
    if (type !== "text") {
      throw new ChatTemplateError(`${where}: content part type ${JSON.stringify(type)} is not supported (only "text")`, where);
    }
    if (typeof text !== "string") throw new ChatTemplateError(`${where}.text must be a string`, where);
    texts.push(text);
    parts.push({ type: "text", text });
  });
  return texts.join("\n");
}

/** input_audio {data: base64, format} (OpenAI's) or audio_url {url} (vLLM's) as an AudioPart. */
function audioPart(part: ContentPart, type: "input_audio" | "audio_url", where: string): AudioPart {
  if (type === "audio_url") {
    const value = part.audio_url;
    const url = typeof value === "string" ? value : typeof value === "object" && value !== null ? (value as { url?: unknown }).url : undefined;
    if (typeof url !== "string" || url === "") throw new ChatTemplateError(`${where}.audio_url.url must be a non-empty string`, where);
    return { param: where, url };
  }
  const value = part.input_audio;
  if (typeof value !== "object" || value === null) throw new ChatTemplateError(`${where}.input_audio must be an object with data and format`, where);
  const { data, format } = value as { data?: unknown; format?: unknown };
  if (typeof data !== "string" || data === "") throw new ChatTemplateError(`${where}.input_audio.data must be a non-empty base64 string`, `${where}.input_audio.data`);
  const type_ = typeof format === "string" ? AUDIO_FORMATS[format.toLowerCase()] : undefined;
  if (type_ === undefined) {
    throw new ChatTemplateError(`${where}.input_audio.format must be one of ${Object.keys(AUDIO_FORMATS).join(", ")}`, `${where}.input_audio.format`);
  }
  return { param: where, url: `data:${type_};base64,${data}` };
}

/** Validates OpenAI chat messages and normalizes their content to strings. */
export function normalizeMessages(messages: unknown, images: ImageCollector | null = null, audios: AudioCollector | null = null): TemplateMessage[] {
  if (!Array.isArray(messages)) throw new ChatTemplateError("messages must be a list of messages", "messages");
  if (messages.length === 0) throw new ChatTemplateError("messages must not be empty", "messages");
  return messages.map((message: unknown, i) => {
    const where = `messages[${i}]`;
    if (typeof message !== "object" || message === null || Array.isArray(message)) {
      throw new ChatTemplateError(`${where} must be an object`, where);
    }
    const record = message as Record<string, unknown>;
    if (typeof record.role !== "string" || record.role === "") {
      throw new ChatTemplateError(`${where}.role must be a non-empty string`, `${where}.role`);
    }
    const parts: TemplatePart[] = [];
    const content = normalizeContent(record.content, `${where}.content`, images, parts, audios);
    return { ...record, role: record.role, content, [CONTENT_PARTS]: parts };
  });
}

export class ChatTemplate {
  private readonly template: Template;
  readonly contentFormat: ContentFormat;

  /** Throws ChatTemplateError when the template does not parse. */
  constructor(
    readonly source: string,
    private readonly special: SpecialTokens,
  ) {
    try {
      this.template = new Template(source);
    } catch (error) {
      throw new ChatTemplateError(`the model's chat template cannot be parsed: ${(error as Error).message}`);
    }
    this.contentFormat = detectContentFormat(source);
  }

  render(messages: TemplateMessage[], options: RenderOptions): string {
    try {
      return this.template.render({
        ...options.extra,
        messages: this.contentFormat === "openai" ? messages.map(withParts) : messages,
        bos_token: this.special.bosToken ?? "",
        eos_token: this.special.eosToken ?? "",
        add_generation_prompt: options.addGenerationPrompt,
      });
    } catch (error) {
      // Templates reject bad conversations with raise_exception (e.g. roles that
      // do not alternate); that is the client's request, hence a 400.
      throw new ChatTemplateError(`chat template error: ${(error as Error).message}`, "messages");
    }
  }
}

/** The message with its content as parts (an "openai"-format template loops over them). */
function withParts(message: TemplateMessage): Record<string, unknown> {
  const parts = message[CONTENT_PARTS];
  return parts === undefined ? message : { ...message, content: parts };
}

/** The error for a model without a chat template. */
export function noChatTemplateError(modelName: string): ChatTemplateError {
  return new ChatTemplateError(
    `model ${modelName} has no chat template (tokenizer_config.json chat_template or chat_template.jinja); use /v1/completions instead`,
    "messages",
  );
}
