"""Seeds 1-3 of both codes on Breakout (README.md, "Seeds"), fixed before the chase's last run ended and before any
seed-2 or seed-3 run of either code had started: each code's Soft MoE - baseline over the last 100 training games by
100,000 steps, per seed, and its reading (whether the reference's + at seed 1 is its own or that seed's).

    python results/reference_training/seeds.py           # a look (interim until all 12 runs are complete)
    python results/reference_training/seeds.py --keep    # first keep finished reference runs in seeds/

The reference: seed 1 is the live run (compare_<arm>_100000.json, committed), seeds 2 and 3 run_reference.sh with
SEED=2 and SEED=3 (work/dopamine_Breakout_<arm>_s<seed>, read from its log by compare.py's reference_episodes; --keep
copies a finished one's episodes, evaluation and rate into seeds/dopamine_Breakout_<arm>_s<seed>.json and its row into
runs.csv). Ours: the 26-game experiment's der_Breakout_<moe>_s<seed> at 137126d (per-sample NoisyNet noise, ours'
replay), committed when complete, else its newest segment in that experiment's work/.

The reading, once all 12 runs are complete: the codes differ on Breakout at 3 seeds if the reference's gap is + at
every seed and ours' - at every seed (the chase then goes on: README); otherwise 3 seeds do not separate the two codes'
gaps. Seed 1 is known (+0.52 and -2.92), so a permutation test of the reference's three gaps above ours' three can
give at best (1/20) / (1/2) = 0.10, the chance under the null that seeds 2 and 3 keep seed 1's order complete: the
reading is reported with that figure, not as a test at 0.05. Writes seeds.json and seeds.png beside this file.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE]

from compare import (  # noqa: E402
    complete,
    curve,
    our_episodes,
    reference_commit,
    reference_episodes,
    reference_speed,
    saved_segments,
    write_runs,
)

ARMS = {"baseline": "none", "softmoe": "softmoe"}
SEEDS = (1, 2, 3)
S = 100_000
ITERATION_STEPS = 2_000  # run_reference.sh's --iteration-steps
OURS = os.path.join(ROOT, "results", "atari100k_26games")
OURS_COMMIT = "137126d"  # the code the reading fixed for ours' runs: a run of another counts as not complete


def reference_run(arm: str, seed: int) -> dict | None:
    """The reference's episodes and evaluations of that seed: the committed look (seed 1) or kept file, else its log
    in work/; None if not started."""
    if seed == 1:
        with open(os.path.join(HERE, f"compare_{arm}_100000.json")) as f:
            look = json.load(f)
        return {"episodes": look["curves"]["dopamine"]["episodes"], "evaluations": look["dopamine_evaluations"]}
    kept = os.path.join(HERE, "seeds", f"dopamine_Breakout_{arm}_s{seed}.json")
    if os.path.exists(kept):
        with open(kept) as f:
            return json.load(f)
    log = os.path.join(HERE, "work", f"dopamine_Breakout_{arm}_s{seed}", "train_log.txt")
    if not os.path.exists(log):
        return None
    episodes, evaluations = reference_episodes(log, ITERATION_STEPS)
    return {"episodes": [list(e) for e in episodes], "evaluations": [list(e) for e in evaluations]}


def ours_run(moe: str, seed: int) -> tuple[str | None, bool]:
    """Ours' run folder of that seed (the committed one if complete, else the newest work segment) and whether the
    run is complete."""
    name = f"der_Breakout_{moe}_s{seed}"
    if complete(committed := os.path.join(OURS, name)):
        return committed, True
    found = saved_segments(os.path.join(OURS, "work", "runs"), name)
    return (found[-1] if found else None), False


def keep(arm: str, seed: int) -> str | None:
    """Copy a finished reference run of seed 2 or 3 (its evaluation at 100k logged) into seeds/ and its row into
    runs.csv (compare.py's columns)."""
    kept = os.path.join(HERE, "seeds", f"dopamine_Breakout_{arm}_s{seed}.json")
    work = os.path.join(HERE, "work", f"dopamine_Breakout_{arm}_s{seed}")
    if os.path.exists(kept) or not os.path.exists(os.path.join(work, "train_log.txt")):
        return None
    episodes, evaluations = reference_episodes(os.path.join(work, "train_log.txt"), ITERATION_STEPS)
    if S not in dict(evaluations):
        return None
    run = {
        "episodes": [list(e) for e in episodes],
        "evaluations": [list(e) for e in evaluations],
        "steps_per_second": reference_speed(work, ITERATION_STEPS),
    }
    os.makedirs(os.path.dirname(kept), exist_ok=True)
    with open(kept, "w") as f:
        json.dump(run, f, indent=1)
    write_runs([{"code": "dopamine", "game": "Breakout", "arm": arm, "seed": seed, "agent_steps": S,
                 "train_return_last_100": curve(episodes, S)["last_100_mean"],
                 "eval_mean_return": dict(evaluations)[S], "steps_per_second": run["steps_per_second"],
                 "commit": reference_commit()}])  # fmt: skip
    return kept


def rule(gaps: dict[str, dict[int, float]]) -> str:
    """The reading (README.md, "Seeds") of each code's Soft MoE - baseline at seeds 1-3."""
    if any(len(gaps.get(code, {})) < len(SEEDS) for code in ("dopamine", "ours")):
        return "no reading yet: every seed of both codes and arms must have ended games"
    if all(g > 0 for g in gaps["dopamine"].values()) and all(g < 0 for g in gaps["ours"].values()):
        return "the codes differ on Breakout at 3 seeds (the reference + at every seed, ours - at every seed)"
    return "3 seeds do not separate the two codes' gaps on Breakout"


def look() -> dict:
    runs, gaps, final = {}, {"dopamine": {}, "ours": {}}, True
    for seed in SEEDS:
        for arm, moe in ARMS.items():
            ref = reference_run(arm, seed)
            evaluation = dict(map(tuple, ref["evaluations"])).get(S) if ref else None
            runs[f"dopamine/{arm}/s{seed}"] = ref and {
                "curve": {k: v for k, v in curve(ref["episodes"], S).items() if k != "episodes"},
                "evaluation": evaluation,
                "complete": evaluation is not None,
            }
            folder, done = ours_run(moe, seed)
            summary = {}
            if folder:
                with open(os.path.join(folder, "summary.json")) as f:
                    summary = json.load(f)
            runs[f"ours/{arm}/s{seed}"] = folder and {
                "run": os.path.relpath(folder, ROOT),
                "commit": summary["code"]["commit"][:7],
                "curve": {k: v for k, v in curve(our_episodes(folder), S).items() if k != "episodes"},
                "evaluation": summary.get("eval_mean_return"),
                "complete": done and summary["code"]["commit"].startswith(OURS_COMMIT),
            }
        for code in gaps:
            base, moe = runs[f"{code}/baseline/s{seed}"], runs[f"{code}/softmoe/s{seed}"]
            final &= bool(base and moe and base["complete"] and moe["complete"])
            if base and moe and None not in (base["curve"]["last_100_mean"], moe["curve"]["last_100_mean"]):
                gaps[code][seed] = moe["curve"]["last_100_mean"] - base["curve"]["last_100_mean"]
    reading = rule(gaps)
    return {
        "steps": S,
        "final": final,
        "runs": runs,
        "soft_moe_minus_baseline_last_100": gaps,
        "mean_gap": {code: sum(g.values()) / len(g) if g else None for code, g in gaps.items()},
        "reading": reading if final else f"interim: {reading}",
    }


def plot(result: dict, path: str) -> None:
    """Each run's training return over its last 100 games by 100k, and each code's gap per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    colours = {"dopamine": "tab:green", "ours": "tab:purple"}
    for key, run in result["runs"].items():
        code, arm, seed = key.split("/")
        if run and run["curve"]["last_100_mean"] is not None:
            x = (0 if arm == "baseline" else 1) + (0.15 if code == "ours" else -0.15) + 0.04 * (int(seed[1:]) - 2)
            left.plot(x, run["curve"]["last_100_mean"], "o" if run["complete"] else "x", color=colours[code])
    for code, gaps in result["soft_moe_minus_baseline_last_100"].items():
        right.plot([int(s) for s in gaps], list(gaps.values()), "o-", color=colours[code],
                   label="the reference" if code == "dopamine" else "ours")  # fmt: skip
    left.set_xlim(-0.5, 1.5)
    left.set_xticks([0, 1], ["baseline", "Soft MoE"])
    left.set_ylabel("training return, last 100 games by 100k")
    left.set_title("each run (o complete, x in progress)", fontsize=9)
    right.axhline(0, color="grey", lw=0.8)
    right.set_xticks(list(SEEDS))
    right.set_xlabel("seed")
    right.set_ylabel("Soft MoE - baseline")
    right.set_title("each code's gap per seed", fontsize=9)
    right.legend(fontsize=8)
    fig.suptitle("Breakout, DER.gin's network, 100k steps: the reference and ours at seeds 1-3", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", action="store_true", help="first keep finished reference runs of seeds 2-3 in seeds/")
    cli = p.parse_args()
    if cli.keep:
        for seed in SEEDS[1:]:
            for arm in ARMS:
                if out := keep(arm, seed):
                    print(f"kept {os.path.relpath(out, ROOT)}")
    result = look()
    with open(os.path.join(HERE, "seeds.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(HERE, "seeds.png"))
    for key, run in result["runs"].items():
        if run:
            c = run["curve"]
            state = "complete" if run["complete"] else "in progress"
            print(f"{key}: last 100 games by 100k {c['last_100_mean']} ({c['last_100_episodes']} games); "
                  f"evaluation {run['evaluation']}; {state}")  # fmt: skip
        else:
            print(f"{key}: not started")
    print(result["soft_moe_minus_baseline_last_100"])
    print(result["reading"])


if __name__ == "__main__":
    main()
