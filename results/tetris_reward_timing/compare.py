"""Reward timing (issue 11 §1.4): the 5k-episode runs of command.sh side by side. Writes compare_5k.png (mean score
per 100 episodes, mean of the 10 runs, both timings) and compare_5k.json (final 1,000 episodes: mean, sd of the
episode scores, sd over runs, best run, means per 500 episodes, and the difference with its standard error)."""

import glob
import json
import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
out, fig = {}, plt.figure(figsize=(7, 4.5))
for timing in ("next", "current"):
    run_dir = sorted(glob.glob(os.path.join(HERE, "runs", f"*__reward5k_{timing}__*")))[-1]
    data = np.load(os.path.join(run_dir, "episodes.npz"))
    n = int(data["episodes"].min())
    scores = data["scores"][:, :n].astype(float)  # (runs, episodes)
    final = scores[:, n - 1000 : n]
    per_run = final.mean(1)
    blocks = scores[:, : n // 500 * 500].reshape(len(scores), -1, 500).mean(-1).mean(0)
    out[timing] = {
        "run_dir": os.path.relpath(run_dir, HERE),
        "episodes_per_run": n,
        "final_1000_mean": float(per_run.mean()),
        "final_1000_sd_episodes": float(final.std()),
        "sd_over_runs": float(per_run.std(ddof=1)),
        "best_run": float(per_run.max()),
        "per_run": [round(float(x), 1) for x in per_run],
        "mean_per_500": [round(float(x), 1) for x in blocks],
    }
    curve = scores[:, : n // 100 * 100].reshape(len(scores), -1, 100).mean(-1).mean(0)
    plt.plot(np.arange(1, len(curve) + 1) * 100, curve, label=f"--reward-timing {timing}")
a, b = out["current"], out["next"]
diff = a["final_1000_mean"] - b["final_1000_mean"]
se = float(np.sqrt(a["sd_over_runs"] ** 2 / 10 + b["sd_over_runs"] ** 2 / 10))
out["current_minus_next"] = {"difference": diff, "standard_error": se, "z": diff / se}
plt.xlabel("episode")
plt.ylabel("mean score per 100 episodes, mean of 10 runs")
plt.title("SZ-Tetris, shallow dSiLU: reward r(s_{t+1}) vs r(s_t) (reduced budget)")
plt.legend()
plt.tight_layout()
plt.savefig(os.path.join(HERE, "compare_5k.png"), dpi=110)
with open(os.path.join(HERE, "compare_5k.json"), "w") as f:
    json.dump(out, f, indent=2)
print(json.dumps(out, indent=2))
