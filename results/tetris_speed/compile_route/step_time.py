"""Time one compiled step of the shallow net as main() calls it (decay_traces, then the step), outside main: the
same set-up as Table 1's process (SZ-Tetris, 50 hidden units, one torch thread), R runs split over up to four
activations. 300 warm-up steps (compilation included), then the median and minimum of five blocks of 1,000 steps.

    python step_time.py CODE_ROOT R     # CODE_ROOT: a checkout whose algos/td_lambda_tetris.py is timed
"""

import os
import sys
import time

root, R = sys.argv[1], int(sys.argv[2])
sys.path[:0] = [root, os.path.join(root, "algos")]
import torch  # noqa: E402

torch.set_num_threads(1)
import td_lambda_tetris as T  # noqa: E402
from envs.tetris import VARIANTS, ColumnEngine, binary_feature_length  # noqa: E402

height, width, piece_set = VARIANTS["sz"]
engine = ColumnEngine(height, width, piece_set)
pieces_tensor, rng = torch.tensor(piece_set), torch.Generator().manual_seed(1)
acts = ["dsilu", "sigmoid", "silu", "relu"][: max(1, R // 10)]
n = R // len(acts)
groups = [(a, i * n, (i + 1) * n) for i, a in enumerate(acts)]
learner = T.ShallowTD(T.init_shallow(R, binary_feature_length(height, width), 50, 1, "cpu"), groups)
empty_board = torch.zeros(width, dtype=torch.long)
empty_state = T.shallow_indices(empty_board, empty_board.sum(), height)
episodes = torch.zeros(R, dtype=torch.long)
target = torch.full_like(episodes, 10**6)
k = T.StepConstants(0.99, 0.001, 0.99 * 0.55, 0.5, 0.00025, 33.0, "current", empty_board, empty_state, target,
                    T._bias_encoding_table(height, width, "cpu"))  # fmt: skip
carry = dict(
    boards=empty_board.expand(R, width).clone(), states=empty_state.expand(R, -1).clone(),
    pieces=pieces_tensor[torch.randint(len(piece_set), (R,), generator=rng)], holes_now=torch.zeros_like(episodes),
    decay=torch.zeros(R), score=torch.zeros(R), length=torch.zeros_like(episodes), active=episodes < target,
    placements=torch.zeros((), dtype=torch.long), abs_td_sum=torch.zeros(R), episodes=episodes,
    scores=torch.zeros(R, 10**5), lengths=torch.zeros(R, 10**5, dtype=torch.long),
)  # fmt: skip
step = T.compiled_shallow_step(fallback=False)


def one():
    global carry
    learner.decay_traces(carry["decay"])
    uniform = torch.rand(R, engine.num_placements + 1, generator=rng)
    carry = step(learner, engine, carry, uniform, pieces_tensor[torch.randint(len(piece_set), (R,), generator=rng)], k)


t0 = time.time()
for _ in range(300):
    one()
warm = time.time() - t0
blocks = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(1000):
        one()
    blocks.append((time.perf_counter() - t) / 1000)
blocks.sort()
print(f"{os.environ.get('ROUTE', root)} R={R}: warm-up {warm:.1f} s; step median {blocks[2] * 1e6:.0f} us, "
      f"min {blocks[0] * 1e6:.0f} us -> {R / blocks[2]:,.0f} placements/s")  # fmt: skip
