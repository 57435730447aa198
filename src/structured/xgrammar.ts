// The one place that loads xgrammar (npm @mlc-ai/web-xgrammar: xgrammar's C++
// compiled to WebAssembly), typed as far as Baton uses it.
//
// Its bundle is UMD while its package.json says "type": "module", so in Node
// an import yields no exports: the bundle registers globalThis.xgrammar, and
// its Emscripten loader needs a global `require` and `__filename` while it
// starts. It runs single-threaded; every call is synchronous WebAssembly (the
// async signatures only wait for the module's first initialisation).
//
// A grammar xgrammar cannot handle ends in an Emscripten abort whose only
// explanation goes to console.error ("[FATAL] file:line: message"), bound
// when the module initialises. loadXGrammar() routes console.error through a
// switch first, so captureErrors() can collect those lines for the 400.

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

interface TokenizerInfo {
  getVocabSize(): number;
  dispose(): void;
}

interface Grammar {
  toString(): string;
  dispose(): void;
}

export interface CompiledGrammar {
  dispose(): void;
}

export interface GrammarCompiler {
  compileGrammar(grammar: Grammar): Promise<CompiledGrammar>;
  compileStructuralTag(structuralTag: string): Promise<CompiledGrammar>;
  dispose(): void;
}

export interface GrammarMatcher {
  acceptToken(tokenId: number): boolean;
  /** ceil(vocab / 32) words; bit j of word w allows token 32w + j. */
  getNextTokenBitmask(): Promise<Int32Array>;
  isTerminated(): boolean;
  rollBack(numTokens: number): void;
  dispose(): void;
}

export interface XGrammar {
  TokenizerInfo: {
    createTokenizerInfo(encodedVocab: string[], vocabType: string, prependSpaceInTokenization: boolean, vocabSize: number, stopTokenIds: number[]): Promise<TokenizerInfo>;
  };
  Grammar: {
    fromEBNF(ebnf: string, rootRule?: string): Promise<Grammar>;
    fromJSONSchema(
      schema: string,
      anyWhitespace?: boolean,
      indent?: number,
      separators?: [string, string],
      strictMode?: boolean,
      maxWhitespaceCnt?: number,
    ): Promise<Grammar>;
  };
  GrammarCompiler: {
    createGrammarCompiler(tokenizerInfo: TokenizerInfo, cacheEnabled?: boolean): Promise<GrammarCompiler>;
  };
  GrammarMatcher: {
    createGrammarMatcher(compiled: CompiledGrammar, overrideStopTokens?: number[], terminateWithoutStopToken?: boolean): Promise<GrammarMatcher>;
  };
}

const PACKAGE = "@mlc-ai/web-xgrammar";

/** Lines xgrammar wrote to console.error while capturing; null when not capturing. */
let captured: string[] | null = null;
let loading: Promise<XGrammar> | null = null;

/** Loads xgrammar once per thread. */
export function loadXGrammar(): Promise<XGrammar> {
  loading ??= (async () => {
    const require = createRequire(import.meta.url);
    let path: string;
    try {
      path = require.resolve(PACKAGE);
    } catch {
      throw new Error(`structured outputs need the npm package ${PACKAGE} (npm install)`);
    }
    const original = console.error.bind(console);
    console.error = (...args: unknown[]) => {
      if (captured !== null) captured.push(args.map(String).join(" "));
      else original(...args);
    };
    const globals = globalThis as { require?: unknown; __filename?: unknown; xgrammar?: XGrammar };
    globals.require ??= require;
    globals.__filename ??= path;
    await import(pathToFileURL(path).href);
    const xg = globals.xgrammar;
    if (xg === undefined) throw new Error(`${PACKAGE} did not register globalThis.xgrammar`);
    return xg;
  })();
  return loading;
}

/**
 * Runs `work` collecting what xgrammar prints; a failure becomes an Error
 * whose message is xgrammar's own explanation (its [FATAL] lines without the
 * source location), or the failure's message when it printed none.
 */
export async function captureErrors<T>(work: () => Promise<T>): Promise<T> {
  const lines: string[] = [];
  captured = lines;
  try {
    return await work();
  } catch (error) {
    const explained = lines
      .filter((l) => l.includes("[FATAL]") || /error/i.test(l))
      .map((l) => l.replace(/^\[FATAL\]\s*\S+:\d+:\s*/, "").trim())
      .filter((l) => l !== "");
    throw new Error(explained.length > 0 ? explained.join("; ") : (error as Error).message);
  } finally {
    captured = null;
  }
}
