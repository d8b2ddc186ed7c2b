"""The compiled step (`compiled_shallow_step`, --compile) against the eager step (`shallow_step`) over many steps:
10 runs of the shallow dSiLU net on SZ-Tetris from the same start and the same random draws, main's loop order (fold,
then step). Prints whether every board along the way, the record and the carry match, and the largest parameter gap.

    .venv/bin/python results/tetris_speed/direct_graphs/same_games_check.py --steps 3000
"""

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "algos")]
import td_lambda_tetris as T  # noqa: E402
from envs.tetris import VARIANTS, ColumnEngine, binary_feature_length  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--runs", type=int, default=10)
parser.add_argument("--steps", type=int, default=3000)
cli = parser.parse_args()
torch.set_num_threads(1)
R = cli.runs
height, width, piece_set = VARIANTS["sz"]
pieces_tensor = torch.tensor(piece_set)


def play(step_fn):
    engine = ColumnEngine(height, width, piece_set)
    P = engine.num_placements
    learner = T.ShallowTD(T.init_shallow(R, binary_feature_length(height, width), 50, 1, "cpu"), [("dsilu", 0, R)])
    empty_board = torch.zeros(width, dtype=torch.long)
    empty_state = T.shallow_indices(empty_board, empty_board.sum(), height)
    target = torch.full((R,), 10**6)
    encoding = T._bias_encoding_table(height, width, "cpu")
    constants = (0.99, 0.001, 0.99 * 0.55, 0.5, 0.00025, 33.3, "current")  # gamma, alpha, gamma lambda, tau0, ...
    k = T.StepConstants(*constants, empty_board, empty_state, target, encoding)
    rng = torch.Generator().manual_seed(7)
    s = dict(
        boards=empty_board.expand(R, width).clone(),
        states=empty_state.expand(R, *empty_state.shape).clone(),
        pieces=pieces_tensor[torch.randint(len(piece_set), (R,), generator=rng)],
        holes_now=torch.zeros(R, dtype=torch.long),
        decay=torch.zeros(R),
        score=torch.zeros(R),
        length=torch.zeros(R, dtype=torch.long),
        active=torch.ones(R, dtype=torch.bool),
        placements=torch.zeros((), dtype=torch.long),
        abs_td_sum=torch.zeros(R),
        episodes=torch.zeros(R, dtype=torch.long),
        scores=torch.zeros(R, 10**4),
        lengths=torch.zeros(R, 10**4, dtype=torch.long),
    )
    boards = []
    for _ in range(cli.steps):
        learner.decay_traces(s["decay"])
        uniform = torch.rand(R, P + 1, generator=rng)
        s = step_fn(learner, engine, s, uniform, pieces_tensor[torch.randint(len(piece_set), (R,), generator=rng)], k)
        boards.append(s["boards"])
    return torch.stack(boards), s, learner.parameters()


eager_boards, eager, eager_theta = play(T.shallow_step)
boards, carry, theta = play(T.compiled_shallow_step(fallback=False))
print(f"{R} runs, {cli.steps} steps, episodes per run (eager): {eager['episodes'].tolist()}")
print("every board along the way equal:", torch.equal(boards, eager_boards))
for key in eager:
    print(f"carry[{key!r}] equal: {torch.equal(carry[key], eager[key])}, max |diff| "
          f"{(carry[key].double() - eager[key].double()).abs().max().item():.3g}")  # fmt: skip
for name in theta:
    gap = (theta[name] - eager_theta[name]).abs().max().item()
    scale = eager_theta[name].abs().max().item()
    print(f"theta[{name!r}]: max |diff| {gap:.3g} (max |value| {scale:.3g})")
