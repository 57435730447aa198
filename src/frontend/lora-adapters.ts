// The LoRA adapters the server offers (--enable-lora): a request picks one by
// its `model`, /v1/models lists them with the base model as parent, and
// vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter change the set
// while serving (only with --allow-runtime-lora-updating). The worker checks
// an adapter's directory when it loads it; its one line is the error here.

import { isAbsolute, resolve } from "node:path";
import type { FastifyInstance } from "fastify";
import { z } from "zod";
import type { LoraAdapterRef, LoraHolder } from "../engine/lora.js";
import { ApiError, badRequest } from "./openai-error.js";


export interface LoraAdapterEntry extends LoraAdapterRef {
  /** Unix seconds it was added (its /v1/models card). */
  created: number;
}

export class LoraCatalog {
  private readonly byName = new Map<string, LoraAdapterEntry>();
  /** Loads on their way, by name: a second load of the same name is refused meanwhile. */
  private readonly loading = new Set<string>();
  /** Adapter ids are never reused: prefix-cache hashes and the worker's table are keyed by them. */
  private nextId = 1;

  constructor(
    private readonly engine: LoraHolder,
    readonly baseModelName: string,
    /** /v1/load_lora_adapter and /v1/unload_lora_adapter are served. */
    readonly runtimeUpdates: boolean,
  ) {}

  /** The adapter id a request's `model` names: 0 for the base model (or no model). */
  idOf(model: string | null): number {
    if (model === null || model === this.baseModelName) return 0;
    return this.byName.get(model)?.id ?? 0;
  }

  has(model: string): boolean {
    return this.byName.has(model);
  }

  get adapters(): readonly LoraAdapterEntry[] {
    return [...this.byName.values()];
  }

  /** Loads it on every worker; rejects with the worker's line (LoraLoadError) or an ApiError for a clash of names. */
  async load(name: string, path: string): Promise<void> {
    if (name === this.baseModelName) throw badRequest(`The lora adapter '${name}' has the base model's name.`, "lora_name");
    if (this.byName.has(name) || this.loading.has(name)) throw badRequest(`The lora adapter '${name}' has already been loaded.`, "lora_name");
    const ref: LoraAdapterRef = { id: this.nextId++, name, path: isAbsolute(path) ? path : resolve(path) };
    this.loading.add(name);
    try {
      await this.engine.loadLora(ref);
    } finally {
      this.loading.delete(name);
    }
    this.byName.set(name, { ...ref, created: Math.floor(Date.now() / 1000) });
  }

  /** Requests naming it are refused from now on; the ones running finish with it. */
  unload(name: string): void {
    const entry = this.byName.get(name);
    if (entry === undefined) throw new ApiError(404, `The lora adapter '${name}' cannot be found.`, "not_found_error", "lora_name");
    this.byName.delete(name);
    this.engine.unloadLora(entry.id);
  }
}

const loadSchema = z.object({ lora_name: z.string().min(1), lora_path: z.string().min(1) }).passthrough();
const unloadSchema = z.object({ lora_name: z.string().min(1) }).passthrough();

/** vLLM's runtime routes; without --allow-runtime-lora-updating they answer 404 saying how to turn them on. */
export function registerLoraRoutes(app: FastifyInstance, catalog: LoraCatalog | null): void {
  const checked = <T>(schema: z.ZodType<T>, body: unknown): T => {
    if (catalog === null || !catalog.runtimeUpdates) {
      const why = catalog === null ? "LoRA is off (start the server with --enable-lora --allow-runtime-lora-updating)" : "runtime LoRA updating is off (start the server with --allow-runtime-lora-updating)";
      throw new ApiError(404, why, "not_found_error");
    }
    const parsed = schema.safeParse(body);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw badRequest(`${issue?.path.join(".") || "body"}: ${issue?.message ?? "invalid"}`, issue?.path.join(".") ?? null);
    }
    return parsed.data;
  };
  app.post("/v1/load_lora_adapter", async (request, reply) => {
    const body = checked(loadSchema, request.body);
    try {
      await catalog!.load(body.lora_name, body.lora_path);
    } catch (error) {
      if (error instanceof ApiError) throw error;
      throw badRequest((error as Error).message, "lora_path");
    }
    return reply.type("text/plain").send(`Success: LoRA adapter '${body.lora_name}' added successfully.`);
  });
  app.post("/v1/unload_lora_adapter", async (request, reply) => {
    const body = checked(unloadSchema, request.body);
    catalog!.unload(body.lora_name);
    return reply.type("text/plain").send(`Success: LoRA adapter '${body.lora_name}' removed successfully.`);
  });
}
