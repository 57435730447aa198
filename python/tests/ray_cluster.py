"""A local Ray cluster of two logical nodes for the Ray placement test.

python ray_cluster.py   prints "RAY_ADDRESS <gcs address>" once both nodes are
up, then holds the cluster until its stdin closes (the test ends, however it
ends) and shuts it down. Each node offers one CPU, so a placement group of two
one-CPU bundles spans both nodes.
"""

from __future__ import annotations

import sys

from ray.cluster_utils import Cluster


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    print(f"RAY_ADDRESS {cluster.address}", flush=True)
    try:
        sys.stdin.read()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
