"""Redraw the four shallow activations' mean learning curves per 100 episodes (learning_curves_100.png) from
learning_curves_100.csv: each run's mean score per block of 100 episodes over its 10,000 episodes (segment 4's
episodes, which hold the whole history). The script's own curves use blocks of 1,000 episodes.

    .venv/bin/python results/tetris_table1_reduced/plot.py"""

import csv
import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PAPER = {"dsilu": 263, "sigmoid": 232, "silu": 214, "relu": 191}
with open(os.path.join(HERE, "learning_curves_100.csv")) as f:
    rows = list(csv.DictReader(f))
episodes = np.array([int(r["episode"]) for r in rows])
fig, ax = plt.subplots(figsize=(7, 4.5))
for act, paper in PAPER.items():
    runs = [c for c in rows[0] if c.startswith(f"{act}_run")]
    means = np.array([[float(r[c]) for c in runs] for r in rows]).mean(1)  # (blocks,), mean of the runs
    (line,) = ax.plot(episodes, means, lw=1.8, label=f"{act} (paper {paper} at 200k)")
    ax.axhline(paper, color=line.get_color(), ls=":", lw=1)
ax.set_xlabel("episode")
ax.set_ylabel("mean score per 100 episodes, mean of 10 runs")
ax.set_title(f"SZ-Tetris, shallow nets, reduced budget ({episodes[-1]:,} of 200,000 episodes)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "learning_curves_100.png"), dpi=110)
