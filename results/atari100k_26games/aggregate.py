"""§5.2's Atari-100k claim on the 26 games: runs.csv from every finished run of queue.sh, and aggregate.json with each
arm's IQM, median and mean human-normalised evaluation score over the games (seed 1), their 95% CIs, the probability
of improvement, and the verdict of the test fixed in README.md before any game finished.

    python results/atari100k_26games/aggregate.py        # reads results/atari100k_26games/*/summary.json

The CIs resample games (a paired bootstrap over the 26 games, 50,000 resamples): with one seed a game, rliable's
stratified bootstrap (runs resampled within each game) would have nothing to resample.
"""

import csv
import glob
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GAMES_26 = (
    "Alien Amidar Assault Asterix BankHeist BattleZone Boxing Breakout ChopperCommand CrazyClimber DemonAttack Freeway "
    "Frostbite Gopher Hero Jamesbond Kangaroo Krull KungFuMaster MsPacman Pong PrivateEye Qbert RoadRunner Seaquest "
    "UpNDown"
).split()
# DER at 100k steps, van Hasselt et al. 2019 (about 5 seeds), as listed in mila-iqia/spr src/rlpyt_utils.py
# (atari_der_scores) and CURL's Table 2 (column "Eff. Rainbow")
DER_2019 = dict(
    Alien=739.9, Amidar=188.6, Assault=431.2, Asterix=470.8, BankHeist=51.0, BattleZone=10124.6, Boxing=0.2,
    Breakout=1.9, ChopperCommand=861.8, CrazyClimber=16185.3, DemonAttack=508.0, Freeway=27.9, Frostbite=866.8,
    Gopher=349.5, Hero=6857.0, Jamesbond=301.6, Kangaroo=779.3, Krull=2851.5, KungFuMaster=14346.1, MsPacman=1204.1,
    Pong=-19.3, PrivateEye=97.8, Qbert=1152.9, RoadRunner=9600.0, Seaquest=354.1, UpNDown=2877.4,
)  # fmt: skip
ARMS = {"none": "baseline", "softmoe": "softmoe"}
COLUMNS = ["code", "game", "arm", "seed", "agent_steps", "train_return_last_100", "eval_mean_return",
           "eval_human_normalized", "der_2019", "steps_per_second", "commit"]  # fmt: skip
RESAMPLES = 50_000
MEASURE = "evaluation"  # what the test reads (README); benchmark/report.py scores these runs by it too


def runs() -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(HERE, "*", "summary.json"))):
        with open(path) as f:
            s = json.load(f)
        if not s.get("complete"):
            continue
        rows.append(
            {
                "code": "ours",
                "game": s["game"],
                "arm": ARMS[s["args"]["moe"]],
                "seed": s["args"]["seed"],
                "agent_steps": s["global_step"],
                "train_return_last_100": s["mean_return_last_100"],
                "eval_mean_return": s.get("eval_mean_return"),
                "eval_human_normalized": s.get("eval_human_normalized_score"),
                "der_2019": DER_2019.get(s["game"]),
                "steps_per_second": round(run_speed(os.path.dirname(path), s), 2),
                "commit": ((s.get("code") or {}).get("commit") or "")[:7],  # the last segment's
            }
        )
    return rows


def run_speed(folder: str, summary: dict) -> float:
    """A run's agent steps over the wall time of all its segments (segments.json: resumes, their loads and the
    evaluation included), the rate runs.csv of ../reference_training gives ours. A run resumed only to evaluate has a
    last segment of 0 steps, so the last segment's own rate says nothing; without segments.json, that rate."""
    path = os.path.join(folder, "segments.json")
    if not os.path.exists(path):
        return summary["sps"]
    with open(path) as f:
        segments = json.load(f).values()
    steps = sum(seg["global_step"] - seg["start_step"] for seg in segments)
    return steps / sum(seg["wall_time"] for seg in segments)


def iqm(x: np.ndarray) -> np.ndarray:
    """Interquartile mean over the last axis: the mean of the middle 50% (rliable's 25%-per-side trimmed mean)."""
    x = np.sort(x, axis=-1)
    k = int(np.floor(0.25 * x.shape[-1]))
    return x[..., k : x.shape[-1] - k].mean(-1)


def improvement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """P(a > b) over paired games (last axis), ties counting half: rliable's probability of improvement with one run
    a game."""
    return ((a > b) + 0.5 * (a == b)).mean(-1)


STATISTICS = {"iqm": iqm, "median": lambda x: np.median(x, -1), "mean": lambda x: x.mean(-1)}


def ci(values: np.ndarray) -> list[float]:
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def aggregate(rows: list[dict]) -> dict:
    score = {(r["game"], r["arm"]): r["eval_human_normalized"] for r in rows if r["seed"] == 1}
    games = [g for g in GAMES_26 if score.get((g, "baseline")) is not None and score.get((g, "softmoe")) is not None]
    out = {"measure": MEASURE, "games_complete": len(games), "games": games, "seed": 1, "resamples": RESAMPLES}
    out["per_game"] = [
        {"game": g, "baseline": score[(g, "baseline")], "softmoe": score[(g, "softmoe")],
         "sign": int(np.sign(score[(g, "softmoe")] - score[(g, "baseline")]))}
        for g in games
    ]  # fmt: skip
    if len(games) < 2:
        return out | {"verdict": f"incomplete: {len(games)} of 26 games have both arms"}
    base = np.array([score[(g, "baseline")] for g in games])
    moe = np.array([score[(g, "softmoe")] for g in games])
    picks = np.random.default_rng(0).integers(0, len(games), size=(RESAMPLES, len(games)))  # games, paired
    base_r, moe_r = base[picks], moe[picks]
    for name, stat in STATISTICS.items():
        out[name] = {
            "baseline": float(stat(base)),
            "softmoe": float(stat(moe)),
            "baseline_ci": ci(stat(base_r)),
            "softmoe_ci": ci(stat(moe_r)),
            "difference": float(stat(moe) - stat(base)),
            "difference_ci": ci(stat(moe_r) - stat(base_r)),
        }
    out["probability_of_improvement"] = {
        "softmoe_over_baseline": float(improvement(moe, base)),
        "ci": ci(improvement(moe_r, base_r)),
    }
    low, high = out["iqm"]["difference_ci"]
    if len(games) < 26:
        verdict = f"incomplete: {len(games)} of 26 games; the test is read at 26"
    elif low > 0:
        verdict = "Soft MoE above the baseline: the 95% CI of the IQM difference lies above 0"
    elif high < 0:
        verdict = "Soft MoE below the baseline: the 95% CI of the IQM difference lies below 0"
    else:
        verdict = "no detectable difference: the 95% CI of the IQM difference contains 0"
    return out | {"verdict": verdict}


def main():
    rows = runs()
    with open(os.path.join(HERE, "runs.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["game"], r["arm"], r["seed"])))
    result = aggregate(rows)
    with open(os.path.join(HERE, "aggregate.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"{len(rows)} finished runs; {result['verdict']}")


if __name__ == "__main__":
    main()
