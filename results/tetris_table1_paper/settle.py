"""Table 1's four shallow rows over every run of this folder, and the tests that decide the paper's ordering.

    python settle.py state.npz state_runs11_20.npz state_runs21_30.npz   # at 200,000 episodes: table, tests, Fig. 2
    python settle.py state.npz runs/<A>/td_lambda_tetris.pt runs/<B>/td_lambda_tetris.pt --at 100000   # a milestone

Each input is a packed state (milestone.py pack) or a td_lambda_tetris.py checkpoint of a batched process; a run's
score at episode `at` is its mean over episodes at-1000 .. at-1, and the runs of one activation are pooled over the
inputs. The tests were fixed before runs 11-30 passed 50,000 episodes (README, "The tests") and are not to change:

  - per activation: n, mean, median and sd over the run means, and a 95% percentile bootstrap CI of the mean over
    runs (10,000 resamples of the runs, seed 0);
  - five comparisons: dSiLU against each other activation, and the paper's neighbouring pairs (dSiLU-sigmoid,
    sigmoid-SiLU, SiLU-ReLU); for each, Welch's z over the run means and a two-sided permutation test of the
    difference of the mean run means (100,000 random relabellings of the runs, seed 0, p = (1 + hits) / (1 + 100,000));
  - the five permutation p values adjusted by Holm's step-down method (family-wise error 0.05);
  - verdict: "settled" where the adjusted p < 0.05 (the direction, the paper's or reversed, stated with it), otherwise
    "not settled at N runs".

Writes table1.json (every number printed), learning_curves.csv and learning_curves.png (Fig. 2: each activation's
mean over its runs, and every run) to --out (default: this folder).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from envs import exit_if_damaged  # noqa: E402

BLOCK = 1000
ORDER = ("dsilu", "sigmoid", "silu", "relu")  # the paper's ordering (Table 1)
PAPER = {"dsilu": (263, 80, 320, 87), "sigmoid": (232, 75, 293, 73), "silu": (214, 74, 253, 83),
         "relu": (191, 58, 227, 76)}  # final mean ± sd, best run ± sd (Table 1)  # fmt: skip
COMPARISONS = (("dsilu", "sigmoid"), ("dsilu", "silu"), ("dsilu", "relu"), ("sigmoid", "silu"), ("silu", "relu"))
ALPHA, RESAMPLES, PERMUTATIONS = 0.05, 10_000, 100_000


def blocks(path: str) -> tuple[list[str], np.ndarray, np.ndarray, int, int]:
    """(activation of each run, score sum and square sum per run and complete 1,000-episode block, first seed, runs
    per activation) from a pack or a checkpoint."""
    exit_if_damaged(path)
    if path.endswith(".npz"):
        z = np.load(path)
        meta = json.loads(str(z["meta"]))
        episodes, start, sums = z["episodes"], z["tail_start"], z["block_sums"]
        n_blocks = int(episodes.min()) // BLOCK
        s, s2 = np.full((len(episodes), n_blocks), np.nan), np.full((len(episodes), n_blocks), np.nan)
        for r in range(len(episodes)):
            b = int(start[r]) // BLOCK
            tail = z["tail_scores"][r, : episodes[r] - start[r]].astype(np.float64)
            tail = tail[: max(n_blocks - b, 0) * BLOCK].reshape(-1, BLOCK)  # a fast run's sums may cover them all
            s[r] = np.concatenate([sums[0, r, :b], tail.sum(1)])[:n_blocks]
            s2[r] = np.concatenate([sums[1, r, :b], (tail**2).sum(1)])[:n_blocks]
    else:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        meta = {k: ckpt[k] for k in ("architecture", "num_runs", "args")}
        n_blocks = int(ckpt["episodes"].min()) // BLOCK
        scores = ckpt["scores"][:, : n_blocks * BLOCK].double().numpy().reshape(len(ckpt["episodes"]), n_blocks, BLOCK)
        s, s2 = scores.sum(2), (scores**2).sum(2)
    acts, n = meta["architecture"]["activation"].split("+"), meta["num_runs"]
    return [a for a in acts for _ in range(n)], s, s2, meta["args"]["seed"], n


def welch_z(x: np.ndarray, y: np.ndarray) -> float:
    return (x.mean() - y.mean()) / np.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))


def permutation_p(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> float:
    """Two-sided: the share of random relabellings of the pooled runs whose |difference of means| is at least ours."""
    pooled, observed = np.concatenate([x, y]), abs(x.mean() - y.mean())
    hits = 0
    for chunk in np.array_split(np.arange(PERMUTATIONS), 10):
        idx = rng.permuted(np.broadcast_to(np.arange(len(pooled)), (len(chunk), len(pooled))), axis=1)
        d = pooled[idx[:, : len(x)]].mean(1) - pooled[idx[:, len(x) :]].mean(1)
        hits += int((np.abs(d) >= observed - 1e-12).sum())
    return (1 + hits) / (1 + PERMUTATIONS)


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjustment: the k-th smallest p times (m - k + 1), made monotone, capped at 1."""
    order, adjusted, running = np.argsort(p), [0.0] * len(p), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - k) * p[i]))
        adjusted[i] = running
    return adjusted


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", help="packed states (.npz) or checkpoints (.pt)")
    parser.add_argument("--at", type=int, default=200_000, help="the episode the scores are taken at")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="where the outputs go")
    cli = parser.parse_args()
    if cli.at % BLOCK:
        raise SystemExit(f"error: --at must be a multiple of {BLOCK:,}")
    run_act, curve_sums, square_sums, sources = [], [], [], []
    for path in cli.inputs:
        acts, s, s2, seed, n = blocks(path)
        if s.shape[1] < cli.at // BLOCK:
            raise SystemExit(f"error: the slowest run of {path} has {s.shape[1] * BLOCK:,} episodes < --at {cli.at:,}")
        run_act += acts
        curve_sums.append(s[:, : cli.at // BLOCK])
        square_sums.append(s2[:, cli.at // BLOCK - 1])
        sources.append(f"{os.path.basename(path)}: network inits {seed}-{seed + n - 1}, --seed {seed}")
    run_act, curve = np.array(run_act), np.concatenate(curve_sums) / BLOCK  # mean score per run and block
    final, final_sq = curve[:, -1], np.concatenate(square_sums) / BLOCK
    flat = (final != 0) & np.isclose(final_sq, final**2, rtol=1e-9, atol=0)  # every episode the same nonzero score
    rng = np.random.default_rng(0)
    rows, means = {}, {}
    for act in ORDER:
        x = means[act] = final[run_act == act]
        boot = x[rng.integers(0, len(x), (RESAMPLES, len(x)))].mean(1)
        episode_sd = float(np.sqrt(final_sq[run_act == act].mean() - x.mean() ** 2))  # pooled over the runs' episodes
        if flat[run_act == act].any():  # a block filled with its mean by an older unpack: its episodes' sd is lost
            episode_sd = None
        rows[act] = dict(runs=len(x), mean=x.mean(), median=float(np.median(x)), sd_over_runs=x.std(ddof=1),
                         ci95=[float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
                         sd_episodes=episode_sd, best_run=x.max(), paper_mean=PAPER[act][0],
                         paper_sd=PAPER[act][1], paper_best=PAPER[act][2], run_means=x.round(2).tolist())  # fmt: skip
    rng = np.random.default_rng(0)
    tests = [dict(a=a, b=b, difference=means[a].mean() - means[b].mean(), welch_z=welch_z(means[a], means[b]),
                  permutation_p=permutation_p(means[a], means[b], rng)) for a, b in COMPARISONS]  # fmt: skip
    for t, adjusted in zip(tests, holm([t["permutation_p"] for t in tests]), strict=True):
        t["holm_p"] = adjusted
        n = min(rows[t["a"]]["runs"], rows[t["b"]]["runs"])
        if adjusted < ALPHA:
            t["verdict"] = f"settled: {t['a']} {'>' if t['difference'] > 0 else '<'} {t['b']}"
            t["verdict"] += " (the paper's order)" if t["difference"] > 0 else " (the paper's order reversed)"
        else:
            t["verdict"] = f"not settled at {n} runs"
    print(f"Table 1 at episode {cli.at:,} (each run's mean over episodes {cli.at - BLOCK:,}-{cli.at - 1:,}); "
          + "; ".join(sources))  # fmt: skip
    if any(r["sd_episodes"] is None for r in rows.values()):
        print("sd of episodes n/a: a run's block at --at holds one score in every episode, as milestone.py unpack "
              "wrote summed blocks before it kept their sd; the means are right")  # fmt: skip
    print("| activation | runs | mean (95% CI over runs) | median | sd over runs | sd of episodes | best run "
          "| paper: mean ± sd | paper best |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for act, r in rows.items():
        sd = "n/a" if r["sd_episodes"] is None else f"{r['sd_episodes']:.1f}"
        print(f"| {act} | {r['runs']} | **{r['mean']:.1f}** ({r['ci95'][0]:.1f}-{r['ci95'][1]:.1f}) "
              f"| {r['median']:.1f} | {r['sd_over_runs']:.1f} | {sd} | {r['best_run']:.1f} "
              f"| {r['paper_mean']} ± {r['paper_sd']} | {r['paper_best']} |")  # fmt: skip
    print("\n| comparison | difference of means | Welch's z | permutation p | Holm-adjusted p | verdict |\n"
          "|---|---|---|---|---|---|")  # fmt: skip
    for t in tests:
        print(f"| {t['a']} - {t['b']} | {t['difference']:+.1f} | {t['welch_z']:.2f} | {t['permutation_p']:.2g} "
              f"| {t['holm_p']:.2g} | {t['verdict']} |")  # fmt: skip
    here = cli.out
    os.makedirs(here, exist_ok=True)
    with open(os.path.join(here, "table1.json"), "w") as f:
        json.dump(dict(at_episode=cli.at, sources=sources, activations=rows, tests=tests, alpha=ALPHA,
                       resamples=RESAMPLES, permutations=PERMUTATIONS), f, indent=1, default=float)  # fmt: skip
    plot(curve, run_act, cli.at, rows, here)


def plot(curve: np.ndarray, run_act: np.ndarray, at: int, rows: dict, here: str):
    """Fig. 2: mean score per 1,000 episodes, each activation's mean over its runs (top) and every run (below)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    episode = np.arange(BLOCK, at + 1, BLOCK)
    columns, names = [episode], ["episode"]
    fig, axes = plt.subplot_mosaic([["mean"] * 4, list(ORDER)], figsize=(10, 7), height_ratios=[3, 2], sharey=True)
    for act in ORDER:
        runs = curve[run_act == act]
        (line,) = axes["mean"].plot(episode, runs.mean(0), lw=2, label=f"{act} ({len(runs)} runs; final "
                                    f"{rows[act]['mean']:.0f}, paper {PAPER[act][0]})")  # fmt: skip
        axes[act].plot(episode, runs.T, color=line.get_color(), lw=0.4, alpha=0.6)
        for ax in (axes["mean"], axes[act]):
            ax.axhline(PAPER[act][0], color=line.get_color(), ls=":", lw=1)
        axes[act].set_title(f"{act}: every run ({len(runs)})", fontsize=8)
        axes[act].set_xlabel("episode", fontsize=8)
        axes[act].tick_params(labelsize=7)
        columns += [runs.mean(0), *runs]
        names += [act] + [f"{act}_run{r}" for r in range(len(runs))]
    axes["mean"].set(xlabel="episode", ylabel="mean score per 1,000 episodes")
    axes["mean"].set_title(f"SZ-Tetris, shallow nets, {at:,} of 200,000 episodes per run (dotted: the paper's final "
                           "score)", fontsize=9)  # fmt: skip
    axes["mean"].legend(fontsize=8)
    axes[ORDER[0]].set_ylabel("per run", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(here, "learning_curves.png"), dpi=110)
    np.savetxt(os.path.join(here, "learning_curves.csv"), np.column_stack(columns), fmt="%.3f", delimiter=",",
               header=",".join(names), comments="")  # fmt: skip


if __name__ == "__main__":
    main()
