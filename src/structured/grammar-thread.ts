// The grammar thread: xgrammar's only home (a worker_threads Worker started
// by GrammarService). It compiles grammars and keeps one matcher per
// constrained request, and answers each step's mask request with the packed
// token bitmasks of its constrained rows.
//
// Why a thread of its own: compiling a grammar against a 150k-token
// vocabulary takes tens to hundreds of milliseconds of synchronous
// WebAssembly; here it never blocks the engine's step loop or the HTTP server.
// Matchers must live where their compiled grammar lives (xgrammar objects
// cannot move between WebAssembly instances), so masks are computed here too;
// pending mask requests go before pending compiles.
//
// Compiled grammars are cached by spec (least recently used dropped beyond
// cacheSize), and so are failures, so a bad schema is compiled once.
// xgrammar's own compile cache is off: a compile that fails aborts inside
// xgrammar and would leave its cache entry locked for the next attempt.

import { parentPort, workerData, type MessagePort } from "node:worker_threads";
import { choiceGrammar, grammarKey, type GrammarSpec } from "./grammar-spec.js";
import type { FromGrammarThread, GrammarThreadInit, MaskRow, ToGrammarThread } from "./grammar-messages.js";
import { rewriteRegexForXGrammar } from "./regex-rewrite.js";
import { readTokenizerVocab } from "./tokenizer-vocab.js";
import { captureErrors, loadXGrammar, type CompiledGrammar, type GrammarCompiler, type GrammarMatcher, type XGrammar } from "./xgrammar.js";

const init = workerData as GrammarThreadInit;
const words = Math.ceil(init.vocabSize / 32);

interface Engine {
  xg: XGrammar;
  compiler: GrammarCompiler;
}

const engine: Promise<Engine> = (async () => {
  const xg = await loadXGrammar();
  const vocab = readTokenizerVocab(init.tokenizerPath);
  const encoded = vocab.encoded.slice(0, init.vocabSize);
  const info = await xg.TokenizerInfo.createTokenizerInfo(encoded, vocab.vocabType, vocab.prependSpace, init.vocabSize, init.stopTokenIds);
  return { xg, compiler: await xg.GrammarCompiler.createGrammarCompiler(info, false) };
})();
// A failed start is reported to every request (each one awaits `engine`).
engine.catch(() => {});

const compiled = new Map<string, CompiledGrammar>();
const failed = new Map<string, string>();
const matchers = new Map<number, GrammarMatcher>();

async function compileSpec({ xg, compiler }: Engine, spec: GrammarSpec): Promise<CompiledGrammar> {
  const grammarOf = async (): Promise<CompiledGrammar> => {
    switch (spec.kind) {
      case "json_schema":
      case "json_object": {
        // One line, ", " and ": " separators: no free whitespace a model could pad with forever.
        const schema = spec.kind === "json_object" ? '{"type": "object"}' : spec.source;
        const grammar = await xg.Grammar.fromJSONSchema(schema, false, -1, undefined, spec.kind === "json_schema");
        try {
          return await compiler.compileGrammar(grammar);
        } finally {
          grammar.dispose();
        }
      }
      case "ebnf":
      case "choice": {
        const text = spec.kind === "ebnf" ? spec.source : choiceGrammar(JSON.parse(spec.source) as string[]);
        const grammar = await xg.Grammar.fromEBNF(text);
        try {
          return await compiler.compileGrammar(grammar);
        } finally {
          grammar.dispose();
        }
      }
      case "regex": {
        const pattern = rewriteRegexForXGrammar(spec.source);
        return compiler.compileStructuralTag(JSON.stringify({ type: "structural_tag", format: { type: "regex", pattern } }));
      }
      case "structural_tag":
        return compiler.compileStructuralTag(spec.source);
    }
  };
  return captureErrors(grammarOf);
}

/** The compiled grammar of `spec`, compiling it if needed; throws the reason it cannot be. */
async function compiledGrammar(spec: GrammarSpec): Promise<CompiledGrammar> {
  const key = grammarKey(spec);
  const known = compiled.get(key);
  if (known !== undefined) {
    compiled.delete(key);
    compiled.set(key, known);
    return known;
  }
  const reason = failed.get(key);
  if (reason !== undefined) throw new Error(reason);
  let grammar: CompiledGrammar;
  try {
    grammar = await compileSpec(await engine, spec);
  } catch (error) {
    const message = (error as Error).message;
    if (failed.size >= 4 * init.cacheSize) failed.delete(failed.keys().next().value as string);
    failed.set(key, message);
    throw error;
  }
  compiled.set(key, grammar);
  // Matchers keep their own reference to the compiled grammar inside xgrammar.
  while (compiled.size > init.cacheSize) {
    const oldest = compiled.keys().next().value as string;
    compiled.get(oldest)?.dispose();
    compiled.delete(oldest);
  }
  return grammar;
}

async function maskRow(row: MaskRow, bits: Int32Array, at: number): Promise<string | null> {
  const { xg } = await engine;
  let matcher = matchers.get(row.matcher);
  if (matcher === undefined) {
    if (row.spec === null) return "the request's grammar matcher is gone";
    matcher = await xg.GrammarMatcher.createGrammarMatcher(await compiledGrammar(row.spec), init.stopTokenIds);
    matchers.set(row.matcher, matcher);
  }
  for (const token of row.tokens) {
    if (!matcher.acceptToken(token)) return `the grammar rejected generated token ${token}`;
  }
  if (matcher.isTerminated()) {
    // The request ends with this stop token; its next row (if any) is dropped, so any mask does.
    bits.fill(-1, at, at + words);
  } else {
    bits.set(await matcher.getNextTokenBitmask(), at);
  }
  for (const token of row.allow) bits[at + (token >> 5)] = (bits[at + (token >> 5)] as number) | (1 << (token & 31));
  return null;
}

// ------------------------------------------------------------ work queue

type Reply = (message: FromGrammarThread, transfer?: ArrayBuffer[]) => void;

/** Mask requests and releases, in arrival order; they go before compiles. */
const stepQueue: (() => Promise<void>)[] = [];
const compileQueue: (() => Promise<void>)[] = [];
let running = false;

async function pump(): Promise<void> {
  if (running) return;
  running = true;
  try {
    for (;;) {
      const task = stepQueue.shift() ?? compileQueue.shift();
      if (task === undefined) break;
      await task();
    }
  } finally {
    running = false;
  }
}

async function runMasks(request: Extract<ToGrammarThread, { kind: "masks" }>, reply: Reply): Promise<void> {
  const t0 = performance.now();
  const bits = new Int32Array(request.rows.length * words);
  const errors: (string | null)[] = [];
  for (const [i, row] of request.rows.entries()) {
    let error: string | null;
    try {
      error = await maskRow(row, bits, i * words);
    } catch (e) {
      error = (e as Error).message;
    }
    if (error !== null) bits.fill(-1, i * words, (i + 1) * words);
    errors.push(error);
  }
  reply({ kind: "masks", id: request.id, bits, errors, ms: performance.now() - t0 }, [bits.buffer as ArrayBuffer]);
}

async function runCompile(request: Extract<ToGrammarThread, { kind: "compile" }>, reply: Reply): Promise<void> {
  const t0 = performance.now();
  try {
    await engine;
  } catch (e) {
    reply({ kind: "compiled", id: request.id, error: (e as Error).message, unavailable: true, ms: performance.now() - t0 });
    return;
  }
  let error: string | null = null;
  try {
    await compiledGrammar(request.spec);
  } catch (e) {
    error = (e as Error).message;
  }
  reply({ kind: "compiled", id: request.id, error, unavailable: false, ms: performance.now() - t0 });
}

function release(ids: number[]): void {
  for (const id of ids) {
    matchers.get(id)?.dispose();
    matchers.delete(id);
  }
}

function listen(port: MessagePort | NonNullable<typeof parentPort>): void {
  const reply: Reply = (message, transfer = []) => port.postMessage(message, transfer);
  port.on("message", (message: ToGrammarThread) => {
    switch (message.kind) {
      case "compile":
        compileQueue.push(() => runCompile(message, reply));
        break;
      case "masks":
        stepQueue.push(() => runMasks(message, reply));
        break;
      case "release":
        stepQueue.push(async () => release(message.matchers));
        break;
      case "connect":
        listen(message.port);
        return;
    }
    void pump();
  });
}

if (parentPort === null) throw new Error("structured/grammar-thread.js runs only as a worker thread");
listen(parentPort);
