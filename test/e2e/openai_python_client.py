"""The official `openai` Python client against a running Baton server.

Usage: python openai_python_client.py BASE_URL MODEL
Checks the parameters users pass from Python scripts; prints one JSON line
{"ok": true, "checks": N} or raises (non-zero exit) naming the failed check.
"""

import json
import sys
import urllib.request

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


# completions: stream == non-stream at temperature 0, usage
params = dict(model=model, prompt="The quick brown fox", max_tokens=10, temperature=0, user="py-test")
full = client.completions.create(**params)
check(full.usage.completion_tokens == 10 and full.choices[0].finish_reason == "length", "completions usage")
text = "".join(c.choices[0].text for c in client.completions.create(**params, stream=True) if c.choices)
check(text == full.choices[0].text, "completions stream equals non-stream")

# chat with every role, content parts, max_completion_tokens, include_usage
messages = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]
chat = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=8, temperature=0)
streamed, usage = "", None
for chunk in client.chat.completions.create(
    model=model, messages=messages, max_completion_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
):
    if chunk.choices:
        streamed += chunk.choices[0].delta.content or ""
    if chunk.usage:
        usage = chunk.usage
check(streamed == chat.choices[0].message.content, "chat stream equals non-stream")
check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens, "chat include_usage")
req = urllib.request.Request(f"{base}/tokenize", data=json.dumps({"model": model, "messages": messages}).encode(), headers={"content-type": "application/json"})
tok = json.loads(urllib.request.urlopen(req).read())
check(tok["count"] == chat.usage.prompt_tokens, "chat prompt_tokens match /tokenize")

# n=3, seeded, sampling knobs
many = client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0, top_p=0.9, seed=11,
    extra_body={"top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1}, presence_penalty=0.5, frequency_penalty=0.5,
)
check(sorted(c.index for c in many.choices) == [0, 1, 2], "n=3 indexes")
check(len({c.text for c in many.choices}) == 3, "n=3 distinct")

# chat logprobs
lp = client.chat.completions.create(model=model, messages=messages[:2], max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
check(len(content) == lp.usage.completion_tokens, "one logprob per token")
check(all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in content), "top_logprobs size")
check(abs(content[0].top_logprobs[0].logprob - content[0].logprob) < 1e-6, "greedy token is the top one")

# completions logprobs + echo
echo = client.completions.create(model=model, prompt="Hello there", max_tokens=3, temperature=0, echo=True, logprobs=2)
check(echo.choices[0].text.startswith("Hello there"), "echo prefixes the prompt")
check(len(echo.choices[0].logprobs.tokens) == echo.usage.prompt_tokens + 3, "echo logprobs cover prompt and output")

# stop strings, stop_token_ids
base_text = client.completions.create(model=model, prompt="Stop here", max_tokens=12, temperature=0).choices[0].text
stop = base_text[4:7]
if stop and base_text.find(stop) == 4:
    cut = client.completions.create(model=model, prompt="Stop here", max_tokens=12, temperature=0, stop=[stop])
    check(cut.choices[0].text == base_text[:4] and cut.choices[0].finish_reason == "stop", "stop string cut")

# errors arrive as openai exceptions with the OpenAI shape
try:
    client.completions.create(model=model, prompt="x", max_tokens=-1)
    check(False, "bad max_tokens must fail")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body.get("param") == "max_tokens", "400 names the param")
try:
    client.completions.create(model="nope", prompt="x", max_tokens=1)
    check(False, "unknown model must fail")
except openai.NotFoundError as e:
    check(e.status_code == 404, "404 for unknown model")

print(json.dumps({"ok": True, "checks": checks}))
