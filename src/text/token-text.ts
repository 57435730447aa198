// The text of single tokens, for logprobs. Two questions, two answers:
//
// - Which text does each token of a sequence (a prompt, a completion) add to
//   that sequence's text? TokenTextSession answers incrementally, with the
//   detokenizer's prefix/read-offset rule, so the strings concatenate to the
//   decoded text exactly: a SentencePiece/Metaspace token keeps its leading
//   space except where the decoder drops it (the very start of a text), and
//   the bytes of a character split over several tokens all go to the token
//   that completes it (the earlier ones add ""). Each token also gets the
//   UTF-8 bytes it contributes, which concatenate to the text's bytes.
// - What is a token on its own (a top-k alternative, a prompt_logprobs
//   entry)? TokenVocabulary.lone: decode([id]) with the leading spaces
//   SentencePiece's decoder strips put back, and a token that is not whole
//   UTF-8 on its own written as its bytes, "bytes:\xe4\xbd" (vLLM's form).
//
// Everything here is synchronous: tokenizers' Decoder.decode on vocabulary
// pieces, which is what Tokenizer.decode runs after mapping ids to pieces, or
// the pure-JS ByteLevelDecoder for byte-level BPE.

import type { Decoder, Tokenizer } from "tokenizers";
import type { ByteLevelDecoder } from "./byte-level.js";

const REPLACEMENT_CHAR = "\uFFFD";
const utf8 = new TextEncoder();
const fatalUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const BYTE_PIECE = /^<0x([0-9A-Fa-f]{2})>$/;

/** The parts of tokenizer.json read here. */
export interface TokenizerJsonView {
  decoder?: unknown;
  added_tokens?: { id: number; content: string; special: boolean }[];
}

/** The piece SentencePiece-style decoders turn into a space ("▁"), or null for other decoders. */
function spaceMarker(decoder: unknown): string | null {
  if (typeof decoder !== "object" || decoder === null) return null;
  const d = decoder as { type?: string; replacement?: string; pattern?: { String?: string }; content?: string; decoders?: unknown[] };
  if (d.type === "Metaspace") return d.replacement ?? "▁";
  if (d.type === "Replace" && d.content === " " && typeof d.pattern?.String === "string") return d.pattern.String;
  if (d.type === "Sequence") {
    for (const inner of d.decoders ?? []) {
      const marker = spaceMarker(inner);
      if (marker !== null) return marker;
    }
  }
  return null;
}

function hasByteFallback(decoder: unknown): boolean {
  if (typeof decoder !== "object" || decoder === null) return false;
  const d = decoder as { type?: string; decoders?: unknown[] };
  return d.type === "ByteFallback" || (d.type === "Sequence" && (d.decoders ?? []).some(hasByteFallback));
}

function isWholeUtf8(bytes: Uint8Array): boolean {
  try {
    fatalUtf8.decode(bytes);
    return true;
  } catch {
    return false;
  }
}

/** vLLM's form for a token that is not whole UTF-8 on its own. */
function bytesToken(bytes: Uint8Array): string {
  let out = "bytes:";
  for (const b of bytes) out += `\\x${b.toString(16).padStart(2, "0")}`;
  return out;
}

function codePoints(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    // A high surrogate followed by a low one is one code point.
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) i++;
    }
    n++;
  }
  return n;
}

/** Length in Unicode code points (what Python's len() counts, and so vLLM's text_offset). */
export function textLength(text: string): number {
  return codePoints(text);
}

/** Synchronous per-token views of one tokenizer's vocabulary. */
export class TokenVocabulary {
  private readonly loneCache = new Map<number, string>();

  private constructor(
    private readonly native: Pick<Tokenizer, "idToToken">,
    private readonly decoder: Pick<Decoder, "decode"> | null,
    private readonly byteLevel: ByteLevelDecoder | null,
    private readonly specialContents: ReadonlySet<string>,
    /** "▁" for SentencePiece/Metaspace decoders (leading spaces to restore), else null. */
    readonly marker: string | null,
    private readonly byteFallback: boolean,
  ) {}

  static create(native: Pick<Tokenizer, "idToToken" | "getDecoder">, json: TokenizerJsonView, byteLevel: ByteLevelDecoder | null): TokenVocabulary {
    const special = new Set<string>();
    for (const added of json.added_tokens ?? []) if (added.special) special.add(added.content);
    return new TokenVocabulary(native, byteLevel === null ? native.getDecoder() : null, byteLevel, special, spaceMarker(json.decoder), hasByteFallback(json.decoder));
  }

  /** Exactly Tokenizer.decode(ids[start, end), skipSpecialTokens), synchronously. */
  decode(ids: readonly number[], start: number, end: number, skipSpecialTokens: boolean): string {
    if (this.byteLevel !== null) return this.byteLevel.decode(ids, start, end, skipSpecialTokens);
    const pieces: string[] = [];
    for (let i = start; i < end; i++) {
      const piece = this.native.idToToken(ids[i] as number);
      if (piece === null || (skipSpecialTokens && this.specialContents.has(piece))) continue;
      pieces.push(piece);
    }
    if (pieces.length === 0) return "";
    return this.decoder === null ? pieces.join(" ") : this.decoder.decode(pieces);
  }

  /** The token's own bytes when they can be told apart from its neighbours' (else null). */
  rawBytes(id: number): Uint8Array | null {
    if (this.byteLevel !== null) return this.byteLevel.bytesOf(id);
    const piece = this.native.idToToken(id);
    if (piece === null) return null;
    const byte = this.byteFallback ? BYTE_PIECE.exec(piece) : null;
    if (byte !== null) return Uint8Array.of(Number.parseInt(byte[1] as string, 16));
    return utf8.encode(this.marker === null ? piece : piece.replaceAll(this.marker, " "));
  }

  /**
   * The token on its own (logprob alternatives): its decoded text with the
   * leading spaces a SentencePiece decoder strips restored, or "bytes:\xNN..."
   * when it is part of a character.
   */
  lone(id: number): string {
    const cached = this.loneCache.get(id);
    if (cached !== undefined) return cached;
    let text = this.decode([id], 0, 1, false);
    const raw = this.rawBytes(id);
    if (text.includes(REPLACEMENT_CHAR) && raw !== null && !isWholeUtf8(raw)) {
      text = bytesToken(raw);
    } else if (this.marker !== null) {
      const piece = this.native.idToToken(id) ?? "";
      let markers = 0;
      while (piece.startsWith(this.marker.repeat(markers + 1))) markers++;
      let spaces = 0;
      while (text[spaces] === " ") spaces++;
      if (markers > spaces) text = " ".repeat(markers - spaces) + text;
    }
    if (this.loneCache.size > 200_000) this.loneCache.clear();
    this.loneCache.set(id, text);
    return text;
  }

  /** UTF-8 bytes of a lone token: its own bytes when known, else those of lone(id). */
  loneBytes(id: number): number[] {
    const raw = this.rawBytes(id);
    return raw !== null ? [...raw] : [...utf8.encode(this.lone(id))];
  }
}

/** One token's share of a sequence's text. */
export interface TokenText {
  text: string;
  /**
   * The UTF-8 bytes this token contributes (they concatenate to the text's
   * bytes). A held token's array is filled in place once its character is complete.
   */
  readonly bytes: number[];
}

/**
 * The text each token of one sequence adds. `context` (e.g. the prompt's last
 * tokens before a completion) is decoded along but gets no strings; an empty
 * context means the sequence starts the text.
 *
 * A token whose text is held back (part of a character) gets "" at once; its
 * entry object is completed in place (its bytes) when a later token completes
 * the character, so callers that send entries only with text see them whole.
 */
export class TokenTextSession {
  private readonly tokens: number[];
  private prefixOffset = 0;
  private readOffset: number;
  /** Entries of tokens whose text is held back, with their ids. */
  private held: { entry: TokenText; id: number }[] = [];

  constructor(
    private readonly vocab: TokenVocabulary,
    context: readonly number[],
    private readonly skipSpecialTokens: boolean,
  ) {
    this.tokens = context.slice(-CONTEXT_TOKENS);
    this.readOffset = this.tokens.length;
  }

  /** One entry per id. With final, text still held back goes to the last id. */
  push(ids: readonly number[], final = false): TokenText[] {
    const out: TokenText[] = [];
    ids.forEach((id, i) => {
      this.tokens.push(id);
      const entry: TokenText = { text: "", bytes: [] };
      out.push(entry);
      this.held.push({ entry, id });
      const end = this.tokens.length;
      const last = final && i === ids.length - 1;
      const prefix = this.vocab.decode(this.tokens, this.prefixOffset, this.readOffset, this.skipSpecialTokens);
      const full = this.vocab.decode(this.tokens, this.prefixOffset, end, this.skipSpecialTokens);
      if (full.length > prefix.length && (last || !full.endsWith(REPLACEMENT_CHAR))) {
        this.complete(full.slice(prefix.length));
        this.prefixOffset = this.readOffset;
        this.readOffset = end;
      } else if (last) {
        this.complete("");
        this.readOffset = end;
      }
    });
    // Keep the window small: tokens before prefixOffset are never decoded again.
    if (this.prefixOffset > 64) {
      const drop = this.prefixOffset;
      this.tokens.splice(0, drop);
      this.prefixOffset -= drop;
      this.readOffset -= drop;
    }
    return out;
  }

  /**
   * The newest token made `text` final: it gets the text. The held tokens
   * before it keep "", and every token of the group gets its own bytes when
   * those add up to the text's; otherwise the newest token gets them all.
   */
  private complete(text: string): void {
    const group = this.held;
    this.held = [];
    const textBytes = [...utf8.encode(text)];
    const newest = group[group.length - 1] as { entry: TokenText; id: number };
    newest.entry.text = text;
    // Filled in place: callers may hold the held tokens' bytes arrays already.
    if (group.length === 1) {
      newest.entry.bytes.push(...textBytes);
      return;
    }
    const parts = group.map((g) => this.vocab.rawBytes(g.id));
    const joined = parts.every((p) => p !== null) ? parts.flatMap((p) => [...(p as Uint8Array)]) : null;
    const fits = joined !== null && joined.length === textBytes.length && joined.every((b, j) => b === textBytes[j]);
    group.forEach((g, j) => {
      if (fits) g.entry.bytes.push(...(parts[j] as Uint8Array));
      else if (g === newest) g.entry.bytes.push(...textBytes);
    });
  }
}

/** Context tokens kept before a sequence (the detokenizer's PROMPT_CONTEXT_TOKENS). */
const CONTEXT_TOKENS = 5;
