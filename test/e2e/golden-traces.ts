// Golden traces: prompt ids, parameters, expected ids and finish reason for
// the bundled demo model, stored under test/fixtures/golden-traces/ and
// replayed by golden-traces.test.ts, so a regression shows even where
// transformers is not in the loop. Greedy expectations come from transformers;
// seeded-sampling expectations are Baton's own output at record time.
//
// Record anew (after a deliberate change to the demo model or sampler):
//   npm run build && node dist/test/e2e/golden-traces.js --record

import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { demoModelDir, postJson, repoRoot, startServer, transformersGreedy, type CompletionWithIds } from "./harness.js";

export const tracesPath = join(repoRoot, "test", "fixtures", "golden-traces", "demo.json");

export interface GoldenTrace {
  name: string;
  prompt_ids: number[];
  params: Record<string, unknown>;
  expected_ids: number[];
  finish_reason: string;
  source: "transformers" | "baton";
}

/** Deterministic pseudo-random token ids (a fixed LCG, not Math.random). */
function promptIds(length: number, salt: number): number[] {
  let state = 12345 + salt * 7919;
  return Array.from({ length }, () => {
    state = (state * 1103515245 + 12345) % 2147483648;
    return state % 150000;
  });
}

export async function complete(url: string, promptIdsIn: number[], params: Record<string, unknown>): Promise<{ ids: number[]; finish: string }> {
  const response = await postJson<CompletionWithIds>(`${url}/v1/completions`, {
    model: "baton-demo",
    prompt: promptIdsIn,
    return_token_ids: true,
    ...params,
  });
  if (response.status !== 200) throw new Error(JSON.stringify(response.body));
  const choice = response.body.choices[0]!;
  return { ids: choice.token_ids ?? [], finish: choice.finish_reason };
}

async function record(): Promise<void> {
  const server = await startServer([demoModelDir, "--served-model-name", "baton-demo"]);
  try {
    const traces: GoldenTrace[] = [];
    const greedyPrompts = [1, 7, 40, 130].map((n, i) => promptIds(n, i));
    const expected = transformersGreedy(demoModelDir, greedyPrompts, 16);
    greedyPrompts.forEach((ids, i) => {
      traces.push({
        name: `greedy-${ids.length}-tokens`,
        prompt_ids: ids,
        params: { max_tokens: 16, temperature: 0 },
        expected_ids: expected[i]!,
        finish_reason: expected[i]!.length < 16 ? "stop" : "length",
        source: "transformers",
      });
    });
    // A stop token id taken from the middle of a greedy output ends it there.
    const stopAt = expected[1]![5]!;
    const cut = expected[1]!.indexOf(stopAt);
    traces.push({
      name: "greedy-stop-token-id",
      prompt_ids: greedyPrompts[1]!,
      params: { max_tokens: 16, temperature: 0, stop_token_ids: [stopAt] },
      expected_ids: expected[1]!.slice(0, cut + 1),
      finish_reason: "stop",
      source: "transformers",
    });
    const sampled: [string, Record<string, unknown>][] = [
      ["seeded-top-p-top-k", { max_tokens: 16, temperature: 0.8, top_p: 0.9, top_k: 50, seed: 7 }],
      ["seeded-min-p", { max_tokens: 16, temperature: 1.2, min_p: 0.05, seed: 99 }],
    ];
    for (const [name, params] of sampled) {
      const ids = promptIds(12, name.length);
      const out = await complete(server.url, ids, params);
      traces.push({ name, prompt_ids: ids, params, expected_ids: out.ids, finish_reason: out.finish, source: "baton" });
    }
    const lines = traces.map((t) => `  ${JSON.stringify(t)}`).join(",\n");
    writeFileSync(tracesPath, `{"model": "models/demo (built by scripts/setup.mjs)", "traces": [\n${lines}\n]}\n`);
    console.log(`recorded ${traces.length} traces to ${tracesPath}`);
  } finally {
    await server.stop();
  }
}

if (process.argv.includes("--record")) {
  await record();
}
