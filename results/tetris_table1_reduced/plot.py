"""Redraw the four shallow activations' mean learning curves per 100 episodes from segment*/<activation>/episodes.npz
(the script's own curves use blocks of 1,000 episodes, three points at this budget)."""

import glob
import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PAPER = {"dsilu": 263, "sigmoid": 232, "silu": 214, "relu": 191}
latest = sorted(glob.glob(os.path.join(HERE, "segment*")))[-1]
fig, ax = plt.subplots(figsize=(7, 4.5))
for act, paper in PAPER.items():
    data = np.load(os.path.join(latest, act, "episodes.npz"))
    n = int(data["episodes"].min()) // 100 * 100
    means = data["scores"][:, :n].reshape(len(data["episodes"]), -1, 100).mean(-1).mean(0)  # (blocks,)
    (line,) = ax.plot(np.arange(1, len(means) + 1) * 100, means, lw=1.8, label=f"{act} (paper {paper} at 200k)")
    ax.axhline(paper, color=line.get_color(), ls=":", lw=1)
ax.set_xlabel("episode")
ax.set_ylabel("mean score per 100 episodes, mean of 10 runs")
ax.set_title(f"SZ-Tetris, shallow nets, reduced budget ({n:,} of 200,000 episodes)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "learning_curves_100.png"), dpi=110)
