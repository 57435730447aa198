// GET /v1/models and GET /v1/models/:model: the one served model.

import { modelNotFound } from "./openai-error.js";

export interface ModelCard {
  id: string;
  object: "model";
  created: number;
  owned_by: "baton";
  /** vLLM's extension: the context length the server was started with. */
  max_model_len: number;
}

export function modelCard(name: string, created: number, maxModelLen: number): ModelCard {
  return { id: name, object: "model", created, owned_by: "baton", max_model_len: maxModelLen };
}

export function listModels(card: ModelCard): { object: "list"; data: ModelCard[] } {
  return { object: "list", data: [card] };
}

export function retrieveModel(card: ModelCard, requested: string): ModelCard {
  if (requested !== card.id) throw modelNotFound(requested, card.id);
  return card;
}
