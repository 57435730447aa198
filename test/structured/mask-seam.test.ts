// The mask is right at the seam: masks made by the grammar thread (what the
// engine core sends in a StepMask), applied by the worker's own Python code,
// leave finite exactly the tokens xgrammar's matcher accepts, on random
// prefixes of several grammars. Prefixes are random walks through what the
// masks allow, so they reach deep into each grammar.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import fc from "fast-check";
import { GrammarClient } from "../../src/structured/grammar-client.js";
import { GrammarService } from "../../src/structured/grammar-service.js";
import type { GrammarSpec } from "../../src/structured/grammar-spec.js";
import { readTokenizerVocab } from "../../src/structured/tokenizer-vocab.js";
import { captureErrors, loadXGrammar, type CompiledGrammar, type GrammarCompiler, type XGrammar } from "../../src/structured/xgrammar.js";
import { demoModelDir, python, repoRoot } from "../e2e/harness.js";

const VOCAB = 151936;
const STOP = [151645, 151643];
const tokenizerPath = join(demoModelDir, "tokenizer.json");

const GRAMMARS: GrammarSpec[] = [
  {
    kind: "json_schema",
    source: JSON.stringify({
      type: "object",
      properties: { name: { type: "string", maxLength: 8 }, n: { type: "integer", minimum: -5, maximum: 500 }, tags: { type: "array", items: { enum: ["a", "bc"] }, maxItems: 3 } },
      required: ["name", "n"],
      additionalProperties: false,
    }),
  },
  { kind: "regex", source: "[a-z]{2,5}(-[0-9]+)?@(ex|ample)\\.org" },
  { kind: "choice", source: JSON.stringify(["yes", "no", "nothing", "0.5"]) },
  { kind: "ebnf", source: 'root ::= "(" expr ")"\nexpr ::= num | num "+" expr\nnum ::= [0-9]+' },
  { kind: "json_object", source: "" },
];

function allowedIds(bits: Int32Array): number[] {
  const ids: number[] = [];
  for (let t = 0; t < VOCAB; t++) if ((((bits[t >> 5] as number) >>> (t & 31)) & 1) === 1) ids.push(t);
  return ids;
}

interface Case {
  grammar: number;
  prefix: number[];
  bits: Int32Array;
  ids: number[];
}

describe("grammar masks at the seam", () => {
  let service: GrammarService;
  let client: GrammarClient;
  let xg: XGrammar;
  let compiler: GrammarCompiler;
  const local = new Map<number, CompiledGrammar>();

  before(async () => {
    service = GrammarService.start({ tokenizerPath, vocabSize: VOCAB, stopTokenIds: STOP, cacheSize: 16 });
    client = service.client();
    xg = await loadXGrammar();
    const vocab = readTokenizerVocab(tokenizerPath);
    const info = await xg.TokenizerInfo.createTokenizerInfo(vocab.encoded, vocab.vocabType, vocab.prependSpace, VOCAB, STOP);
    compiler = await xg.GrammarCompiler.createGrammarCompiler(info, false);
  });

  after(async () => {
    client.close();
    await service.close();
  });

  async function localMatcher(g: number) {
    let compiled = local.get(g);
    if (compiled === undefined) {
      const spec = GRAMMARS[g] as GrammarSpec;
      compiled = await captureErrors(async () => {
        if (spec.kind === "regex") return compiler.compileStructuralTag(JSON.stringify({ type: "structural_tag", format: { type: "regex", pattern: spec.source } }));
        if (spec.kind === "ebnf") return compiler.compileGrammar(await xg.Grammar.fromEBNF(spec.source));
        if (spec.kind === "choice") {
          const choices = JSON.parse(spec.source) as string[];
          return compiler.compileGrammar(await xg.Grammar.fromEBNF(`root ::= ${choices.map((c) => JSON.stringify(c)).join(" | ")}`));
        }
        const schema = spec.kind === "json_object" ? '{"type": "object"}' : spec.source;
        return compiler.compileGrammar(await xg.Grammar.fromJSONSchema(schema, false, -1, undefined, spec.kind === "json_schema"));
      });
      local.set(g, compiled);
    }
    return xg.GrammarMatcher.createGrammarMatcher(compiled, STOP);
  }

  test("the worker keeps finite exactly what xgrammar's matcher accepts", async () => {
    const cases: Case[] = [];
    await fc.assert(
      fc.asyncProperty(fc.nat(GRAMMARS.length - 1), fc.nat(24), fc.array(fc.nat(), { minLength: 30, maxLength: 30 }), async (g, depth, picks) => {
        // A random walk through the grammar, asking the grammar thread for masks as the engine does.
        const matcher = client.newMatcher();
        const prefix: number[] = [];
        let fresh: number[] = [];
        let bits: Int32Array = new Int32Array(0);
        for (let step = 0; ; step++) {
          const reply = await client.masks([{ matcher, spec: step === 0 ? (GRAMMARS[g] as GrammarSpec) : null, tokens: fresh, allow: [] }]);
          assert.equal(reply.errors[0], null);
          bits = reply.bits;
          const allowed = allowedIds(bits).filter((t) => !STOP.includes(t));
          if (step === depth || allowed.length === 0) break;
          const next = allowed[(picks[step % picks.length] as number) % allowed.length] as number;
          prefix.push(next);
          fresh = [next];
        }
        client.release([matcher]);
        // The ids to check: every allowed one when few, a sample otherwise, plus random ids and the stop tokens.
        const allowed = allowedIds(bits);
        const ids = new Set<number>([...STOP, ...(allowed.length <= 3000 ? allowed : allowed.filter((_, i) => i % 50 === 0))]);
        for (const p of picks) ids.add((p * 7919) % VOCAB);
        cases.push({ grammar: g, prefix, bits, ids: [...ids] });
      }),
      { numRuns: 40 },
    );

    const worker = spawnSync(python, [join(repoRoot, "test", "structured", "worker_mask.py")], {
      input: JSON.stringify(cases.map((c) => ({ vocab: VOCAB, bits: [...c.bits], ids: c.ids }))),
      encoding: "utf8",
      env: { ...process.env, PYTHONPATH: join(repoRoot, "python") },
      maxBuffer: 64 * 1024 * 1024,
    });
    assert.equal(worker.status, 0, worker.stderr);
    const kept = JSON.parse(worker.stdout) as boolean[][];

    for (const [i, c] of cases.entries()) {
      const matcher = await localMatcher(c.grammar);
      for (const t of c.prefix) assert.ok(matcher.acceptToken(t), `grammar ${c.grammar}: the walk's token ${t} is accepted`);
      c.ids.forEach((t, j) => {
        const accepts = matcher.acceptToken(t);
        if (accepts) matcher.rollBack(1);
        assert.equal(kept[i]?.[j], accepts, `grammar ${c.grammar}, prefix [${c.prefix}], token ${t}: worker kept ${kept[i]?.[j]}, matcher accepts ${accepts}`);
      });
      matcher.dispose();
    }
  });
});
