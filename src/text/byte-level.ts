// A pure-JS decoder for byte-level BPE tokenizers (GPT-2 style: Qwen, Llama 3,
// Mistral's Tekken...), so the detokenizer does not cross into native code
// (and libuv's thread pool) every engine step.
//
// It mirrors the `tokenizers` crate exactly for tokenizer.json files whose
// model is BPE and whose decoder is plain ByteLevel:
// - an id maps to its added-token content, else its vocabulary string; ids
//   with neither are dropped, as are special tokens when skipping them;
// - ByteLevel's decode_chain maps every character of a token through the
//   byte<->unicode table; a token with a character outside the table
//   contributes its own UTF-8 bytes instead;
// - the concatenated bytes become text with lossy UTF-8 decoding (one U+FFFD
//   per maximal invalid subpart, WHATWG = Rust's from_utf8_lossy).
// Anything else (Metaspace, byte-fallback, decoder sequences) returns null
// from fromTokenizerJson and the caller keeps the native path.

import { readFileSync } from "node:fs";

/** GPT-2's bytes_to_unicode, inverted: code point -> byte. */
function unicodeToByte(): Map<number, number> {
  const printable: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  const map = new Map<number, number>();
  for (const b of printable) map.set(b, b);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (map.has(b)) continue;
    map.set(256 + n, b);
    n++;
  }
  return map;
}

const fatalUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const lossyUtf8 = new TextDecoder("utf-8", { ignoreBOM: true });

export interface TokenizerJson {
  model?: { type?: string; vocab?: Record<string, number> };
  decoder?: { type?: string } | null;
  added_tokens?: { id: number; content: string; special: boolean }[];
}

export class ByteLevelDecoder {
  private constructor(
    /** Bytes of each id, concatenated; id i is bytes[offsets[i], offsets[i+1]). */
    private readonly bytes: Uint8Array,
    private readonly offsets: Uint32Array,
    /** The id's text when its bytes are valid UTF-8 on their own, else null (a partial character). */
    private readonly texts: (string | null)[],
    /** 1: a special token (dropped when skipping special tokens); 2: no token at all (always dropped). */
    private readonly flags: Uint8Array,
  ) {}

  /** Reads tokenizer.json; null when it is not a plain byte-level BPE tokenizer. */
  static fromFile(path: string): ByteLevelDecoder | null {
    return ByteLevelDecoder.fromTokenizerJson(JSON.parse(readFileSync(path, "utf8")) as TokenizerJson);
  }

  static fromTokenizerJson(json: TokenizerJson): ByteLevelDecoder | null {
    if (json.model?.type !== "BPE" || json.model.vocab === undefined) return null;
    if (json.decoder?.type !== "ByteLevel") return null;
    const idToToken: string[] = [];
    for (const [token, id] of Object.entries(json.model.vocab)) idToToken[id] = token;
    const special = new Set<string>();
    for (const added of json.added_tokens ?? []) {
      idToToken[added.id] = added.content;
      if (added.special) special.add(added.content);
    }
    const size = idToToken.length;
    const table = unicodeToByte();
    const encoder = new TextEncoder();
    const chunks: Uint8Array[] = [];
    const offsets = new Uint32Array(size + 1);
    const texts: (string | null)[] = new Array<string | null>(size).fill(null);
    const flags = new Uint8Array(size);
    let total = 0;
    for (let id = 0; id < size; id++) {
      const token = idToToken[id];
      let bytes: Uint8Array;
      if (token === undefined) {
        flags[id] = 2;
        bytes = new Uint8Array(0);
      } else {
        // The crate looks special tokens up by content, so a vocabulary entry equal to one is skipped too.
        if (special.has(token)) flags[id] = 1;
        const mapped: number[] = [];
        let all = true;
        for (const ch of token) {
          const b = table.get(ch.codePointAt(0) as number);
          if (b === undefined) {
            all = false;
            break;
          }
          mapped.push(b);
        }
        bytes = all ? Uint8Array.from(mapped) : encoder.encode(token);
      }
      chunks.push(bytes);
      offsets[id] = total;
      total += bytes.length;
      try {
        texts[id] = fatalUtf8.decode(bytes);
      } catch {
        texts[id] = null;
      }
    }
    offsets[size] = total;
    const all = new Uint8Array(total);
    for (let id = 0; id < size; id++) all.set(chunks[id] as Uint8Array, offsets[id] as number);
    return new ByteLevelDecoder(all, offsets, texts, flags);
  }

  /** The id's bytes (empty for an id with no token). */
  bytesOf(id: number): Uint8Array {
    if (!(id >= 0 && id < this.flags.length)) return new Uint8Array(0);
    return this.bytes.slice(this.offsets[id] as number, this.offsets[id + 1] as number);
  }

  /** True when the id is dropped from decoded text. */
  private dropped(id: number, skipSpecialTokens: boolean): boolean {
    if (!(id >= 0 && id < this.flags.length)) return true;
    const flag = this.flags[id] as number;
    return flag === 2 || (flag === 1 && skipSpecialTokens);
  }

  /** True when every kept id of ids[start, end) is a whole character sequence on its own. */
  isWhole(ids: readonly number[], start: number, end: number, skipSpecialTokens: boolean): boolean {
    for (let i = start; i < end; i++) {
      const id = ids[i] as number;
      if (!this.dropped(id, skipSpecialTokens) && this.texts[id] === null) return false;
    }
    return true;
  }

  /**
   * The text of ids[start, end) concatenated when every kept id is a whole
   * character sequence on its own (the common case: no bytes to join), else null.
   */
  joinWhole(ids: readonly number[], start: number, end: number, skipSpecialTokens: boolean): string | null {
    let text = "";
    for (let i = start; i < end; i++) {
      const id = ids[i] as number;
      if (this.dropped(id, skipSpecialTokens)) continue;
      const t = this.texts[id];
      if (t === null || t === undefined) return null;
      text += t;
    }
    return text;
  }

  /** Exactly what Tokenizer.decode(ids[start, end), skipSpecialTokens) returns. */
  decode(ids: readonly number[], start = 0, end = ids.length, skipSpecialTokens = true): string {
    const whole = this.joinWhole(ids, start, end, skipSpecialTokens);
    if (whole !== null) return whole;
    let length = 0;
    for (let i = start; i < end; i++) {
      const id = ids[i] as number;
      if (!this.dropped(id, skipSpecialTokens)) length += (this.offsets[id + 1] as number) - (this.offsets[id] as number);
    }
    const out = new Uint8Array(length);
    let at = 0;
    for (let i = start; i < end; i++) {
      const id = ids[i] as number;
      if (this.dropped(id, skipSpecialTokens)) continue;
      const from = this.offsets[id] as number;
      const to = this.offsets[id + 1] as number;
      out.set(this.bytes.subarray(from, to), at);
      at += to - from;
    }
    return lossyUtf8.decode(out);
  }
}
