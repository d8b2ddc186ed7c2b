"""The chase README.md fixed after the verdict at 100,000 steps ("it differs, here"), before any of its runs ended (one
was at 77,000 steps):
ours at 137126d (per-sample NoisyNet noise in the update, as the reference draws it), Breakout seed 1, both arms, with
ours' replay (results/atari100k_26games/queue.sh's der_Breakout_<moe>_s1) and with the reference's
(run_ours_reference_replay.sh's chase_Breakout_<moe>_s1), beside the reference's own runs (compare_<arm>_100000.json).

    python results/reference_training/chase.py            # the look at the step all started runs have saved
    python results/reference_training/chase.py --upto 100000

Per run: the training return per 2,000 agent steps and over the last 100 games by S (compare.py's curve), the games
that end in the last 20,000 steps before S (described only), and the evaluation at 100k (DER's protocol); per replay,
Soft MoE - baseline over the last 100 games. The rule (README.md, "The chase"), read at S = 100,000 once all four runs
are complete: the replay is named as the difference at this seed if the gap is + with the reference's replay and -
with ours'; cleared at this seed if both are -; if ours' own replay gives + (whatever the other), the per-sample noise
alone gave ours the reference's sign; a gap of exactly 0 is none of these. Before that every look is interim. Writes
chase_<S>.json and chase_<S>.png beside this file. With --keep, a complete chase run's episodes, summary, log and
logged scalars are copied into chase/<run>/ (committed), where later looks read them once a fresh machine has lost
work/.
"""

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "benchmark")]

from compare import complete, curve, our_episodes, saved_segments  # noqa: E402

ARMS = {"baseline": "none", "softmoe": "softmoe"}
REPLAYS = {  # replay: (run name pattern, committed folder, work folder of its segments)
    "ours": ("der_Breakout_{moe}_s1", os.path.join(ROOT, "results", "atari100k_26games"),
             os.path.join(ROOT, "results", "atari100k_26games", "work", "runs")),
    "reference": ("chase_Breakout_{moe}_s1", os.path.join(HERE, "chase"),
                  os.path.join(HERE, "work", "ours_reference_replay", "runs")),
}  # fmt: skip
LOG = os.path.join(HERE, "work", "ours_reference_replay", "{name}.log")


def segments(replay: str, moe: str) -> list[str]:
    """The run's segments (each resume writes one) that have saved episodes and a summary, oldest first."""
    pattern, _, work = REPLAYS[replay]
    return saved_segments(work, pattern.format(moe=moe))


def run_folder(replay: str, moe: str) -> str | None:
    """The complete run's committed folder, else its newest segment, else None (not started)."""
    pattern, committed, _ = REPLAYS[replay]
    if complete(folder := os.path.join(committed, pattern.format(moe=moe))):
        return folder
    found = segments(replay, moe)
    return found[-1] if found else None


def keep(moe: str) -> str | None:
    """Copy a complete chase run (the reference's replay) into chase/<run>/: episodes, summary, the log and every
    segment's logged scalars (benchmark/scalars.py)."""
    from scalars import read_scalars, write_csv

    found = segments("reference", moe)
    if not found or not complete(found[-1]):
        return None
    name = REPLAYS["reference"][0].format(moe=moe)
    out = os.path.join(HERE, "chase", name)
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(found[-1], "episodes.csv"), out)
    shutil.copy(LOG.format(name=name), os.path.join(out, "train_log.txt"))
    write_csv(read_scalars(found), os.path.join(out, "scalars.csv"))
    shutil.copy(os.path.join(found[-1], "summary.json"), out)  # last: the folder counts as complete once it is here
    return out


def plot(result: dict, reference: dict, path: str) -> None:
    """Training return per 2,000 steps of the four runs (and the reference's own, faint), and the evaluations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = result["steps"]
    fig, ax = plt.subplots(figsize=(9.5, 4))
    colours = {"baseline": "tab:blue", "softmoe": "tab:orange"}
    for arm, curves in reference.items():
        blocks = {k: v for k, v in curves["per_2000_steps"].items() if int(k) <= S}
        ax.plot([int(k) for k in blocks], list(blocks.values()), ":", color=colours[arm], alpha=0.5,
                label=f"the reference's own, {arm}")  # fmt: skip
    for key, run in result["runs"].items():
        if run is None:
            continue
        replay, arm = key.split("/")
        blocks = run["curve"]["per_2000_steps"]
        style = "-o" if replay == "ours" else "--s"
        ax.plot(list(blocks), list(blocks.values()), style, color=colours[arm], markersize=3,
                label=f"ours, {replay} replay, {arm}")  # fmt: skip
        if run["evaluation"] is not None:
            ax.plot([100_000], [run["evaluation"]], "v" if replay == "ours" else "D", color=colours[arm])
    ax.set_xlabel("agent steps")
    ax.set_ylabel("return per game (mean over 2,000 steps)")
    ax.set_title(f"The chase: Breakout, DER.gin network, seed 1, to step {S:,}\n(markers at 100k: evaluations)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: the evaluations sit at the right
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def window(episodes: list[tuple[int, float]], start: int, end: int) -> dict:
    """The games that end in (start, end]: their mean return and count (described beside the rule, not read by it:
    a run that stops ending games keeps old games in its last 100)."""
    returns = [ret for step, ret in episodes if start < step <= end]
    return {"mean": sum(returns) / len(returns) if returns else None, "games": len(returns)}


def rule(gaps: dict[str, float]) -> str:
    """The chase's reading (README.md) of Soft MoE - baseline over the last 100 games, per replay."""
    if len(gaps) < 2:
        return "no reading yet: both arms of both replays must have ended games"
    if gaps["reference"] > 0 and gaps["ours"] < 0:
        return "the replay is named as the difference, at this seed"
    if gaps["reference"] < 0 and gaps["ours"] < 0:
        return "the replay is cleared at this seed"
    if gaps["ours"] > 0:
        return "ours' own replay gives the reference's sign: the per-sample noise moved ours there"
    return "a gap of exactly 0: none of the rule's cases"


def look(upto: int | None = None) -> dict:
    """The four runs at S (default: the last step every started run has saved, at most 100,000) and the reading."""
    folders = {f"{replay}/{arm}": run_folder(replay, moe) for replay in REPLAYS for arm, moe in ARMS.items()}
    summaries = {}
    for key, folder in folders.items():
        if folder:
            with open(os.path.join(folder, "summary.json")) as f:
                summaries[key] = json.load(f)
    if not summaries:
        raise SystemExit("error: no run of the chase has saved yet; start them (README.md, Resume)")
    saved = min(s["global_step"] for s in summaries.values())
    S = min(saved, 100_000) if upto is None else upto
    if S > saved:
        raise SystemExit(f"error: --upto {S:,} is past step {saved:,}, the last that every started run has saved")
    runs = {}
    for key, folder in folders.items():
        if folder is None:
            runs[key] = None
            continue
        evaluations = [e for e in summaries[key].get("evaluations", []) if e["global_step"] <= S]
        episodes = our_episodes(folder)
        runs[key] = {
            "run": os.path.relpath(folder, ROOT),
            "commit": summaries[key]["code"]["commit"][:7],
            "complete": bool(summaries[key].get("complete")),
            "curve": curve(episodes, S),
            "last_20000_steps": window(episodes, S - 20_000, S),
            "evaluation": evaluations[-1]["mean_return"] if evaluations else None,
        }
    gaps = {}
    for replay in REPLAYS:
        base, moe = runs[f"{replay}/baseline"], runs[f"{replay}/softmoe"]
        if base and moe and base["curve"]["last_100_mean"] is not None and moe["curve"]["last_100_mean"] is not None:
            gaps[replay] = moe["curve"]["last_100_mean"] - base["curve"]["last_100_mean"]
    final = S == 100_000 and all(r and r["complete"] for r in runs.values())
    return {
        "steps": S,
        "final": final,
        "runs": runs,
        "soft_moe_minus_baseline_last_100": gaps,
        "reading": rule(gaps) if final else f"interim: {rule(gaps)}",
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upto", type=int, help="look at this step (default: the last step every started run saved)")
    p.add_argument("--keep", action="store_true", help="copy complete chase runs into chase/<run>/ first")
    cli = p.parse_args()
    if cli.keep:
        for moe in ARMS.values():
            if out := keep(moe):
                print(f"kept {os.path.relpath(out, ROOT)}")
    result = look(cli.upto)
    S, runs = result["steps"], result["runs"]
    with open(os.path.join(HERE, f"chase_{S}.json"), "w") as f:
        json.dump(result, f, indent=1)
    reference = {}
    for arm in ARMS:
        with open(os.path.join(HERE, f"compare_{arm}_100000.json")) as f:
            reference[arm] = json.load(f)["curves"]["dopamine"]
    plot(result, reference, os.path.join(HERE, f"chase_{S}.png"))
    for key, run in runs.items():
        if run:
            c = run["curve"]
            w = run["last_20000_steps"]
            print(f"{key}: last 100 games by {S:,}: {c['last_100_mean']} ({c['last_100_episodes']} games); "
                  f"games ending in the last 20,000 steps: {w['mean']} ({w['games']})"
                  + (f"; evaluation {run['evaluation']}" if run["evaluation"] is not None else ""))  # fmt: skip
        else:
            print(f"{key}: not started")
    print(result["reading"])


if __name__ == "__main__":
    main()
