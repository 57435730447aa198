// Reading Hugging Face model directories: which file wins for EOS ids, the
// shapes chat templates and special tokens come in, and errors that name the
// missing file.

import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { ModelDirError, readModelDir, requireTokenizer } from "../../src/config/model-dir.js";
import { qwenTokenizerPath } from "../text/helpers.js";

const dirs: string[] = [];
after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

function modelDir(files: Record<string, unknown>, withTokenizer = true): string {
  const dir = mkdtempSync(join(tmpdir(), "baton-model-dir-"));
  dirs.push(dir);
  for (const [name, content] of Object.entries(files)) {
    writeFileSync(join(dir, name), typeof content === "string" ? content : JSON.stringify(content));
  }
  if (withTokenizer) copyFileSync(qwenTokenizerPath, join(dir, "tokenizer.json"));
  return dir;
}

const CONFIG = { architectures: ["Qwen3ForCausalLM"], max_position_embeddings: 4096, eos_token_id: 151645, bos_token_id: 151643, vocab_size: 151936 };

describe("readModelDir", () => {
  test("reads config.json", () => {
    const info = readModelDir(modelDir({ "config.json": CONFIG }));
    assert.deepEqual(info.architectures, ["Qwen3ForCausalLM"]);
    assert.equal(info.maxPositionEmbeddings, 4096);
    assert.deepEqual(info.eosTokenIds, [151645]);
    assert.equal(info.bosTokenId, 151643);
    assert.equal(info.vocabSize, 151936);
    assert.match(info.tokenizerPath ?? "", /tokenizer\.json$/);
    assert.equal(info.tokenizer.chatTemplate, null);
  });

  test("generation_config.json eos ids win over config.json, as a list", () => {
    const info = readModelDir(modelDir({ "config.json": CONFIG, "generation_config.json": { eos_token_id: [151645, 151643, 151645] } }));
    assert.deepEqual(info.eosTokenIds, [151645, 151643]);
  });

  test("generation_config.json's sampling defaults; a bad one is named", () => {
    const info = readModelDir(modelDir({ "config.json": CONFIG, "generation_config.json": { temperature: 0.9, top_k: 50, max_new_tokens: 125 } }));
    assert.deepEqual(info.samplingDefaults, { temperature: 0.9, topK: 50, maxNewTokens: 125 });
    assert.deepEqual(readModelDir(modelDir({ "config.json": CONFIG })).samplingDefaults, { temperature: null, topK: null, maxNewTokens: null });
    assert.throws(() => readModelDir(modelDir({ "config.json": CONFIG, "generation_config.json": { temperature: "hot" } })), /generation_config.json temperature/);
  });

  test("config.json eos list when generation_config.json has none", () => {
    const info = readModelDir(modelDir({ "config.json": { ...CONFIG, eos_token_id: [1, 2] }, "generation_config.json": { do_sample: true } }));
    assert.deepEqual(info.eosTokenIds, [1, 2]);
  });

  test("tokenizer_config.json: string template, AddedToken-shaped special tokens, add_bos_token", () => {
    const info = readModelDir(
      modelDir({
        "config.json": CONFIG,
        "tokenizer_config.json": { chat_template: "{{ messages }}", bos_token: { content: "<s>", lstrip: false }, eos_token: "</s>", add_bos_token: true },
      }),
    );
    assert.equal(info.tokenizer.chatTemplate, "{{ messages }}");
    assert.equal(info.tokenizer.bosToken, "<s>");
    assert.equal(info.tokenizer.eosToken, "</s>");
    assert.equal(info.tokenizer.addBosToken, true);
  });

  test("named templates: the default one is used", () => {
    const info = readModelDir(
      modelDir({
        "config.json": CONFIG,
        "tokenizer_config.json": { chat_template: [{ name: "tool_use", template: "T" }, { name: "default", template: "D" }] },
      }),
    );
    assert.equal(info.tokenizer.chatTemplate, "D");
    assert.deepEqual(info.tokenizer.namedChatTemplates, { tool_use: "T", default: "D" });
  });

  test("chat_template.jinja beside tokenizer_config.json", () => {
    const info = readModelDir(modelDir({ "config.json": CONFIG, "tokenizer_config.json": { eos_token: "</s>" }, "chat_template.jinja": "J{{ x }}" }));
    assert.equal(info.tokenizer.chatTemplate, "J{{ x }}");
  });

  test("a directory that does not exist", () => {
    assert.throws(() => readModelDir("/nonexistent/no-such-model"), (e: unknown) => e instanceof ModelDirError && /no-such-model does not exist/.test(e.message));
  });

  test("missing config.json is named", () => {
    assert.throws(() => readModelDir(modelDir({})), (e: unknown) => e instanceof ModelDirError && /config\.json not found/.test(e.message));
  });

  test("missing tokenizer.json is named", () => {
    assert.throws(
      () => requireTokenizer(readModelDir(modelDir({ "config.json": CONFIG }, false))),
      (e: unknown) => e instanceof ModelDirError && /tokenizer\.json not found/.test(e.message),
    );
  });

  test("invalid JSON is named", () => {
    assert.throws(
      () => readModelDir(modelDir({ "config.json": "{ not json" })),
      (e: unknown) => e instanceof ModelDirError && /config\.json is not valid JSON/.test(e.message),
    );
  });

  test("bad eos ids are refused", () => {
    assert.throws(
      () => readModelDir(modelDir({ "config.json": { ...CONFIG, eos_token_id: ["x"] } })),
      (e: unknown) => e instanceof ModelDirError && /eos_token_id/.test(e.message),
    );
  });
});

describe("readModelDir: an image model's image_generation block", () => {
  const block = { sizes: ["32x32", "64x64"], default_size: "64x64", default_inference_steps: 4, max_inference_steps: 50, max_n: 10, max_prompt_tokens: 64, latent_downsampling: 8 };
  const imageDir = (generation: unknown) => modelDir({ "config.json": { architectures: ["BatonDemoImage"], image_generation: generation } }, false);

  test("is read into the bounds /v1/images/generations validates against; other models have none", () => {
    assert.deepEqual(readModelDir(imageDir(block)).imageGeneration, {
      sizes: ["32x32", "64x64"],
      defaultSize: "64x64",
      defaultInferenceSteps: 4,
      maxInferenceSteps: 50,
      maxN: 10,
      maxPromptTokens: 64,
      latentDownsampling: 8,
    });
    assert.equal(readModelDir(modelDir({ "config.json": CONFIG })).imageGeneration, null);
  });

  test("a bad block stops start-up naming the field", () => {
    for (const [change, field] of [
      [{ sizes: ["big"] }, "sizes"],
      [{ default_size: "128x128" }, "default_size"],
      [{ max_n: 0 }, "max_n"],
      [{ default_inference_steps: 60 }, "default_inference_steps"],
      [{ latent_downsampling: undefined }, "latent_downsampling"],
    ] as const) {
      assert.throws(
        () => readModelDir(imageDir({ ...block, ...change })),
        (e: unknown) => e instanceof ModelDirError && e.message.includes(field),
        field,
      );
    }
  });
});
