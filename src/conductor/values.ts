// What flows along edges in the conductor (graph contract, "Values"). The
// conductor never looks inside a tensor: it routes descriptors and tells the
// owning worker when the control plane no longer refers to one.

export interface TensorValue {
  readonly kind: "tensor";
  /** The tensor's id in its owner's tensor store. */
  readonly handle: number;
  /** The worker holding the bytes. */
  readonly worker: number;
  readonly dtype: string;
  readonly shape: readonly number[];
}

/** Sampled ids (from kv_cache nodes) and prompt ids, which the control plane has anyway. */
export interface TokensValue {
  readonly kind: "tokens";
  readonly ids: Int32Array;
}

/** A declared output that was not produced: a signal. */
export interface EmptyValue {
  readonly kind: "empty";
}

export type Value = TensorValue | TokensValue | EmptyValue;

/** An edge delivery: a list of values, possibly empty (a signal). */
export type Values = readonly Value[];

export const NO_VALUES: Values = Object.freeze([]);
