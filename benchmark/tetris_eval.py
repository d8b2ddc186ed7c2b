"""Table 3 and Fig. 6 of Elfwing, Uchibe & Doya (2018): a trained td_lambda_tetris.py checkpoint played without
learning, under softmax at the final temperature and epsilon-greedy selection (mean score and exploratory actions per
episode, §4.2), and V(s_t) against the discounted return R_t along the episodes (§4.1).

    python benchmark/tetris_eval.py --checkpoint runs/<run>/td_lambda_tetris.pt --activation dsilu --run best

Writes summary.json (per rule: mean score, per-run means, exploratory actions per episode), value_analysis.csv and
value_analysis.png to --out (refused if it holds a summary.json already). Each run plays 64 / (runs evaluated) games
at once on its own copies of theta; the games use their own generator (--seed + 10,000), never the training games'.
"""

import csv
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos"))
import td_lambda_tetris as td  # noqa: E402
from envs import exit_if_damaged, tetris  # noqa: E402

EVAL_GAMES = 64  # games played at once, split over the evaluated runs (one run alone plays 64)


@dataclass
class Args:
    checkpoint: str
    """a td_lambda_tetris.py checkpoint (--save-model)"""
    activation: str | None = None
    """which activation's runs of a checkpoint that trained several (Table 1's process); default: its only one"""
    run: str = "best"
    """'best' (the highest final mean score: the paper's "best dSiLU network agent"), 'all' or a run index"""
    episodes: int = 1000
    """episodes per evaluated run and selection rule"""
    selections: tuple[str, ...] = ("softmax", "epsilon:0", "epsilon:0.001", "epsilon:0.01", "epsilon:0.05")
    """Table 3's rules: 'softmax' (at the final temperature), 'softmax:TAU' or 'epsilon:EPS'"""
    value_analysis_episodes: int = 1000
    """episodes of the first rule kept for Fig. 6's V(s_t) against R_t (0: none)"""
    seed: int = 1
    """the games' generator is seeded with seed + 10,000"""
    device: str = "auto"
    """'auto', 'cpu' or 'cuda'"""
    out: str | None = None
    """output folder (default: runs/<checkpoint's run>__eval__<time>)"""


def parse_selection(rule: str, final_tau: float) -> tuple[str, float]:
    """'softmax' | 'softmax:TAU' | 'epsilon:EPS' -> ('softmax', tau) or ('epsilon', eps)."""
    kind, _, value = rule.partition(":")
    if kind == "softmax":
        return "softmax", float(value) if value else final_tau
    if kind == "epsilon" and value:
        return "epsilon", float(value)
    raise ValueError(rule)


def select(values, tau, valid, uniform, kind: str, x: float):
    """Softmax (td.select_placement at tau) or epsilon-greedy: uniform[:, P] < epsilon explores, uniformly among the
    valid placements by uniform[:, :P]. An action is exploratory when it is not the greedy one (Table 3)."""
    P = values.shape[-1]
    greedy = values.masked_fill(~valid, float("-inf")).argmax(-1)
    if kind == "softmax":
        action = td.select_placement(values, tau, valid, uniform)
    else:
        action = torch.where(uniform[:, P] < x, uniform[:, :P].masked_fill(~valid, -1.0).argmax(-1), greedy)
    return action, action != greedy


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = sum_{k>=0} gamma^k r_{t+1+k} (§4.1), the return following state s_t."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def evaluate(
    args, engine, encode, value, kind, x, R, device, empty_board, empty_state, pieces_tensor, collect_values=0, games=1
):  # fmt: skip
    """Play args.eval_episodes episodes per run without learning, with softmax at tau = x or epsilon-greedy with
    epsilon = x. Returns mean score and exploratory actions per episode (Table 3); records V(s_t) and the reward of
    delta_t along each run's first ceil(collect_values / R) complete episodes for the value analysis (§4.1).

    Each run plays `games` games at once (`value` holds `games` copies of each run's theta, run-major), each game a
    fixed number of complete episodes, ceil(eval_episodes / games); a run's episodes are its games' episodes in
    order, cut at eval_episodes. Whole episodes by index, never the first to finish, so neither the scores nor the
    value-analysis sample favour the short episodes that finish first."""
    G = R * games  # games in parallel; game g belongs to run g // games
    per_game = -(-args.eval_episodes // games)
    rng = torch.Generator(device=device).manual_seed(args.seed + 10_000)
    slots = torch.arange(G, device=device)
    boards = empty_board.expand(G, *empty_board.shape).clone()
    states = empty_state.expand(G, *empty_state.shape).clone()
    pieces = pieces_tensor[torch.randint(len(pieces_tensor), (G,), generator=rng, device=device)]
    tau = torch.full((G,), x if kind == "softmax" else 1.0, device=device)
    score = torch.zeros(G, device=device)
    length = torch.zeros(G, dtype=torch.long, device=device)  # placements in the current episode
    explore = torch.zeros(G, device=device)
    done = np.zeros(G, dtype=np.int64)
    game_score, game_explore, game_length = [[] for _ in range(G)], [[] for _ in range(G)], [[] for _ in range(G)]
    traj = [([], []) for _ in range(G)]
    value_episodes = []
    quota = min(-(-collect_values // R), args.eval_episodes)  # value-analysis episodes per run
    quota_per_game = -(-quota // games)
    holes_now = torch.zeros(G, dtype=torch.long, device=device)
    while done.min() < per_game:
        v_t = value(states[:, None])[:, 0] if collect_values else None
        after = engine(boards, pieces)
        cand_states = encode(after)
        v_cand = value(cand_states).masked_fill(after.game_over, 0.0)
        uniform = torch.rand(G, engine.num_placements + 1, generator=rng, device=device)
        action, exploratory = select(v_cand, tau, after.valid, uniform, kind, x)
        game_over = after.game_over[slots, action]
        score += after.rows_cleared[slots, action]
        length += 1
        explore += exploratory
        holes_next = after.holes[slots, action]
        if collect_values:
            reward = td.td_reward(holes_next, game_over, holes_now, args.holes_scale, args.reward_timing)
            v_np, reward_np = v_t.cpu().numpy(), reward.cpu().numpy()
            for g in np.flatnonzero(done < quota_per_game):
                traj[g][0].append(float(v_np[g]))
                traj[g][1].append(float(reward_np[g]))
        go = game_over.cpu().numpy()
        for g in np.flatnonzero(go):
            if done[g] < per_game:
                game_score[g].append(float(score[g]))
                game_length[g].append(int(length[g]))
                game_explore[g].append(float(explore[g]))
                if done[g] < quota_per_game:
                    value_episodes.append((g // games, g, int(done[g]), traj[g][0], traj[g][1]))
            done[g] += 1
            traj[g] = ([], [])
        over = game_over.view(-1, *[1] * (boards.dim() - 1))
        boards = torch.where(over, empty_board, after.boards[slots, action])
        states = torch.where(game_over.view(-1, *[1] * (states.dim() - 1)), empty_state, cand_states[slots, action])
        holes_now = holes_next.masked_fill(game_over, 0)
        score.masked_fill_(game_over, 0)
        length.masked_fill_(game_over, 0)
        explore.masked_fill_(game_over, 0)
        pieces = pieces_tensor[torch.randint(len(pieces_tensor), (G,), generator=rng, device=device)]

    def by_run(per_game_lists, r):  # run r's episodes: its games' episodes in order, cut at eval_episodes
        return [v for g in range(r * games, (r + 1) * games) for v in per_game_lists[g]][: args.eval_episodes]

    per_run = [float(np.mean(by_run(game_score, r))) for r in range(R)]
    # the value-analysis sample: each run's first `quota` episodes in the same order (game, then episode)
    kept, taken = [], np.zeros(R, dtype=np.int64)
    for run, _, _, values, rewards in sorted(value_episodes, key=lambda e: e[:3]):
        if taken[run] < quota:
            kept.append((int(run), values, rewards))
            taken[run] += 1
    return {
        "episodes": int(args.eval_episodes * R),
        "mean_score": float(np.mean(per_run)),
        "mean_score_per_run": per_run,
        "exploratory_actions_per_episode": float(np.mean([np.mean(by_run(game_explore, r)) for r in range(R)])),
        "value_episodes": kept,
        "episode_scores": [by_run(game_score, r) for r in range(R)],  # per run, its episodes in order
        "episode_lengths": [by_run(game_length, r) for r in range(R)],  # placements
    }


def write_value_analysis(run_dir, episodes, gamma):
    """§4.1 / Fig. 6: V(s_t) against R_t along episodes, and (1/T) sum_t (V(s_t) - R_t) per episode."""
    rows = []
    for run, values, rewards in episodes:
        returns = discounted_returns(np.asarray(rewards), gamma)
        diff = np.asarray(values) - returns
        rows.append((run, len(values), diff.mean(), np.abs(diff).mean()))
    with open(os.path.join(run_dir, "value_analysis.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "T", "normalised_sum_diff", "normalised_sum_abs_diff"])
        w.writerows(rows)
    T = np.array([r[1] for r in rows], dtype=float)
    d = np.array([r[2] for r in rows])
    fit = np.polyfit(T, d, 1) if len(rows) > 1 and T.std() > 0 else np.array([0.0, d.mean() if len(d) else 0.0])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    order = np.argsort(T)
    for label, i in (("short", order[len(order) // 10]), ("medium", order[len(order) // 2]), ("long", order[-1])):
        run, values, rewards = episodes[i]
        t = np.arange(1, len(values) + 1)
        (line,) = left.plot(t, values, lw=1, label=f"V(s_t), {label} (T={len(values)})")
        left.plot(t, discounted_returns(np.asarray(rewards), gamma), "--", lw=1, color=line.get_color(), label="R_t")
    left.set_xlabel("t")
    left.set_ylabel("value")
    left.legend(fontsize=7)
    right.scatter(T, d, s=4, alpha=0.5)
    xs = np.linspace(T.min(), T.max(), 2)
    right.plot(xs, np.polyval(fit, xs), "r-", label=f"fit {fit[0]:.4f} T + {fit[1]:.2f}")
    right.set_xlabel("episode length T")
    right.set_ylabel("(1/T) sum (V(s_t) - R_t)")
    right.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "value_analysis.png"), dpi=110)
    plt.close(fig)
    return {
        "episodes": len(rows),
        "mean_T": float(T.mean()),
        "fit_slope": float(fit[0]),
        "fit_intercept": float(fit[1]),
        "mean_normalised_sum_diff": float(d.mean()),
        "fit_at_mean_T": float(np.polyval(fit, T.mean())),
    }


def load(cli: Args):
    """The checkpoint's runs of --activation, its training Args, and the runs --run picks; one line if impossible."""
    exit_if_damaged(cli.checkpoint, "--checkpoint ")
    try:
        ckpt = torch.load(cli.checkpoint, map_location="cpu", weights_only=True)
        trained = ckpt["architecture"]["activation"].split("+")
        assert ckpt["format"] == td.CHECKPOINT_FORMAT
    except Exception as err:  # noqa: BLE001  (missing, unreadable or not a td_lambda_tetris checkpoint)
        raise SystemExit(
            f"error: --checkpoint {cli.checkpoint!r} is not a td_lambda_tetris checkpoint ({err})"
        ) from None
    act = cli.activation or trained[0]
    if act not in trained or (cli.activation is None and len(trained) > 1):
        raise SystemExit(
            f"error: --checkpoint holds the activations {' '.join(trained)}: pass --activation one of them"
        )
    n, k = ckpt["num_runs"], trained.index(act)
    rows = slice(k * n, (k + 1) * n)
    params = {name: v[rows] for name, v in ckpt["params"].items()}
    episodes, scores = ckpt["episodes"][rows], ckpt["scores"][rows]
    known = {k: v for k, v in ckpt["args"].items() if k in td.Args.__dataclass_fields__}  # older flags dropped
    known.setdefault("reward_timing", "next")  # checkpoints from before the flag trained with 'next' (load_checkpoint)
    args = td.fill_defaults(td.Args(**{**known, "activation": (act,), "resume": None}))
    if cli.run == "best":
        if int(episodes.min()) == 0:
            raise SystemExit("error: --run best needs trained runs (a checkpoint with finished episodes)")
        ids = [td.score_summary(scores.numpy(), episodes.numpy(), args.final_window)["final_score_best_run_index"]]
    elif cli.run == "all" or (cli.run.isdigit() and int(cli.run) < n):
        ids = list(range(n)) if cli.run == "all" else [int(cli.run)]
    else:
        raise SystemExit(f"error: --run must be 'best', 'all' or a run index below {n}, got {cli.run!r}")
    return args, params, episodes, ids


def validate(cli: Args):
    """One line (SystemExit) for any impossible option, before the checkpoint is read."""
    for rule in cli.selections:
        try:
            kind, value = parse_selection(rule, 1.0)
        except ValueError:
            raise SystemExit(f"error: bad --selections {rule!r}; use softmax, softmax:TAU or epsilon:EPS") from None
        if (kind == "epsilon" and not 0 <= value <= 1) or (kind == "softmax" and value <= 0):
            raise SystemExit(f"error: bad --selections {rule!r}: epsilon must lie in [0, 1] and tau be positive")
    if cli.episodes < 1:
        raise SystemExit("error: --episodes must be at least 1")
    if cli.value_analysis_episodes < 0:
        raise SystemExit("error: --value-analysis-episodes must be 0 (none) or more")
    if cli.device != "auto" and cli.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {cli.device} asked for CUDA but torch sees no GPU; use --device cpu or auto")


def play(cli: Args, out: str | None) -> dict:
    """Every rule of --selections on the checkpoint's runs; the value analysis's files go to `out` (needed only with
    --value-analysis-episodes). Returns the summary; per rule, each run's episode scores and lengths too."""
    args, params, episodes, ids = load(cli)
    args.seed = cli.seed
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cli.device == "auto" else cli.device)
    args.eval_episodes = cli.episodes
    height, width, piece_set = tetris.VARIANTS[tetris.ENV_VARIANTS[args.env_id]]
    shallow = args.network == "shallow"
    engine = (tetris.ColumnEngine if shallow else tetris.AfterstateEngine)(height, width, piece_set, device=device)
    games = max(1, EVAL_GAMES // len(ids))  # parallel games per evaluated run, each on its own copy of theta
    copies = torch.tensor(ids).repeat_interleave(games)
    theta = {k: v[copies].clone().to(device) for k, v in params.items()}
    if shallow:
        learner = td.ShallowTD(theta, [(args.activation[0], 0, len(copies))])
        empty_board = torch.zeros(width, dtype=torch.long, device=device)
        empty_state = td.shallow_indices(empty_board, empty_board.sum(), height)

        def encode(after):
            return td.shallow_indices(after.heights, after.holes, height)

        def value(states):
            return learner.values(states)[0]
    else:
        _, base = td.init_deep(1, height, width, args.activation[0], 0, "cpu")
        empty_board = empty_state = torch.zeros(height, width, dtype=torch.uint8, device=device)

        def encode(after):
            return after.boards

        def value(states):
            return td.deep_value(theta, states, base)

    final_tau = float(td.temperature(episodes[ids].float(), args.tau0, args.tau_k).mean())
    summary = {"checkpoint": cli.checkpoint, "activation": args.activation[0], "eval_runs": ids, "eval": {}}
    summary["final_temperature"] = final_tau
    pieces_tensor = torch.tensor(piece_set, device=device)
    for k, rule in enumerate(cli.selections):
        kind, x = parse_selection(rule, final_tau)
        collect = (k == 0) * cli.value_analysis_episodes
        result = evaluate(args, engine, encode, value, kind, x, len(ids), device, empty_board, empty_state,
                          pieces_tensor, collect_values=collect, games=games)  # fmt: skip
        value_episodes = result.pop("value_episodes")
        if value_episodes:
            summary["value_analysis"] = write_value_analysis(out, value_episodes, args.gamma)
        summary["eval"][f"{kind}:{x:g}"] = result
        print(
            f"eval {kind} {x:g} (run(s) {', '.join(map(str, ids))}): mean score {result['mean_score']:.2f} over "
            f"{result['episodes']} episodes, {result['exploratory_actions_per_episode']:.2f} exploratory actions "
            "per episode",
            flush=True,
        )
    return summary


def main(cli: Args) -> dict:
    validate(cli)
    if cli.out and os.path.exists(os.path.join(cli.out, "summary.json")):  # never a new evaluation over an old one
        raise SystemExit(f"error: --out {cli.out} already holds an evaluation (summary.json): choose another --out or "
                         "remove it")  # fmt: skip
    out = cli.out or os.path.join(
        "runs", f"{os.path.basename(os.path.dirname(os.path.abspath(cli.checkpoint)))}__eval__{int(time.time())}"
    )
    os.makedirs(out, exist_ok=True)
    summary = play(cli, out)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"wrote {out}/summary.json")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
