// `baton serve` flags (vLLM names, defaults, value checks) and the CLI's exit
// codes for usage errors and a missing model directory. Serving itself is
// covered by the end-to-end tests with the real worker.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join, resolve } from "node:path";
import { describe, test } from "node:test";
import { parseHumanInt, parseServeArgs, UsageError } from "../../src/cli/args.js";
import { workerArgs } from "../../src/worker/worker-process.js";
import { repoRoot } from "../text/helpers.js";

const cli = join(repoRoot, "bin", "baton.mjs");

function run(args: string[]) {
  const result = spawnSync(process.execPath, [cli, ...args], { cwd: repoRoot, encoding: "utf8", timeout: 60_000 });
  return { code: result.status, stdout: result.stdout, stderr: result.stderr };
}

describe("parseServeArgs", () => {
  test("media flags, as vLLM names them", () => {
    const { options } = parseServeArgs(
      ["--allowed-media-domains", "Example.com cdn.example.org", "--allowed-media-domains=img.test", "--allowed-local-media-path", "/data/images", "--limit-mm-per-prompt", '{"image": 2, "audio": 1}', "--max-image-bytes", "1M"],
      {},
    );
    assert.deepEqual(options.media, {
      allowedDomains: ["example.com", "cdn.example.org", "img.test"], allowedLocalPath: "/data/images", maxImagesPerPrompt: 2, maxImageBytes: 1024 * 1024, maxAudiosPerPrompt: 1,
    });
    assert.throws(() => parseServeArgs(["--limit-mm-per-prompt", "2"], {}), /expected a JSON object/);
    assert.throws(() => parseServeArgs(["--limit-mm-per-prompt", '{"video": 1}'], {}), /modality 'video' is not served/);
    assert.throws(() => parseServeArgs(["--limit-mm-per-prompt", '{"image": -1}'], {}), /non-negative integer/);
  });

  test("the Responses store's size and TTL", () => {
    const { options } = parseServeArgs(["--responses-store-max-bytes", "64M", "--responses-store-ttl", "90.5"], {});
    assert.deepEqual(options.responsesStore, { maxBytes: 64 * 1024 * 1024, ttlMs: 90_500 });
    assert.equal(parseServeArgs(["--responses-store-max-bytes", "0"], {}).options.responsesStore.maxBytes, 0);
    assert.throws(() => parseServeArgs(["--responses-store-ttl", "0"], {}), /--responses-store-ttl: must be at least 1/);
    assert.throws(() => parseServeArgs(["--responses-store-max-bytes", "lots"], {}), /--responses-store-max-bytes: expected an integer/);
  });

  test("LoRA flags, as vLLM takes them: several adapters after one --lora-modules, the JSON form, the env switch", () => {
    const { options } = parseServeArgs(["--enable-lora", "--lora-modules", "sql=/l/sql", "chat=/l/chat", "/models/m", "--lora-modules", '{"name": "x", "path": "/l/x"}', "--max-loras", "4", "--max_lora_rank", "64"]);
    assert.equal(options.modelDir, "/models/m");
    assert.deepEqual(options.lora, {
      modules: [{ name: "sql", path: "/l/sql" }, { name: "chat", path: "/l/chat" }, { name: "x", path: "/l/x" }],
      maxLoras: 4,
      maxLoraRank: 64,
      runtimeUpdates: false,
    });
    assert.equal(parseServeArgs(["--enable-lora"], { VLLM_ALLOW_RUNTIME_LORA_UPDATING: "True" }).options.lora?.runtimeUpdates, true);
    assert.equal(parseServeArgs([]).options.lora, null);
    assert.throws(() => parseServeArgs(["--max-loras", "2"]), /--max-loras needs --enable-lora/);
    assert.throws(() => parseServeArgs(["--enable-lora", "--lora-modules", "sql"]), /expected name=path/);
    assert.throws(() => parseServeArgs(["--enable-lora", "--lora-modules", "a=/x", "a=/y"]), /names adapter a twice/);
    const args = workerArgs({ modelDir: "/m", blockSize: 16, dtype: "auto", device: "auto", seed: 0, lora: { maxLoras: 4, maxLoraRank: 64 } }, "in", "out");
    assert.deepEqual(args.slice(args.indexOf("--max-loras"), args.indexOf("--max-loras") + 4), ["--max-loras", "4", "--max-lora-rank", "64"]);
  });

  test("--runner reaches the worker's command line (auto is the worker's default)", () => {
    const { options } = parseServeArgs(["/m", "--runner", "pooling"], {});
    assert.equal(options.runner, "pooling");
    const args = workerArgs({ modelDir: "/m", blockSize: 16, dtype: "auto", device: "auto", seed: 0, runner: options.runner }, "a", "b");
    assert.deepEqual(args.slice(args.indexOf("--runner"), args.indexOf("--runner") + 2), ["--runner", "pooling"]);
    assert.ok(!workerArgs({ modelDir: "/m", blockSize: 16, dtype: "auto", device: "auto", seed: 0, runner: "auto" }, "a", "b").includes("--runner"));
    assert.throws(() => parseServeArgs(["--runner", "embed"], {}), /--runner/);
  });

  test("GPU flags reach the worker's command line; the worker checks the backend's name", () => {
    const { options } = parseServeArgs(["--attention-backend", "flex", "--enforce-eager", "--max-num-seqs", "64"], {});
    assert.equal(options.attentionBackend, "flex");
    assert.equal(options.enforceEager, true);
    const args = workerArgs(
      { modelDir: "/m", blockSize: 16, dtype: "auto", device: "auto", seed: 0, attentionBackend: options.attentionBackend, enforceEager: options.enforceEager, maxNumSeqs: options.maxNumSeqs },
      "ipc://in",
      "ipc://out",
    );
    assert.deepEqual(args.slice(args.indexOf("--attention-backend"), args.indexOf("--attention-backend") + 5), ["--attention-backend", "flex", "--enforce-eager", "--max-num-seqs", "64"]);
    assert.ok(!workerArgs({ modelDir: "/m", blockSize: 16, dtype: "auto", device: "auto", seed: 0 }, "a", "b").includes("--enforce-eager"));
  });

  test("defaults", () => {
    const { help, options } = parseServeArgs([], {});
    assert.equal(help, false);
    assert.deepEqual(options, {
      modelDir: null,
      media: { allowedDomains: [], allowedLocalPath: null, maxImagesPerPrompt: null, maxImageBytes: 20 * 1024 * 1024, maxAudiosPerPrompt: null },
      responsesStore: { maxBytes: 256 * 1024 * 1024, ttlMs: 86_400_000 },
      lora: null,
      speculative: null,
      host: "127.0.0.1",
      port: 8000,
      servedModelName: null,
      maxModelLen: undefined,
      maxNumSeqs: 256,
      maxNumBatchedTokens: 2048,
      blockSize: 16,
      numGpuBlocksOverride: undefined,
      kvCacheMemoryBytes: undefined,
      dtype: "auto",
      device: "auto",
      seed: 0,
      loadFormat: "auto",
      attentionBackend: "auto",
      enforceEager: false,
      runner: "auto",
      hfOverrides: null,
      modelLoaderExtraConfig: null,
      enablePrefixCaching: true,
      apiKey: null,
      logLevel: "info",
      maxNumQueuedRequests: 4096,
      maxRequestBodyBytes: 64 * 1024 * 1024,
      deployment: null,
      shmBytes: undefined,
      asyncScheduling: true,
      schedulingPolicy: "fcfs",
      engineThread: true,
      reasoningParser: null,
      toolCallParser: null,
      enableAutoToolChoice: false,
      maxWorkerRestarts: 5,
      maxRequestMigrations: 1,
      stepTimeoutS: null,
      shutdownTimeoutS: 20,
      dataParallelSize: 1,
      router: { policy: "cache-aware", cacheThreshold: 0.3, balanceAbsThreshold: 64, balanceRelThreshold: 1.5 },
      tensorParallelSize: 1,
      distributedExecutorBackend: "mp",
    });
  });

  test("--speculative-config: vLLM's ngram and draft_model methods, each with its own keys", () => {
    const ngram = parseServeArgs(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']).options.speculative;
    assert.deepEqual(ngram, { method: "ngram", numSpeculativeTokens: 4, promptLookupMin: 1, promptLookupMax: 3, draftModel: null });
    const draft = parseServeArgs(["--speculative-config", '{"method": "draft_model", "model": "small", "num_speculative_tokens": 3}']).options.speculative;
    assert.deepEqual(draft, { method: "draft_model", numSpeculativeTokens: 3, promptLookupMin: 1, promptLookupMax: 3, draftModel: resolve("small") });
    const bad = (config: object, why: RegExp): void => void assert.throws(() => parseServeArgs(["--speculative-config", JSON.stringify(config)]), why);
    bad({ method: "eagle", num_speculative_tokens: 2 }, /method "eagle" is not served \(served: "ngram", "draft_model"\)/);
    bad({ method: "draft_model", num_speculative_tokens: 2 }, /method draft_model needs model, the draft model's directory/);
    bad({ method: "draft_model", model: "m", num_speculative_tokens: 2, prompt_lookup_max: 3 }, /unknown key prompt_lookup_max for method draft_model/);
    bad({ method: "ngram", num_speculative_tokens: 0 }, /num_speculative_tokens must be a positive integer/);
  });

  test("--model-loader-extra-config: a JSON object, on to the worker as it is", () => {
    const { options } = parseServeArgs(["--load-format", "dummy", "--model-loader-extra-config", '{"residual_scale": 0.01}']);
    assert.deepEqual(options.modelLoaderExtraConfig, { residual_scale: 0.01 });
    assert.throws(() => parseServeArgs(["--model-loader-extra-config", "[1]"]), /invalid value '\[1\]' for --model-loader-extra-config: expected a JSON object/);
    assert.throws(() => parseServeArgs(["--model-loader-extra-config", "{"]), /for --model-loader-extra-config: expected a JSON object/);
  });

  test("--data-parallel-size and the router flags", () => {
    const { options } = parseServeArgs(["--data-parallel-size", "2", "--router", "round-robin"]);
    assert.equal(options.dataParallelSize, 2);
    assert.equal(options.router.policy, "round-robin");
    const tuned = parseServeArgs(["--data_parallel_size=4", "--router-cache-threshold", "0.5", "--router-balance-abs-threshold", "8", "--router-balance-rel-threshold", "2"]).options;
    assert.deepEqual(tuned.router, { policy: "cache-aware", cacheThreshold: 0.5, balanceAbsThreshold: 8, balanceRelThreshold: 2 });
    assert.throws(() => parseServeArgs(["--data-parallel-size", "0"]), /--data-parallel-size: must be at least 1/);
    assert.throws(() => parseServeArgs(["--data-parallel-size", "two"]), /--data-parallel-size: expected an integer/);
    assert.throws(() => parseServeArgs(["--router", "random", "--data-parallel-size", "2"]), /choose from cache-aware, round-robin/);
    assert.throws(() => parseServeArgs(["--router", "round-robin"]), /--router needs --data-parallel-size 2 or more/);
    assert.throws(() => parseServeArgs(["--data-parallel-size", "2", "--router-cache-threshold", "1.5"]), /--router-cache-threshold: expected a number from 0 to 1/);
    assert.throws(() => parseServeArgs(["--data-parallel-size", "2", "--router-balance-rel-threshold", "0.5"]), /--router-balance-rel-threshold: expected a number from 1/);
    assert.throws(
      () => parseServeArgs(["--data-parallel-size", "2", "--router", "round-robin", "--router-cache-threshold", "0.5"]),
      /--router-cache-threshold tunes --router cache-aware/,
    );
    assert.throws(() => parseServeArgs(["--data-parallel-size", "2", "--deployment", "d.yaml"]), /cannot be combined with --deployment/);
  });

  test("--reasoning-parser", () => {
    assert.equal(parseServeArgs(["--reasoning-parser", "qwen3"]).options.reasoningParser, "qwen3");
    assert.equal(parseServeArgs(["--reasoning_parser=deepseek_r1"]).options.reasoningParser, "deepseek_r1");
    assert.throws(() => parseServeArgs(["--reasoning-parser", "granite"]), /choose from qwen3, deepseek_r1/);
  });

  test("--enable-auto-tool-choice and --tool-call-parser", () => {
    const { options } = parseServeArgs(["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]);
    assert.equal(options.enableAutoToolChoice, true);
    assert.equal(options.toolCallParser, "qwen3_coder");
    assert.equal(parseServeArgs(["--tool-call-parser=llama3_json"]).options.enableAutoToolChoice, false);
    assert.throws(() => parseServeArgs(["--tool-call-parser", "xml"]), /choose from hermes, llama3_json, mistral, qwen3_coder/);
    assert.throws(() => parseServeArgs(["--enable-auto-tool-choice"]), /needs --tool-call-parser/);
  });

  test("reliability flags: restarts, migrations, step timeout, shutdown timeout", () => {
    const { options } = parseServeArgs(["--max-worker-restarts", "0", "--max-request-migrations=3", "--step-timeout", "2.5", "--shutdown-timeout", "0"]);
    assert.equal(options.maxWorkerRestarts, 0);
    assert.equal(options.maxRequestMigrations, 3);
    assert.equal(options.stepTimeoutS, 2.5);
    assert.equal(options.shutdownTimeoutS, 0);
    assert.throws(() => parseServeArgs(["--max-worker-restarts", "-1"]), UsageError);
    assert.throws(() => parseServeArgs(["--step-timeout", "0"]), /--step-timeout: must be at least 0.1/);
    assert.throws(() => parseServeArgs(["--step-timeout", "soon"]), /expected a number of seconds/);
    assert.throws(() => parseServeArgs(["--shutdown-timeout", "-5"]), UsageError);
  });

  test("--no-async-scheduling and --scheduling-policy", () => {
    const { options } = parseServeArgs(["--no-async-scheduling", "--scheduling-policy", "priority"]);
    assert.equal(options.asyncScheduling, false);
    assert.equal(options.schedulingPolicy, "priority");
    assert.equal(parseServeArgs(["--async-scheduling"]).options.asyncScheduling, true);
    assert.throws(() => parseServeArgs(["--scheduling-policy", "lifo"]), UsageError);
    assert.throws(() => parseServeArgs(["--async-scheduling", "--no-async-scheduling"]), UsageError);
  });

  test("--tensor-parallel-size", () => {
    assert.equal(parseServeArgs(["--tensor-parallel-size", "2"]).options.tensorParallelSize, 2);
    assert.equal(parseServeArgs(["--tensor_parallel_size=4"]).options.tensorParallelSize, 4);
    assert.throws(() => parseServeArgs(["--tensor-parallel-size", "0"]), UsageError);
    assert.equal(parseServeArgs(["--distributed-executor-backend", "ray"]).options.distributedExecutorBackend, "ray");
    assert.throws(() => parseServeArgs(["--distributed-executor-backend", "slurm"]), UsageError);
    assert.throws(() => parseServeArgs(["--tensor-parallel-size", "2", "--deployment", "d.yaml"]), /do not combine/);
  });

  test("--no-engine-thread", () => {
    assert.equal(parseServeArgs(["--no-engine-thread"]).options.engineThread, false);
    assert.equal(parseServeArgs(["--engine-thread"]).options.engineThread, true);
    assert.throws(() => parseServeArgs(["--engine-thread", "--no-engine-thread"]), UsageError);
  });

  test("every flag, with = and underscore spellings", () => {
    const { options } = parseServeArgs([
      "/models/x",
      "--host=0.0.0.0",
      "--port",
      "0",
      "--served-model-name",
      "qwen",
      "--max_model_len",
      "4k",
      "--max-num-seqs",
      "8",
      "--max-num-batched-tokens=64",
      "--block-size",
      "4",
      "--num-gpu-blocks-override",
      "100",
      "--kv-cache-memory-bytes",
      "1G",
      "--dtype",
      "half",
      "--device",
      "cpu",
      "--seed",
      "7",
      "--load-format",
      "dummy-null",
      "--no-enable-prefix-caching",
    ]);
    assert.equal(options.modelDir, "/models/x");
    assert.equal(options.host, "0.0.0.0");
    assert.equal(options.port, 0);
    assert.equal(options.servedModelName, "qwen");
    assert.equal(options.maxModelLen, 4000);
    assert.equal(options.maxNumSeqs, 8);
    assert.equal(options.maxNumBatchedTokens, 64);
    assert.equal(options.blockSize, 4);
    assert.equal(options.numGpuBlocksOverride, 100);
    assert.equal(options.kvCacheMemoryBytes, 1024 ** 3);
    assert.equal(options.dtype, "float16");
    assert.equal(options.device, "cpu");
    assert.equal(options.seed, 7);
    assert.equal(options.loadFormat, "dummy-null");
    assert.equal(options.enablePrefixCaching, false);
  });

  test("human-readable integers", () => {
    assert.equal(parseHumanInt("2048", "x"), 2048);
    assert.equal(parseHumanInt("32k", "x"), 32_000);
    assert.equal(parseHumanInt("32K", "x"), 32_768);
    assert.equal(parseHumanInt("1.5G", "x"), 1.5 * 1024 ** 3);
    assert.throws(() => parseHumanInt("12abc", "x"), UsageError);
  });

  const bad: [string[], RegExp][] = [
    [["--bogus"], /unknown option '--bogus'/],
    [["--dtype", "float8"], /float8.*--dtype/],
    [["--device", "tpu"], /tpu.*--device/],
    [["--port", "70000"], /--port/],
    [["--block-size", "0"], /--block-size: must be at least 1/],
    [["--max-num-seqs", "many"], /--max-num-seqs/],
    [["a", "b"], /at most one model directory/],
    [["--served-model-name", ""], /must not be empty/],
  ];
  for (const [args, pattern] of bad) {
    test(`refuses ${args.join(" ")}`, () => {
      assert.throws(() => parseServeArgs(args), (e: unknown) => e instanceof UsageError && pattern.test(e.message));
    });
  }
});

describe("the baton command", () => {
  test("--version", () => {
    const result = run(["--version"]);
    assert.equal(result.code, 0);
    assert.match(result.stdout, /^baton \d+\.\d+\.\d+\n$/);
  });

  test("--help and serve --help", () => {
    assert.match(run(["--help"]).stdout, /baton <command>/);
    const serveHelp = run(["serve", "--help"]);
    assert.equal(serveHelp.code, 0);
    for (const flag of ["--host", "--port", "--served-model-name", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--num-gpu-blocks-override", "--kv-cache-memory-bytes", "--dtype", "--device", "--seed", "--load-format", "--no-enable-prefix-caching"]) {
      assert.ok(serveHelp.stdout.includes(flag), `serve --help lists ${flag}`);
    }
  });

  test("an unknown flag exits 2 with a message", () => {
    const result = run(["serve", "--frobnicate"]);
    assert.equal(result.code, 2);
    assert.match(result.stderr, /unknown option '--frobnicate'/);
  });

  test("an unknown command exits 2", () => {
    assert.equal(run(["frob"]).code, 2);
  });

  test("a missing model directory exits 1 naming it", () => {
    const result = run(["serve", "/nonexistent/no-such-model"]);
    assert.equal(result.code, 1, result.stderr);
    assert.match(result.stderr, /^baton: model directory \/nonexistent\/no-such-model does not exist/);
  });
});
