"""A run's learning curve as a PNG: episode returns against agent steps, their running mean over 100 episodes and the
game's random and human scores, from the episodes.csv and summary.json that dqn_softmoe.py writes.

    python benchmark/learning_curve.py runs/<run> [runs/<other run> ...]      # writes runs/<run>/learning_curve.png
"""

import argparse
import csv
import json
import os
import textwrap

import numpy as np


def write_learning_curve(path: str, episodes: list[tuple], title: str, scores=None, window: int = 100):
    """episodes: (agent step at the end, return, length); scores: (random, human) or None."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([e[0] for e in episodes], dtype=np.float64)
    returns = np.array([e[1] for e in episodes], dtype=np.float64)
    if len(returns) >= window:
        running, running_steps = np.convolve(returns, np.ones(window), "valid") / window, steps[window - 1 :]
    else:  # fewer episodes than the window: the mean of all so far
        running, running_steps = returns.cumsum() / np.arange(1, len(returns) + 1), steps
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(steps, returns, ".", color="0.75", ms=2, label="episode return")
    ax.plot(running_steps, running, "k-", lw=1.5, label=f"mean of the last {window} episodes")
    if scores:
        ax.axhline(scores[0], color="gray", ls=":", label=f"random ({scores[0]:g})")
        ax.axhline(scores[1], color="r", ls=":", label=f"human ({scores[1]:g})")
    ax.set_xlabel("environment steps (agent steps, 4 frames each)")
    ax.set_ylabel("episode return (unclipped)")
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)  # long run names wrap instead of being cut
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories holding episodes.csv and summary.json")
    runs = parser.parse_args().runs
    if missing := [d for d in runs if not os.path.isfile(os.path.join(d, "episodes.csv"))]:  # before any plot
        raise SystemExit(f"error: {missing[0]!r} holds no episodes.csv (a dqn_softmoe.py or rainbow_softmoe.py run?)")
    for run_dir in runs:
        with open(os.path.join(run_dir, "episodes.csv")) as f:
            rows = csv.DictReader(f)
            if not {"global_step", "return", "length"} <= set(rows.fieldnames or ()):
                raise SystemExit(f"error: {run_dir!r}: its episodes.csv lacks global_step, return or length")
            episodes = [(int(r["global_step"]), float(r["return"]), int(r["length"])) for r in rows]
        if not episodes:
            print(f"{run_dir}: no finished episode yet")
            continue
        summary_path = os.path.join(run_dir, "summary.json")
        summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
        path = os.path.join(run_dir, "learning_curve.png")
        title = os.path.basename(os.path.normpath(run_dir))
        write_learning_curve(path, episodes, title, summary.get("random_human_scores"))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
