// GET /v1/models and GET /v1/models/:model: the served model and its LoRA adapters.

import type { LoraCatalog } from "./lora-adapters.js";
import { modelNotFound } from "./openai-error.js";

export interface ModelCard {
  id: string;
  object: "model";
  created: number;
  owned_by: "baton";
  /** vLLM's: where the weights come from (the model directory; an adapter's PEFT directory). */
  root: string;
  /** vLLM's: the base model an adapter runs over; null for the base model. */
  parent: string | null;
  /** vLLM's extension: the context length the server was started with. */
  max_model_len: number;
}

export function modelCard(name: string, created: number, maxModelLen: number, root: string = name): ModelCard {
  return { id: name, object: "model", created, owned_by: "baton", root, parent: null, max_model_len: maxModelLen };
}

function cards(card: ModelCard, adapters: LoraCatalog | null): ModelCard[] {
  const loras = (adapters?.adapters ?? []).map((a): ModelCard => ({ ...card, id: a.name, created: a.created, root: a.path, parent: card.id }));
  return [card, ...loras];
}

export function listModels(card: ModelCard, adapters: LoraCatalog | null = null): { object: "list"; data: ModelCard[] } {
  return { object: "list", data: cards(card, adapters) };
}

export function retrieveModel(card: ModelCard, requested: string, adapters: LoraCatalog | null = null): ModelCard {
  const found = cards(card, adapters).find((c) => c.id === requested);
  if (found === undefined) throw modelNotFound(requested, card.id);
  return found;
}
