// A thin wrapper over the HF `tokenizers` Node binding. encode/decode run on
// libuv's thread pool (the binding is async), so long prompts do not block the
// event loop; decodeBatch lets the detokenizer cross into native code once per
// engine step instead of once per request.

import { readFileSync } from "node:fs";
import { Tokenizer } from "tokenizers";
import { ByteLevelDecoder, type TokenizerJson } from "./byte-level.js";
import { TokenVocabulary, type TokenizerJsonView } from "./token-text.js";

export interface TokenizerOptions {
  /** Prepend this id when encoding with special tokens if the post-processor did not (add_bos_token). */
  bosTokenId?: number | null;
  addBosToken?: boolean | null;
}

export class TextTokenizer {
  /** Vocabulary size including added tokens. */
  readonly vocabSize: number;

  private constructor(
    private readonly inner: Tokenizer,
    private readonly bosToPrepend: number | null,
    /** A synchronous JS decoder equal to decode(), for plain byte-level BPE tokenizers (else null). */
    readonly byteLevel: ByteLevelDecoder | null,
    /** Synchronous per-token text (logprob token strings). */
    readonly vocabulary: TokenVocabulary,
  ) {
    this.vocabSize = inner.getVocabSize(true);
  }

  static fromFile(path: string, options: TokenizerOptions = {}): TextTokenizer {
    let inner: Tokenizer;
    try {
      inner = Tokenizer.fromFile(path);
    } catch (error) {
      throw new Error(`cannot load tokenizer ${path}: ${(error as Error).message}`);
    }
    const bos = options.addBosToken === true && options.bosTokenId != null ? options.bosTokenId : null;
    let json: TokenizerJson & TokenizerJsonView = {};
    let byteLevel: ByteLevelDecoder | null = null;
    try {
      json = JSON.parse(readFileSync(path, "utf8")) as TokenizerJson & TokenizerJsonView;
      byteLevel = ByteLevelDecoder.fromTokenizerJson(json);
    } catch {
      // The native binding read it; anything unexpected here only costs the fast path.
    }
    return new TextTokenizer(inner, bos, byteLevel, TokenVocabulary.create(inner, json, byteLevel));
  }

  /**
   * Text -> ids. With special tokens, tokenizer.json's post-processor applies
   * (e.g. Llama's BOS); chat prompts are encoded without, since the template
   * already wrote them as text.
   */
  async encode(text: string, addSpecialTokens: boolean): Promise<number[]> {
    const encoding = await this.inner.encode(text, null, { addSpecialTokens });
    const ids = encoding.getIds();
    if (addSpecialTokens && this.bosToPrepend !== null && ids[0] !== this.bosToPrepend) ids.unshift(this.bosToPrepend);
    return ids;
  }

  decode(ids: number[], skipSpecialTokens: boolean): Promise<string> {
    return this.inner.decode(ids, skipSpecialTokens);
  }

  decodeBatch(batch: number[][], skipSpecialTokens: boolean): Promise<string[]> {
    return this.inner.decodeBatch(batch, skipSpecialTokens);
  }

  tokenToId(token: string): number | null {
    return this.inner.tokenToId(token);
  }

  idToToken(id: number): string | null {
    return this.inner.idToToken(id);
  }
}
