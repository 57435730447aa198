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
  /** Tokens the pair template adds (read on the first truncated pair). */
  private pairSpecials: number | undefined;

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

  /**
   * A text pair -> ids, as the tokenizer's pair template builds it (BERT:
   * [CLS] a [SEP] b [SEP]; a byte-level BPE: a then b). maxLength cuts the
   * whole to that many tokens the way HF tokenizers' longest_first
   * truncation does (from the right of the longer text first); null: no cut.
   */
  async encodePair(first: string, second: string, maxLength: number | null): Promise<number[]> {
    const [a, b] = await Promise.all([this.inner.encode(first, null, { addSpecialTokens: false }), this.inner.encode(second, null, { addSpecialTokens: false })]);
    if (maxLength !== null) {
      this.pairSpecials ??= this.inner.postProcess(await this.inner.encode("", null, { addSpecialTokens: false }), await this.inner.encode("", null, { addSpecialTokens: false }), true).getLength();
      const [n1, n2] = longestFirst(a.getLength(), b.getLength(), Math.max(maxLength - this.pairSpecials, 0));
      // The binding's own default direction is left; HF's truncation_side defaults to right.
      if (n1 < a.getLength()) a.truncate(n1, 0, "right");
      if (n2 < b.getLength()) b.truncate(n2, 0, "right");
    }
    return this.inner.postProcess(a, b, true).getIds();
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

/**
 * HF tokenizers' longest_first lengths of a pair of n1 and n2 tokens within
 * `budget`: the shorter text keeps its length when the longer can take the
 * cut alone; otherwise each gets half (the longer one the odd token).
 */
function longestFirst(n1: number, n2: number, budget: number): [number, number] {
  if (n1 + n2 <= budget) return [n1, n2];
  const swap = n1 > n2;
  let short = swap ? n2 : n1;
  let long = short > budget ? short : Math.max(short, budget - short);
  if (short + long > budget) {
    short = Math.floor(budget / 2);
    long = short + (budget % 2);
  }
  return swap ? [long, short] : [short, long];
}
