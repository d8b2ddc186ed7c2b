"""Baseline vs Soft MoE-8 on RoadRunner (reduced budget): episode returns binned by environment steps, mean over
seeds, from the episodes.csv files beside this script. Usage: python results/dqn_roadrunner_reduced/plot.py"""

import csv
import glob
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = 10_000
RANDOM, HUMAN = 11.5, 7845.0  # atari_scores.csv

fig, ax = plt.subplots(figsize=(7, 4.5))
rows = []
for moe, color in (("none", "k"), ("softmoe", "tab:blue")):
    curves = []
    for path in sorted(glob.glob(os.path.join(HERE, f"RoadRunner__result__{moe}-nature__*", "episodes.csv"))):
        data = np.array([[float(v) for v in row] for row in list(csv.reader(open(path)))[1:]])
        edges = np.arange(0, data[-1, 0] // BIN * BIN + 1, BIN)
        means = [data[(data[:, 0] > lo) & (data[:, 0] <= lo + BIN), 1].mean() for lo in edges[:-1]]
        curves.append(np.array(means))
        ax.plot(edges[1:], means, color=color, lw=0.6, alpha=0.4)
    n = min(len(c) for c in curves)
    mean = np.mean([c[:n] for c in curves], 0)
    steps = np.arange(1, n + 1) * BIN
    label = "DQN, dense 512 (baseline)" if moe == "none" else "DQN, Soft MoE 8 experts (PerConv)"
    ax.plot(steps, mean, color=color, lw=2, label=f"{label}, mean of {len(curves)} seeds")
    rows += [(moe, int(s), f"{m:.1f}") for s, m in zip(steps, mean, strict=True)]
ax.axhline(RANDOM, color="gray", ls=":", label=f"random ({RANDOM:g})")
ax.set_xlabel("environment steps (4 frames each)")
ax.set_ylabel(f"mean episode return per {BIN:,} steps")
ax.set_title("RoadRunner, Dopamine protocol, reduced budget (7 min per run on one H100)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "baseline_vs_softmoe.png"), dpi=110)
with open(os.path.join(HERE, "baseline_vs_softmoe.csv"), "w", newline="") as f:
    csv.writer(f).writerows([("moe", "steps", "mean_return_over_seeds")] + rows)
print("\n".join(",".join(map(str, r)) for r in rows))
