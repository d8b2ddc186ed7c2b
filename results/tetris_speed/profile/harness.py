"""Time and profile the shallow TD(lambda) step of algos/td_lambda_tetris.py outside `main`, the way `main` calls it
(results/tetris_speed/README.md, "Where a 10-run compiled step goes"). It calls the script's internals as they were
at commit 944a914 (T.VARIANTS, StepConstants, ...), which later commits changed, so run that commit's copy:

    git worktree add /tmp/td_944a914 944a914
    H=/tmp/td_944a914/results/tetris_speed/profile_2026-11-24/harness.py
    .venv/bin/python $H --runs 10 --compile --profile
    .venv/bin/python $H --runs 10 --compile --skip-guards
    .venv/bin/python $H --runs 10 --compile --cpp-wrapper
    .venv/bin/python $H --runs 10 --unroll 4   # the tried 4-step graph

The set-up (dSiLU, 50 hidden units, SZ-Tetris, the paper's constants) mirrors `main`'s. --unroll K compiles K steps as
one graph and folds the traces ahead for K steps of decay. It only measures speed: an episode start inside the block
is not handled exactly, so its games are not the script's.
"""

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "algos")]
import td_lambda_tetris as T  # noqa: E402
from envs.tetris import ColumnEngine, binary_feature_length  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--runs", type=int, default=10)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--compile", action="store_true", help="the script's two graphs (compiled_shallow_step)")
parser.add_argument("--cpp-wrapper", action="store_true", help="with --compile: inductor's C++ wrapper")
parser.add_argument("--skip-guards", action="store_true", help="with --compile: skip_guard_eval_unsafe after warm-up")
parser.add_argument("--unroll", type=int, default=0, help="K > 0: K steps per compiled graph")
parser.add_argument("--profile", action="store_true", help="torch.profiler table, with inductor's kernel profile")
cli = parser.parse_args()
torch.set_num_threads(cli.threads)
R = cli.runs
height, width, piece_set = T.VARIANTS["sz"]
engine = ColumnEngine(height, width, piece_set)
P = engine.num_placements
pieces_tensor = torch.tensor(piece_set)
rng = torch.Generator().manual_seed(1)
learner = T.ShallowTD(T.init_shallow(R, binary_feature_length(height, width), 50, 1, "cpu"), [("dsilu", 0, R)])
empty_board = torch.zeros(width, dtype=torch.long)
empty_state = T.shallow_indices(empty_board, empty_board.sum(), height)
episodes = torch.zeros(R, dtype=torch.long)
target = torch.full_like(episodes, 10**6)
encoding = T._bias_encoding_table(height, width, "cpu")
k = T.StepConstants(0.99, 0.001, 0.99 * 0.55, 0.5, 0.00025, 33.3, "current", empty_board, empty_state, target, encoding)
carry = dict(
    boards=empty_board.expand(R, width).clone(),
    states=empty_state.expand(R, *empty_state.shape).clone(),
    pieces=pieces_tensor[torch.randint(len(piece_set), (R,), generator=rng)],
    holes_now=torch.zeros(R, dtype=torch.long),
    decay=torch.zeros(R),
    score=torch.zeros(R),
    length=torch.zeros(R, dtype=torch.long),
    active=episodes < target,
    placements=torch.zeros((), dtype=torch.long),
    abs_td_sum=torch.zeros(R),
    episodes=episodes,
    scores=torch.zeros(R, 10**5),
    lengths=torch.zeros(R, 10**5, dtype=torch.long),
)
options = {"cpp_wrapper": True} if cli.cpp_wrapper else {}
if cli.profile:
    options["cpp.enable_kernel_profile"] = True


def new_pieces():
    return pieces_tensor[torch.randint(len(piece_set), (R,), generator=rng)]


if cli.unroll:
    torch.set_flush_denormal(True)

    def block(learner, engine, s, uniforms, pieces, k):
        for j in range(cli.unroll):
            s = T.shallow_step(learner, engine, s, uniforms[j], pieces[j], k)
        return s

    compiled_block = torch.compile(block, fullgraph=True, dynamic=False, options={"cpp.simdlen": 1, **options})

    def train_step(s):
        learner.decay_traces(torch.full_like(s["decay"], 0.5445**cli.unroll))  # fold ahead for the whole block
        uniforms = torch.stack([torch.rand(R, P + 1, generator=rng) for _ in range(cli.unroll)])
        pieces = torch.stack([new_pieces() for _ in range(cli.unroll)])
        return compiled_block(learner, engine, s, uniforms, pieces, k)
else:
    if cli.compile:
        afterstates = torch.compile(
            T.shallow_afterstates, fullgraph=True, dynamic=False, options={"cpp.simdlen": 1, **options}
        )
        learn = torch.compile(T.shallow_learn, fullgraph=True, dynamic=False, options=options or None)

        def step_fn(learner, engine, s, uniform, next_pieces, k):
            after, cand_states = afterstates(engine, s, k)
            return learn(learner, engine, s, after, cand_states, uniform, next_pieces, k)
    else:
        step_fn = T.shallow_step

    def train_step(s):
        learner.decay_traces(s["decay"])
        return step_fn(learner, engine, s, torch.rand(R, P + 1, generator=rng), new_pieces(), k)


t0 = time.time()
for _ in range(300):
    carry = train_step(carry)
print(f"warm-up (compilation included): {time.time() - t0:.1f} s", flush=True)
if cli.skip_guards:
    torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


def timeit(name, fn, n=3000):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    seconds = (time.perf_counter() - start) / n
    print(f"{name}: {seconds * 1e6:.1f} us", flush=True)
    return seconds


def full():
    global carry
    carry = train_step(carry)


seconds = timeit("one call of the loop's step" + (f" ({cli.unroll} steps)" if cli.unroll else ""), full)
print(f"  -> {R * max(cli.unroll, 1) / seconds:,.0f} placements/s")
timeit("drawing the uniforms and the pieces", lambda: (torch.rand(R, P + 1, generator=rng), new_pieces()))
timeit("the eager trace fold (decay_traces)", lambda: learner.decay_traces(carry["decay"]))
if cli.profile:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(500):
            full()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
