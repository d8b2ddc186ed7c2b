"""Why runs of one activation settle at different scores: per run of a Table 1 checkpoint, on the states its own policy
visits (softmax at its temperature, learning off), how many hidden units carry the value, how saturated they are, how
large the pre-activations are, and how greedy the policy is.

    python run_levels.py runs/<run>/td_lambda_tetris.pt [steps]       # prints the table, writes run_levels.csv here

Each run plays 4 games for `steps` placements (default 500) from empty boards, its pieces and choices drawn from a
generator seeded 123 (not the training games'); the statistics pool the states of its 4 games:
- units in use: hidden units whose output spread over the states (sd of a_k, times |w2_k|) is above 1% of the largest;
- saturated: the share of (state, unit) pairs where |da/dz| is below 1% of its largest value over the run's pairs;
- mean |z|: the hidden pre-activations' size;
- P(greedy): the softmax policy's probability of the best placement, averaged over the states;
- score: the run's mean over its final 1,000 episodes (or the last 1,000 it played).
"""

import os
import sys

import numpy as np
import torch
from scipy.stats import spearmanr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "algos"))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import td_lambda_tetris as td  # noqa: E402
from envs import exit_if_damaged, tetris  # noqa: E402

GAMES = 4


def main(ckpt_path: str, steps: int = 500):
    torch.set_num_threads(1)
    exit_if_damaged(ckpt_path)
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    n, acts = ckpt["num_runs"], ckpt["architecture"]["activation"].split("+")
    known = {k: v for k, v in ckpt["args"].items() if k in td.Args.__dataclass_fields__}
    args = td.fill_defaults(td.Args(**{**known, "resume": None}))
    height, width, piece_set = tetris.VARIANTS[tetris.ENV_VARIANTS[args.env_id]]
    engine = tetris.ColumnEngine(height, width, piece_set)
    R = n * len(acts)
    copies = torch.arange(R).repeat_interleave(GAMES)  # game g plays run g // GAMES
    G, slots = len(copies), torch.arange(len(copies))
    learner = td.ShallowTD(
        {k: v[copies].clone() for k, v in ckpt["params"].items()},
        [(a, i * n * GAMES, (i + 1) * n * GAMES) for i, a in enumerate(acts)],
    )
    tau = td.temperature(ckpt["episodes"][copies].float(), args.tau0, args.tau_k)
    rng, pieces_set = torch.Generator().manual_seed(123), torch.tensor(piece_set)
    empty_board = torch.zeros(width, dtype=torch.long)
    empty_state = td.shallow_indices(empty_board, torch.tensor(0), height)
    boards, states = empty_board.repeat(G, 1), empty_state.repeat(G, 1)
    visited, p_greedy = [], []
    with torch.no_grad():
        for _ in range(steps):
            visited.append(states)
            after = engine(boards, pieces_set[torch.randint(len(pieces_set), (G,), generator=rng)])
            cand = td.shallow_indices(after.heights, after.holes, height)
            values = learner.values(cand)[0].masked_fill(after.game_over, 0.0)
            uniform = torch.rand(G, engine.num_placements + 1, generator=rng)
            action = td.select_placement(values, tau, after.valid, uniform)
            logits = (values / tau[:, None]).masked_fill(~after.valid, float("-inf"))
            p_greedy.append(torch.softmax(logits, -1).amax(-1))
            over = after.game_over[slots, action]
            boards = torch.where(over[:, None], empty_board, after.boards[slots, action])
            states = torch.where(over[:, None], empty_state, cand[slots, action])
        z_all = learner.values(torch.stack(visited, 1))[1]  # (G, steps, H): each visited state's z, eq. 7
    p_greedy = torch.stack(p_greedy, 1)  # (G, steps)
    scores, episodes = ckpt["scores"].double(), ckpt["episodes"].clamp(max=ckpt["scores"].shape[1])
    rows = []
    for r in range(R):
        games = slice(r * GAMES, (r + 1) * GAMES)
        z = z_all[games].reshape(-1, z_all.shape[-1])  # (states, H)
        a, da = td.activation_and_derivative(acts[r // n], z)
        spread = a.std(0) * ckpt["params"]["w2"][r].abs()
        e = int(episodes[r])
        rows.append((
            acts[r // n], r % n, float(scores[r, max(e - 1000, 0) : e].mean()),
            int((spread > 0.01 * spread.max()).sum()), float((da.abs() < 0.01 * da.abs().max()).double().mean()),
            float(z.abs().mean()), float(p_greedy[games].mean()),
        ))  # fmt: skip
    header = "activation,run,score,units_in_use,saturated,mean_abs_z,p_greedy"
    rows.sort(key=lambda x: (acts.index(x[0]), x[2]))
    with open(os.path.join(HERE, "run_levels.csv"), "w") as f:
        f.write(header + "\n")
        f.writelines(f"{a},{r},{s:.3f},{u},{sat:.6f},{z:.6f},{p:.6f}\n" for a, r, s, u, sat, z, p in rows)
    print("| activation | run | score | units in use (of 50) | saturated | mean abs z | P(greedy) |")
    print("|---|---|---|---|---|---|---|")
    for a, r, s, u, sat, z, p in rows:
        print(f"| {a} | {r} | {s:.1f} | {u} | {sat:.3f} | {z:.2f} | {p:.3f} |")
    for act in acts:  # rank correlation of each statistic with the score, over the activation's runs
        x = np.array([row[2:] for row in rows if row[0] == act], dtype=float)
        rho = [spearmanr(x[:, 0], x[:, j]).statistic for j in range(1, x.shape[1])]  # ties share their mean rank
        print(f"{act}: Spearman rho with the score: units {rho[0]:+.2f}, saturated {rho[1]:+.2f}, "
              f"|z| {rho[2]:+.2f}, P(greedy) {rho[3]:+.2f}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    main(sys.argv[1], *(int(x) for x in sys.argv[2:]))
