// The data-parallel router's guess of what each replica has cached: one radix
// tree over the token ids of the prompts routed so far, each node marked with
// the replicas ("tenants") it was routed to and when. It is approximate by
// design: the engines evict on their own, the router only caps each tenant's
// share at what its KV cache can hold (least recently routed leaves first) and
// forgets a tenant whose worker died (its engine forgot its prefix cache).
//
// Invariant: a tenant marked on a node is marked on every ancestor of it, so
// a tenant's longest cached prefix ends at the deepest node on the prompt's
// path that carries it, and its leaves are the nodes none of whose children
// carry it.

class TreeNode {
  /** Token ids from the parent to this node (empty for the root only). */
  edge: number[];
  readonly children = new Map<number, TreeNode>();
  /** Tenant -> tick of its last insert or match through this node. */
  readonly tenants = new Map<number, number>();

  constructor(
    edge: number[],
    public parent: TreeNode | null,
  ) {
    this.edge = edge;
  }
}

/** Per tenant: how many leading tokens of the prompt it holds. */
export type PrefixMatch = Map<number, number>;

function commonLength(edge: readonly number[], tokens: readonly number[], from: number): number {
  const n = Math.min(edge.length, tokens.length - from);
  let i = 0;
  while (i < n && edge[i] === tokens[from + i]) i++;
  return i;
}

export class ApproximatePrefixTree {
  private readonly root = new TreeNode([], null);
  /** Tenant -> tokens it holds (sum of the edges of the nodes it is marked on). */
  private readonly sizes = new Map<number, number>();
  private tick = 0;

  /** Tokens the tenant holds in the tree. */
  size(tenant: number): number {
    return this.sizes.get(tenant) ?? 0;
  }

  /** For each tenant that holds some of it, how many leading tokens of `tokens`; refreshes the matched path. */
  match(tokens: readonly number[]): PrefixMatch {
    const now = ++this.tick;
    const matched: PrefixMatch = new Map();
    let node = this.root;
    let depth = 0;
    while (depth < tokens.length) {
      const child = node.children.get(tokens[depth] as number);
      if (child === undefined) break;
      const common = commonLength(child.edge, tokens, depth);
      depth += common;
      for (const tenant of child.tenants.keys()) {
        matched.set(tenant, depth);
        child.tenants.set(tenant, now);
      }
      if (common < child.edge.length) break;
      node = child;
    }
    return matched;
  }

  /** Marks `tokens` as routed to `tenant` (cached there from now on, as far as the router knows). */
  insert(tokens: readonly number[], tenant: number): void {
    const now = ++this.tick;
    let node = this.root;
    let depth = 0;
    while (depth < tokens.length) {
      let child = node.children.get(tokens[depth] as number);
      if (child === undefined) {
        child = new TreeNode(tokens.slice(depth), node);
        node.children.set(tokens[depth] as number, child);
      } else {
        const common = commonLength(child.edge, tokens, depth);
        if (common < child.edge.length) child = this.split(child, common);
      }
      if (!child.tenants.has(tenant)) this.sizes.set(tenant, this.size(tenant) + child.edge.length);
      child.tenants.set(tenant, now);
      depth += child.edge.length;
      node = child;
    }
  }

  /** Unmarks the tenant's least recently used leaves until it holds at most maxTokens. */
  evict(tenant: number, maxTokens: number): void {
    if (this.size(tenant) <= maxTokens) return;
    // Its leaves by last use; a parent that becomes a leaf joins the queue in order.
    const leaves: TreeNode[] = [];
    const visit = (node: TreeNode): void => {
      let childHolds = false;
      for (const child of node.children.values()) {
        if (!child.tenants.has(tenant)) continue;
        childHolds = true;
        visit(child);
      }
      if (!childHolds && node !== this.root) leaves.push(node);
    };
    visit(this.root);
    const lastUse = (n: TreeNode): number => n.tenants.get(tenant) ?? 0;
    leaves.sort((a, b) => lastUse(a) - lastUse(b));
    while (this.size(tenant) > maxTokens && leaves.length > 0) {
      const leaf = leaves.shift() as TreeNode;
      const parent = leaf.parent as TreeNode;
      this.unmark(leaf, tenant);
      if (parent === this.root || [...parent.children.values()].some((c) => c.tenants.has(tenant))) continue;
      // Insert the parent by its last use (leaves stays sorted).
      const t = lastUse(parent);
      let at = leaves.findIndex((n) => lastUse(n) > t);
      if (at < 0) at = leaves.length;
      leaves.splice(at, 0, parent);
    }
  }

  /** Forgets everything routed to the tenant. */
  removeTenant(tenant: number): void {
    const marked: TreeNode[] = [];
    const visit = (node: TreeNode): void => {
      for (const child of node.children.values()) {
        if (!child.tenants.has(tenant)) continue;
        visit(child);
        marked.push(child);
      }
    };
    visit(this.root);
    // Children come before their parents in `marked`.
    for (const node of marked) this.unmark(node, tenant);
    this.sizes.delete(tenant);
  }

  /** Nodes in the tree (tests). */
  get nodeCount(): number {
    let count = 0;
    const visit = (node: TreeNode): void => {
      count++;
      for (const child of node.children.values()) visit(child);
    };
    visit(this.root);
    return count - 1;
  }

  /** Splits `child` after `at` edge tokens; returns the new upper node (it keeps the tenants). */
  private split(child: TreeNode, at: number): TreeNode {
    const parent = child.parent as TreeNode;
    const upper = new TreeNode(child.edge.slice(0, at), parent);
    for (const [tenant, t] of child.tenants) upper.tenants.set(tenant, t);
    parent.children.set(upper.edge[0] as number, upper);
    child.edge = child.edge.slice(at);
    child.parent = upper;
    upper.children.set(child.edge[0] as number, child);
    return upper;
  }

  /** Removes the tenant's mark from a node none of whose children carry it; drops the node once nobody holds it. */
  private unmark(node: TreeNode, tenant: number): void {
    if (!node.tenants.delete(tenant)) return;
    this.sizes.set(tenant, this.size(tenant) - node.edge.length);
    if (node.tenants.size === 0 && node.children.size === 0 && node.parent !== null) {
      node.parent.children.delete(node.edge[0] as number);
    }
  }
}
