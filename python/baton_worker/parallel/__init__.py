"""Tensor parallelism: how the weights split over ranks and the collectives
(tensor_parallel.py), and starting and supervising the ranks (rank_group.py)."""
