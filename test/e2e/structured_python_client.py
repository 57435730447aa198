"""The official `openai` Python client's parse() against a running Baton server:
a pydantic model becomes a json_schema response_format, and the structured
answer comes back parsed.

Usage: python structured_python_client.py BASE_URL MODEL; prints {"ok": true, ...}.
"""

import json
import sys
from typing import Literal

import openai
from pydantic import BaseModel, Field

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


class Pet(BaseModel):
    name: str = Field(max_length=8)
    kind: Literal["cat", "dog", "fish"]
    legs: int = Field(ge=0, le=4)


completions = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
result = completions(model=model, messages=[{"role": "user", "content": "A pet"}], response_format=Pet, max_tokens=200, seed=4)
pet = result.choices[0].message.parsed
assert isinstance(pet, Pet), result
assert 0 <= pet.legs <= 4 and len(pet.name) <= 8
print(json.dumps({"ok": True, "pet": pet.model_dump()}))
