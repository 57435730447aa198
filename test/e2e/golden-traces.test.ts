// Replays the stored golden traces against the demo model, all at once so
// they share steps the way real traffic does.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import { complete, tracesPath, type GoldenTrace } from "./golden-traces.js";
import { demoModelDir, startServer, type RunningServer } from "./harness.js";

const { traces } = JSON.parse(readFileSync(tracesPath, "utf8")) as { traces: GoldenTrace[] };

// The engine core in its own thread (default) and on the main thread give the same tokens.
for (const flags of [[], ["--no-engine-thread"]]) {
  describe(`golden traces ${flags.join(" ") || "(engine thread)"}`, () => {
    let server: RunningServer | null = null;

    before(async () => {
      server = await startServer([demoModelDir, "--served-model-name", "baton-demo", "--max-num-batched-tokens", "32", ...flags]);
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
  });
}
