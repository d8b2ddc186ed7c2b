"""The deep rows' curves from the device run's episodes.npz files: each run's mean score per 100 episodes and the mean
over the 5 runs (to deep_curves.csv), plotted to deep_curves.png.
    python results/tetris_deep_gpu/curves.py DIR   # DIR: where device.tgz was unpacked (holds runs/)"""

import glob
import os
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BLOCK = 100
here = os.path.dirname(os.path.abspath(__file__))
rows, fig = {}, plt.figure(figsize=(6, 4))
for act in ("silu-dsilu", "silu-silu", "relu-relu"):
    (path,) = glob.glob(os.path.join(sys.argv[1], "runs", f"*deep_rows__deep-{act}__*", "episodes.npz"))
    data = np.load(path)
    blocks = int(data["episodes"].min()) // BLOCK
    means = data["scores"][:, : blocks * BLOCK].reshape(len(data["episodes"]), blocks, BLOCK).mean(2)  # (runs, blocks)
    rows[act] = means.mean(0)
    ends = BLOCK * np.arange(1, blocks + 1)
    plt.plot(ends, rows[act], label=f"{act} (mean of {len(means)} runs)")
n = min(len(v) for v in rows.values())
table = np.column_stack([BLOCK * np.arange(1, n + 1)] + [rows[a][:n] for a in rows])
np.savetxt(os.path.join(here, "deep_curves.csv"), table, delimiter=",", fmt="%.4f", header="episode," + ",".join(rows),
           comments="")  # fmt: skip
plt.xlabel("episode")
plt.ylabel(f"mean score per {BLOCK} episodes")
plt.title("SZ-Tetris deep nets, first ~1,700 episodes (0.8% of 200k), H200")
plt.legend()
plt.tight_layout()
fig.savefig(os.path.join(here, "deep_curves.png"), dpi=100)
print(f"wrote deep_curves.csv and deep_curves.png ({n} blocks of {BLOCK} episodes)")
