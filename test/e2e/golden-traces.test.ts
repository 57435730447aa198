// Replays the stored golden traces against the demo model, all at once so
// they share steps the way real traffic does.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { complete, tracesPath, type GoldenTrace } from "./golden-traces.js";
import { demoModelDir, startServer, type RunningServer } from "./harness.js";

const { traces } = JSON.parse(readFileSync(tracesPath, "utf8")) as { traces: GoldenTrace[] };
let server: RunningServer | null = null;

before(async () => {
  server = await startServer([demoModelDir, "--served-model-name", "baton-demo", "--max-num-batched-tokens", "32"]);
});

after(async () => {
  await server?.stop();
});

test("golden traces replay exactly, batched together", async () => {
  assert.ok(traces.length >= 6);
  const results = await Promise.all(traces.map((t) => complete(server!.url, t.prompt_ids, t.params)));
  traces.forEach((trace, i) => {
    assert.deepEqual(results[i]!.ids, trace.expected_ids, `${trace.name}: token ids`);
    assert.equal(results[i]!.finish, trace.finish_reason, `${trace.name}: finish reason`);
  });
});
