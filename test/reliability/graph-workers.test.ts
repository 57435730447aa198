// Restarts hold per worker: the demo text-to-speech graph on two workers
// (examples/demo-tts-two-workers.yaml: the LLM on rank 0, the codec on rank 1).
// Killing one worker fails the speech requests in flight cleanly (their
// tensors on the other worker are released), leaves the other worker
// running (same process), restarts the dead one, and then the same request
// gives the same bytes as before.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { repoRoot, startServer, type RunningServer } from "../e2e/harness.js";
import { health, metric, waitFor, waitForHealth, workerPids } from "./helpers.js";

const modelDir = join(repoRoot, "models", "demo-tts");
const deployment = join(repoRoot, "examples", "demo-tts-two-workers.yaml");
const skip = !existsSync(join(modelDir, "config.json")) && "no demo-tts model (npm run setup builds it)";
const REQUEST = { input: "Hello there, how are you today?", voice: "nova", seed: 7, response_format: "pcm", max_tokens: 400 };

interface Speech {
  status: number;
  bytes: Buffer;
  /** "end": the response completed; "cut": the connection ended before its last chunk. */
  how: "end" | "cut";
}

function speech(url: string, onBytes: (n: number) => void = () => {}): Promise<Speech> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/v1/audio/speech`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      const chunks: Buffer[] = [];
      let n = 0;
      let settled = false;
      const done = (how: Speech["how"]): void => {
        if (settled) return;
        settled = true;
        resolve({ status: res.statusCode ?? 0, bytes: Buffer.concat(chunks), how });
      };
      res.on("data", (c: Buffer) => {
        chunks.push(c);
        onBytes((n += c.length));
      });
      res.on("end", () => done(res.complete ? "end" : "cut"));
      res.on("aborted", () => done("cut"));
      res.on("error", () => done("cut"));
      res.on("close", () => done(res.complete ? "end" : "cut"));
    });
    req.on("error", reject);
    req.end(JSON.stringify(REQUEST));
  });
}

/** Pid of the worker started with --rank r. */
function rankPid(server: RunningServer, rank: number): number {
  const pid = workerPids(server).find((p) => {
    const argv = readFileSync(`/proc/${p}/cmdline`, "utf8").split("\0");
    return argv[argv.indexOf("--rank") + 1] === String(rank);
  });
  if (pid === undefined) throw new Error(`no worker of rank ${rank}`);
  return pid;
}

describe("a graph of models on two workers", { skip }, () => {
  let server: RunningServer;
  before(async () => {
    server = await startServer([modelDir, "--deployment", deployment], 120_000, { ...process.env, OMP_NUM_THREADS: "1" });
  });
  after(async () => {
    await server?.stop();
  });

  for (const dying of [1, 0]) {
    test(`rank ${dying} killed mid-request: the request fails cleanly, rank ${1 - dying} goes on, rank ${dying} comes back with the same bytes`, async () => {
      const reference = await speech(server.url);
      assert.equal(reference.status, 200);
      assert.equal(reference.how, "end");
      const survivor = rankPid(server, 1 - dying);
      const victim = rankPid(server, dying);
      let started = false;
      const inFlight = speech(server.url, (n) => {
        if (!started && n > 0) {
          started = true;
          process.kill(victim, "SIGKILL");
        }
      });
      const cut = await inFlight;
      assert.equal(cut.status, 200);
      assert.equal(cut.how, "cut", "raw audio has no room for an error: the response ends before its last chunk");
      assert.ok(cut.bytes.length < reference.bytes.length);
      const down = await health(server.url);
      if (down.status === 503) assert.match(down.body.message ?? "", new RegExp(`model worker of rank ${dying} died: model worker was killed by SIGKILL`));
      // Refused with a 503 while the rank is down.
      await waitForHealth(server.url, 200, 60_000);
      assert.equal(rankPid(server, 1 - dying), survivor, `rank ${1 - dying} was not restarted`);
      assert.notEqual(rankPid(server, dying), victim);
      const again = await speech(server.url);
      assert.equal(again.how, "end");
      assert.ok(again.bytes.equals(reference.bytes), "the same bytes after the restart");
      await waitFor("no tensor held", async () => ((await metric(server.url, "baton:graph_tensors_held")) === 0 ? true : null), 5_000);
    });
  }
});
