"""The official `openai` Python client's Responses API against a running Baton server.

Usage: python responses_python_client.py BASE_URL MODEL
Drives client.responses.create (plain, streamed), a tool loop with
previous_response_id, responses.parse with a pydantic text_format, the stream
helper, background with retrieve and cancel, input_items and delete; prints one
JSON line {"ok": true, "checks": N} or raises (non-zero exit) naming the failed check.
"""

import json
import sys
import time
from typing import Literal

import openai
from pydantic import BaseModel, Field

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


# plain: a response with a message and usage
params = dict(model=model, input="The quick brown fox", instructions="Be brief.", max_output_tokens=8, temperature=0)
full = client.responses.create(**params)
check(full.object == "response" and full.id.startswith("resp_"), "response id and object")
check(full.status == "incomplete" and full.incomplete_details.reason == "max_output_tokens", "incomplete at max_output_tokens")
check(full.usage.output_tokens == 8 and full.usage.total_tokens == full.usage.input_tokens + 8, "usage")
check(len(full.output_text) > 0 and full.output[0].type == "message", "output_text")

# streamed: typed events, consecutive sequence numbers, deltas join to the text
events = list(client.responses.create(**params, stream=True))
check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
check(events[0].type == "response.created" and events[-1].type == "response.incomplete", "first and last events")
deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
check(deltas == full.output_text, "stream equals non-stream")
check(events[-1].response.usage.output_tokens == 8, "usage in the last event")

# a tool loop: a forced call, then its output with previous_response_id
tools = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"], "additionalProperties": False},
        "strict": True,
    }
]
first = client.responses.create(model=model, input="Weather in Oslo?", tools=tools, tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40, temperature=0)
calls = [item for item in first.output if item.type == "function_call"]
check(len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo"), "forced call")
result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"temperature_c": 3})}
second = client.responses.create(model=model, previous_response_id=first.id, input=[result], max_output_tokens=4, temperature=0)
check(second.previous_response_id == first.id and second.usage.input_tokens > 20, "continued from the stored response")
history = [{"role": "user", "content": "Weather in Oslo?"}, {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments}, result]
resent = client.responses.create(model=model, input=history, max_output_tokens=4, temperature=0)
check(resent.usage.input_tokens == second.usage.input_tokens, "stored history equals resent history")
items = client.responses.input_items.list(second.id, order="asc")
check([i.type for i in items.data] == ["message", "function_call", "function_call_output"], "input_items")
try:
    client.responses.create(model=model, input=[{"type": "function_call_output", "call_id": "call_missing", "output": "1"}])
    check(False, "an output without its call must fail")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body.get("param") == "input[0].call_id", "400 names the call_id")
try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_unknown")
    check(False, "an unknown previous_response_id must fail")
except openai.BadRequestError as e:
    check(e.body.get("param") == "previous_response_id", "400 names previous_response_id")


# structured output: parse() sends the pydantic model as text.format json_schema
class Pet(BaseModel):
    name: str = Field(max_length=8)
    kind: Literal["cat", "dog", "fish"]
    legs: int = Field(ge=0, le=4)


parsed = client.responses.parse(model=model, input="A pet", text_format=Pet, max_output_tokens=200, temperature=0)
pet = parsed.output_parsed
check(isinstance(pet, Pet) and 0 <= pet.legs <= 4, "parsed pet")
with client.responses.stream(model=model, input="A pet", text_format=Pet, max_output_tokens=200, temperature=0) as stream:
    for _ in stream:
        pass
    final = stream.get_final_response()
check(final.status == "completed" and final.output_parsed == pet, "stream helper's final response")

# background: queued, polled, cancelled; then deleted
bg = client.responses.create(model=model, input="Tell a long story.", temperature=0, background=True)
check(bg.status == "queued", "background starts queued")
polled = client.responses.retrieve(bg.id)
for _ in range(200):
    if polled.output_text:
        break
    time.sleep(0.05)
    polled = client.responses.retrieve(bg.id)
check(polled.status == "in_progress", "background in progress")
cancelled = client.responses.cancel(bg.id)
check(cancelled.status == "cancelled" and 0 < cancelled.usage.output_tokens < 4000, "cancelled")
client.responses.delete(bg.id)
try:
    client.responses.retrieve(bg.id)
    check(False, "a deleted response must be gone")
except openai.NotFoundError:
    check(True, "404 after delete")

print(json.dumps({"ok": True, "checks": checks}))
