"""Asterix, deep Sarsa(lambda) SiLU-dSiLU at reduced budgets: mean training score per 100 episodes against agent steps,
with the softmax temperature tau(i) of each schedule, from the episodes.csv files of the runs named below.
Usage: python results/sarsa_asterix_reduced/plot.py"""

import csv
import glob
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BLOCK = 100
RANDOM = 210.0  # Mnih et al. (2015)'s random agent, the score Table 2's normalisation uses; envs/atari_scores.csv
RUNS = [  # (episodes.csv glob, label, tau_k, colour)
    (os.path.join(HERE, "Asterix__reduced_tauk0.005*", "episodes.csv"),  # the last segment holds the whole history
     "tau_k 0.005 (paper schedule compressed 10x)", 0.005, "tab:blue"),
    (os.path.join(ROOT, "sarsa_atari_reduced", "Asterix__result_cpu2__*", "episodes.csv"),
     "tau_k 0.0005 (paper schedule), earlier run", 0.0005, "k"),
]  # fmt: skip

fig, (ax, ax_tau) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(3, 1))
rows = []
for pattern, label, tau_k, color in RUNS:
    paths = sorted(glob.glob(pattern))
    if not paths:
        continue
    data = np.array([[float(v) for v in row] for row in list(csv.reader(open(paths[-1])))[1:]])
    n = len(data) // BLOCK
    means = data[: n * BLOCK, 2].reshape(n, BLOCK).mean(1)
    steps = data[BLOCK - 1 : n * BLOCK : BLOCK, 1]
    ax.plot(steps, means, color=color, lw=1.5, label=f"{label}: {len(data):,} episodes")
    episodes = np.arange(len(data))
    ax_tau.plot(data[:, 1], 0.5 / (1 + tau_k * episodes), color=color, lw=1.2)
    rows += [(label, int(s), (b + 1) * BLOCK, f"{m:.1f}") for b, (s, m) in enumerate(zip(steps, means, strict=True))]
ax.axhline(RANDOM, color="gray", ls=":", label=f"random ({RANDOM:g}, Mnih et al. 2015)")
ax.set_ylabel(f"mean training score per {BLOCK} episodes")
ax.set_title("Asterix, Sarsa(lambda) SiLU-dSiLU, --num-envs 8, reduced budget (2-core CPU)")
ax.legend(fontsize=8)
ax_tau.set_yscale("log")
ax_tau.set_ylabel("softmax tau")
ax_tau.set_xlabel("agent steps (4 frames each), summed over the 8 environments")
fig.tight_layout()
fig.savefig(os.path.join(HERE, "learning_curves.png"), dpi=110)
with open(os.path.join(HERE, "learning_curves.csv"), "w", newline="") as f:
    csv.writer(f).writerows([("run", "agent_steps", "episodes", f"mean_score_{BLOCK}")] + rows)
