"""python -m envs --benchmark-seconds 10: placements per second of the Tetris env and the batched engine."""

import argparse

import torch

from envs.tetris import VARIANTS, benchmark

parser = argparse.ArgumentParser(description="Speed of the Tetris env and the batched afterstate engine")
parser.add_argument("--benchmark-seconds", type=float, default=10.0)
parser.add_argument("--variant", default="sz", choices=sorted(VARIANTS))
cli = parser.parse_args()
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, variant {cli.variant}")
for name, rate in benchmark(cli.benchmark_seconds, cli.variant).items():
    print(f"{name:40s} {rate:12,.0f} placements/s")
