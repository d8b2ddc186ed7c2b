"""Table 3 and Fig. 7 of Elfwing, Uchibe & Doya (2018) on a checkpoint of algos/sarsa_lambda_silu_atari.py.

§4.2, Table 3: the trained agent plays --eval-episodes episodes per selection rule without learning: softmax at the
final temperature tau(i) of the checkpoint (eq. 15), or epsilon-greedy; an action is exploratory when it is not the
greedy one. §4.1, Fig. 7: along the episodes of the first rule, the value estimate Q(s_t, a_t) against the discounted
return R_t = sum_{k=0}^{T-t} gamma^k r_{t+k} (r clipped as in training), summarised per episode by the normalised sums
(1/T) sum_t (Q(s_t, a_t) - R_t) and (1/T) sum_t |Q(s_t, a_t) - R_t|.

The environment protocol, gamma and the temperature schedule are the checkpoint's; episodes are shared evenly by
--num-envs environments seeded with --seed + 1,000,000 (+ k). Outputs in runs/{run_name}/: summary.json ("eval",
"value_analysis"), value_analysis.csv / .png, value_trajectory.csv and, with --capture-video, one mp4 per rule.

    python benchmark/sarsa_analysis.py --checkpoint runs/<run>/sarsa_lambda_silu_atari.pt --eval-episodes 100 \\
        --eval-selections softmax epsilon:0 epsilon:0.001 epsilon:0.01 epsilon:0.05
"""

import csv
import dataclasses
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "algos"))
import sarsa_lambda_silu_atari as sarsa  # noqa: E402


@dataclass
class Args:
    checkpoint: str
    """a checkpoint written by algos/sarsa_lambda_silu_atari.py --save-model"""
    eval_episodes: int = 100
    """episodes per selection rule, shared evenly by the environments"""
    eval_selections: tuple[str, ...] = ("softmax", "epsilon:0", "epsilon:0.001", "epsilon:0.01", "epsilon:0.05")
    """Table 3's rules: 'softmax' (at the checkpoint's final tau), 'softmax:TAU' or 'epsilon:EPS'; the first rule's
    episodes feed Fig. 7's value analysis"""
    num_envs: int = 1
    """environments playing the evaluation episodes"""
    seed: int = 1
    """seed of the action choices and of the emulators (env k is seeded with seed + 10**6 + k)"""
    device: str = "auto"
    """'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N'"""
    capture_video: bool = False
    """an mp4 of env 0's first episode of each rule under runs/{run_name}/videos/"""
    exp_name: str = "eval"
    """name of this analysis (part of the run name)"""


def parse_selection(rule: str, final_tau: float) -> tuple[str, float]:
    """'softmax' | 'softmax:TAU' | 'epsilon:EPS' -> ('softmax', tau) or ('epsilon', eps)."""
    kind, _, value = rule.partition(":")
    if kind == "softmax":
        return "softmax", float(value) if value else final_tau
    if kind == "epsilon" and value:
        return "epsilon", float(value)
    raise ValueError(rule)


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = sum_{k=0}^{T-t} gamma^k r_{t+k} (§4.1), r_t the (clipped) reward for a_t in s_t."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def value_estimation_errors(q_taken: np.ndarray, rewards: np.ndarray, gamma: float) -> tuple[float, float]:
    """Fig. 7's normalised sums of differences and of absolute differences: (1/T) sum_t (Q(s_t, a_t) - R_t) and
    (1/T) sum_t |Q(s_t, a_t) - R_t|."""
    diff = np.asarray(q_taken) - discounted_returns(np.asarray(rewards, dtype=np.float64), gamma)
    return float(diff.mean()), float(np.abs(diff).mean())


def validate(args: Args) -> str | None:
    """One clear line for each impossible setting, checked before anything is written."""
    if args.eval_episodes < 1 or args.num_envs < 1:
        return "--eval-episodes and --num-envs must be at least 1"
    for rule in args.eval_selections:
        try:
            kind, value = parse_selection(rule, 1.0)
        except ValueError:
            return f"bad --eval-selections entry {rule!r}; use 'softmax', 'softmax:TAU' or 'epsilon:EPS'"
        if (kind == "epsilon" and not 0 <= value <= 1) or (kind == "softmax" and value <= 0):
            return f"bad --eval-selections entry {rule!r}: epsilon must lie in [0, 1] and tau be positive"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto"
    if args.capture_video and importlib.util.find_spec("moviepy") is None:
        return "--capture-video needs moviepy; `pip install moviepy` or drop the flag"
    return None


@torch.no_grad()
def evaluate(train: sarsa.Args, rom, base, params, kind, x, device, episodes, collect=False, video=None):
    """Play `episodes` episodes (shared evenly by the environments) without learning, with softmax at tau = x or
    epsilon-greedy with epsilon = x. Returns Table 3's mean score and exploratory actions per episode, and with
    `collect` every episode's Q(s_t, a_t) and clipped rewards for the value analysis (§4.1)."""
    N = train.num_envs
    quota = np.array([episodes // N + (k < episodes % N) for k in range(N)])
    envs = sarsa.make_env(train, rom)
    obs_np, info = envs.reset(seed=train.seed + 1_000_000)
    tracker = sarsa.EpisodeTracker(N, info)
    rng = torch.Generator(device=device).manual_seed(train.seed + 1_000_000)
    done = np.zeros(N, dtype=np.int64)
    explore = np.zeros(N)
    trajectories = [([], []) for _ in range(N)]
    scores, explored, lengths, value_episodes = [], [], [], []
    frames = [obs_np[0, -1]] if video else None
    while (done < quota).any():
        q = sarsa.q_values(base, params, torch.from_numpy(obs_np).to(device))
        actions, exploratory = sarsa.select_actions(q, rng, **({"tau": x} if kind == "softmax" else {"epsilon": x}))
        obs_np, rewards, terminated, truncated, info = envs.step(actions.cpu().numpy().astype(np.int32))
        learn, _, finished = tracker.step(rewards, terminated, truncated, info)
        explore += exploratory.cpu().numpy() & learn
        if collect:
            q_taken = q.gather(1, actions[:, None])[:, 0].cpu().numpy()
            clipped = np.clip(rewards, -1, 1) if train.clip_rewards else rewards
            for k in np.flatnonzero(learn):
                trajectories[k][0].append(float(q_taken[k]))
                trajectories[k][1].append(float(clipped[k]))
        if frames is not None:
            frames.append(obs_np[0, -1].copy())
        for k, score, length in finished:
            if done[k] < quota[k]:
                scores.append(score)
                explored.append(explore[k])
                lengths.append(length)
                if collect:
                    value_episodes.append({"score": score, "q": trajectories[k][0], "rewards": trajectories[k][1]})
            if k == 0 and frames is not None:
                sarsa.write_video(video, frames)
                frames = None
            done[k] += 1
            explore[k] = 0
            trajectories[k] = ([], [])
    envs.close()
    result = {
        "selection": kind,
        "tau" if kind == "softmax" else "epsilon": x,
        "episodes": len(scores),
        "mean_score": float(np.mean(scores)),
        "std_score": float(np.std(scores)),
        "mean_length": float(np.mean(lengths)),
        "exploratory_actions_per_episode": float(np.mean(explored)),
        "dqn_normalized": sarsa.dqn_normalized(float(np.mean(scores)), sarsa.atari.camel_name(rom)),
        "episode_scores": scores,  # in the order the episodes ended
        "episode_lengths": lengths,
    }
    return result, value_episodes


def write_value_analysis(run_dir: str, episodes: list[dict], gamma: float) -> dict:
    """§4.1 / Fig. 7: per episode the normalised sums of (Q(s_t, a_t) - R_t) and |Q(s_t, a_t) - R_t|
    (value_analysis.csv), and Q(s_t, a_t) against R_t along the highest-scoring episode (value_trajectory.csv and
    value_analysis.png)."""
    rows = []
    for i, ep in enumerate(episodes):
        diff, abs_diff = value_estimation_errors(ep["q"], ep["rewards"], gamma)
        rows.append((i, len(ep["q"]), ep["score"], diff, abs_diff))
    with open(os.path.join(run_dir, "value_analysis.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["episode", "T", "score", "normalised_sum_diff", "normalised_sum_abs_diff"])
        w.writerows(rows)
    best = max(range(len(episodes)), key=lambda i: episodes[i]["score"])
    q, returns = np.asarray(episodes[best]["q"]), discounted_returns(np.asarray(episodes[best]["rewards"]), gamma)
    with open(os.path.join(run_dir, "value_trajectory.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "q_taken", "discounted_return"])
        w.writerows((t, f"{a:.5f}", f"{b:.5f}") for t, (a, b) in enumerate(zip(q, returns, strict=True)))
    from matplotlib.figure import Figure

    T = np.array([r[1] for r in rows], dtype=float)
    d = np.array([r[3] for r in rows])
    fig = Figure(figsize=(12, 4.5), layout="tight")
    left, right = fig.subplots(1, 2)
    left.plot(q, lw=0.8, label="Q(s_t, a_t)")
    left.plot(returns, lw=0.8, label="R_t")
    left.set_xlabel("t (agent steps)")
    left.set_title(f"highest-scoring episode: score {episodes[best]['score']:g}, T = {len(q)}")
    left.legend()
    right.scatter(T, d, s=8)
    right.axhline(0, color="gray", lw=0.5)
    right.set_xlabel("episode length T")
    right.set_ylabel("(1/T) sum (Q(s_t, a_t) - R_t)")
    fig.savefig(os.path.join(run_dir, "value_analysis.png"), dpi=110)
    return {
        "episodes": len(rows),
        "mean_normalised_sum_diff": float(d.mean()),
        "mean_normalised_sum_abs_diff": float(np.mean([r[4] for r in rows])),
        "plotted_episode": {"score": rows[best][2], "T": rows[best][1], "diff": rows[best][3], "abs": rows[best][4]},
    }


def agent(ckpt: dict, num_envs: int, seed: int, device: str):
    """The checkpoint's agent: its training Args (protocol, gamma, temperature schedule) with this analysis's
    environments, seed and device, the network's structure and parameters, and its final temperature tau(i)."""
    known = {f.name for f in dataclasses.fields(sarsa.Args)}
    train = sarsa.Args(**{k: v for k, v in ckpt["args"].items() if k in known})
    train = dataclasses.replace(train, num_envs=num_envs, seed=seed, device=device)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    arch = ckpt["architecture"]
    net = sarsa.SarsaQNetwork(arch["num_actions"], arch["activations"], arch["padding"])
    theta, params = sarsa.flatten_parameters(net, device)
    theta.copy_(ckpt["theta"].to(device))
    base = net.to("meta")  # structure only; functional_call supplies theta's views
    return train, device, base, params, sarsa.temperature(ckpt["episodes"], train.tau0, train.tau_k)


def main(args: Args) -> dict:
    error = validate(args)
    try:
        ckpt = sarsa.load_checkpoint(args.checkpoint, flag="--checkpoint") if error is None else None
    except ValueError as err:
        error = str(err)
    if error:
        raise SystemExit(f"error: {error}")
    train, device, base, params, final_tau = agent(ckpt, args.num_envs, args.seed, args.device)
    arch = ckpt["architecture"]
    game = sarsa.atari.camel_name(arch["game"])

    run_name = base_name = f"{game}__{args.exp_name}__{arch['activations']}__{args.seed}__{int(time.time())}"
    for attempt in range(2, 10**6):  # an analysis started in the same second gets its own directory
        if not os.path.exists(os.path.join("runs", run_name)):
            break
        run_name = f"{base_name}-{attempt}"
    run_dir = os.path.join("runs", run_name)
    os.makedirs(os.path.join(run_dir, "videos") if args.capture_video else run_dir)
    print(f"{run_name}: {args.checkpoint} at episode {ckpt['episodes']:,}, tau {final_tau:.4g}, {args.num_envs} env(s)")
    summary = {"args": asdict(train), "analysis_args": asdict(args), "run_name": run_name, "game": game,
               "checkpoint": args.checkpoint, "episodes": ckpt["episodes"], "global_step": ckpt["global_step"],
               "final_temperature": final_tau, "eval": {}}  # fmt: skip
    for k, rule in enumerate(args.eval_selections):
        kind, x = parse_selection(rule, final_tau)
        video = os.path.join(run_dir, "videos", f"eval-{kind}-{x:g}.mp4") if args.capture_video else None
        result, value_episodes = evaluate(train, arch["game"], base, params, kind, x, device, args.eval_episodes,
                                          collect=k == 0, video=video)  # fmt: skip
        summary["eval"][f"{kind}:{x:g}"] = result
        print(f"eval {kind} {x:g}: mean score {result['mean_score']:.1f} over {result['episodes']} episodes, "
              f"{result['exploratory_actions_per_episode']:.2f} exploratory actions per episode")  # fmt: skip
        if value_episodes:
            summary["value_analysis"] = write_value_analysis(run_dir, value_episodes, train.gamma)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
