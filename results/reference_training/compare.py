"""The comparison README.md fixed before the trained runs ended: the reference's own DER.gin run (run_reference.sh)
against ours (results/atari100k_26games/queue.sh's Breakout seed 1 at 32aa045, whose NoisyNets drew one noise per
minibatch: results/reference_training/ours_per_batch_noise/), one arm at a time, at the reference's step S.

    .refvenv/bin/python -W ignore results/reference_training/compare.py --arm softmoe --dopamine-dir ../dopamine

1. Curves: each code's training return per 2,000 agent steps (the mean of the episodes that end in the block, and
   their count) up to S, the last 100 episodes that end by S (or all, if fewer), and both codes' evaluations up to S
   (ours: at 100k only, DER's protocol).
   The reference's episodes come from its log ("Steps executed: ..." within each iteration's training phase,
   iteration i starting at step i x --iteration-steps); ours from the newest segment's episodes.csv in
   work/ours_per_batch_noise_runs/ (this folder's), or, once the run is complete, from its committed folder
   (ours_per_batch_noise/der_Breakout_<moe>_s1:
   episodes.csv, summary.json with the evaluation at 100k, scalars.csv, segments.json, and for Soft MoE analysis.csv
   and probes.npz), so that a look needs no file a fresh machine loses on our side.
2. Routing (Soft MoE) at S10, the last multiple of 10,000 steps that both have (the reference's checkpoint of that
   step, our snapshot): dispatch entropy / log m, combine entropy, token diversity in and out, from
   benchmark/moe_analysis.py's routing_statistics on our snapshot's 32 probe stacks for both networks (the
   reference's parameters copied into our network by benchmark/compare_with_dopamine.py's weight copy, noise off);
   (where the snapshot is gone: the reference on the committed probe of that step, ours' statistics from the run's
   analysis.csv, which queue.sh computed on the same probe with the same function)
   and Phi's gradient scale against Adam's eps (1.5e-4): the reference's sqrt of Adam's bias-corrected second moment
   of Phi (its mean over Phi), ours the mean of losses/phi_grad_rms over the 2,000 steps before S10; and ours'
   losses/phi_grad_rms and losses/td_loss per 2,000 steps up to S (the mean of the values logged in the block: one
   every 10 s of wall time, so their number follows the run's speed), with every logged Phi value.
3. The verdict by the README's rule. Writes compare_<arm>_<S>.json and curves_<arm>_<S>.png (1's curves) beside this
   file (one pair per look, so that every step the README reports stays checkable),
   and the arm's two rows of runs.csv (one per code, at S; the other arm's rows are kept): training return over the
   last 100 episodes by S, the mean evaluation return at S if that code evaluated there, and steps/s. The
   reference's: an iteration's steps over the median time between the kept checkpoints of consecutive iterations
   when the look is made (file times; the runner keeps its last 4, train.py a copy at each 10,000), so that the hours
   between two sessions on a kept machine do not count (the Xeon runs' looks took the time between the earliest and
   latest kept checkpoint up to S, restarts included). Ours:
   agent steps over the summed wall time of all its segments, each to where it stopped (past S for a run that went
   on), beside whatever else ran on the two cores. The commit is the reference's (Dopamine's 5873f54 + the last commit
   of this project that changed dopamine_reference.py) and, for ours, that of the segment that reached furthest.
   The curves of 1 also list every episode (step at its end, return) up to S.
"""

import argparse
import csv
import glob
import json
import os
import pickle
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "algos"), os.path.join(ROOT, "benchmark")]
OURS = os.path.join(HERE, "work", "ours_per_batch_noise_runs")
FINISHED = os.path.join(HERE, "ours_per_batch_noise")
ROUTING = ("token_diversity_in", "token_diversity_out", "routing_dispatch_entropy", "routing_combine_entropy")
BLOCK = 2_000


def reference_episodes(log_path: str, iteration_steps: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(step at the episode's end, return) of every training episode, and (step, mean return) of every evaluation."""
    episodes, evaluations, iteration, training = [], [], None, False
    with open(log_path) as f:
        for line in f:
            if m := re.search(r"Starting iteration (\d+)", line):
                iteration, training = int(m.group(1)), True
                start = iteration * iteration_steps  # a restart repeats an iteration: keep its last pass only
                episodes = [e for e in episodes if e[0] <= start]
                evaluations = [e for e in evaluations if e[0] <= start]
            elif "per training episode" in line:
                training = False
            elif (m := re.search(r"per evaluation episode: ([-\d.]+)", line)) and iteration is not None:
                evaluations.append(((iteration + 1) * iteration_steps, float(m.group(1))))
            elif training and (m := re.search(r"Steps executed: (\d+) .* Return: ([-\d.]+)", line)):
                episodes.append((iteration * iteration_steps + int(m.group(1)), float(m.group(2))))
    return episodes, evaluations


def saved_segments(work: str, name: str) -> list[str]:
    """Every segment (run folder) of the Breakout run `name` in work/ (each resume writes one), oldest first. A segment
    that has not yet saved (no episodes.csv and summary.json before its first checkpoint) is left out."""
    found = glob.glob(os.path.join(work, f"Breakout__{name}__*"))
    found = [d for d in found if all(os.path.exists(os.path.join(d, f)) for f in ("episodes.csv", "summary.json"))]
    return sorted(found, key=lambda d: os.path.getmtime(os.path.join(d, "summary.json")))


def our_segments(moe: str) -> list[str]:
    """Every saved segment of our Breakout seed-1 run of that arm (queue.sh's, in this folder's work/)."""
    return saved_segments(OURS, f"der_Breakout_{moe}_s1")


def reference_commit() -> str:
    """The reference's code as runs.csv records it: Dopamine's 5873f54 + the last commit of this project that changed
    dopamine_reference.py."""
    changed = ["git", "log", "-1", "--format=%h", "--abbrev=7", "--", "dopamine_reference.py"]
    return "5873f54+" + subprocess.run(changed, capture_output=True, text=True, cwd=HERE).stdout.strip()


def complete(folder: str) -> bool:
    """Whether the run folder holds the summary.json of a completed run."""
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            return bool(json.load(f).get("complete"))
    except FileNotFoundError:
        return False


def our_finished(moe: str) -> str | None:
    """The committed folder of our run once queue.sh has completed it, else None."""
    folder = os.path.join(FINISHED, f"der_Breakout_{moe}_s1")
    return folder if complete(folder) else None


def our_run(moe: str) -> str:
    """Where ours' episodes and summary are read: the completed run's committed folder, else the newest segment."""
    if finished := our_finished(moe):
        return finished
    segments = our_segments(moe)
    if not segments:
        raise SystemExit(f"error: no run of ours in {OURS} for --moe {moe}")
    return max(segments, key=lambda d: os.path.getmtime(os.path.join(d, "episodes.csv")))


def our_snapshot(moe: str, step: int) -> str | None:
    """Our snapshot of that step, in whichever segment of the run wrote it."""
    for run in our_segments(moe):
        path = os.path.join(run, "snapshots", f"rainbow_softmoe_{step}.pt")
        if os.path.exists(path):
            return path
    return None


def reference_latest_step(reference_dir: str, iteration_steps: int) -> int | None:
    """The step of the reference run's latest checkpoint (the runner's ckpt.N holds step (N + 1) x iteration_steps)."""
    names = os.listdir(os.path.join(reference_dir, "checkpoints"))
    checkpoints = [int(n.split(".")[1]) for n in names if n.startswith("ckpt.")]
    return (max(checkpoints) + 1) * iteration_steps if checkpoints else None


def reference_checkpoint(reference_dir: str, step: int, iteration_steps: int) -> str | None:
    """The reference's checkpoint of that step: the runner's (it keeps the last 4) or train.py's copy at 10,000s."""
    for name in (f"ckpt.{step // iteration_steps - 1}", f"keep_ckpt.{step // iteration_steps - 1}"):
        if os.path.exists(path := os.path.join(reference_dir, "checkpoints", name)):
            return path
    return None


def our_episodes(run_dir: str) -> list[tuple[int, float]]:
    with open(os.path.join(run_dir, "episodes.csv")) as f:
        return [(int(r["global_step"]), float(r["return"])) for r in csv.DictReader(f)]


def curve(episodes: list[tuple[int, float]], upto: int) -> dict:
    blocks = {}
    for step, ret in episodes:
        if step <= upto:
            blocks.setdefault((step - 1) // BLOCK, []).append(ret)
    last = [ret for step, ret in episodes if step <= upto][-100:]
    return {
        "per_2000_steps": {(k + 1) * BLOCK: float(np.mean(v)) for k, v in sorted(blocks.items())},
        "games_per_2000_steps": {(k + 1) * BLOCK: len(v) for k, v in sorted(blocks.items())},
        "episodes": [[step, ret] for step, ret in episodes if step <= upto],
        "last_100_mean": float(np.mean(last)) if last else None,
        "last_100_episodes": len(last),
    }


COLUMNS = ["code", "game", "arm", "seed", "agent_steps", "train_return_last_100", "eval_mean_return",
           "steps_per_second", "commit"]  # fmt: skip


def reference_speed(reference_dir: str, iteration_steps: int) -> float | None:
    """Agent steps per second of the reference's median iteration: iteration_steps over the median time between the
    kept checkpoints of two consecutive iterations (file times; the runner keeps its last 4), so that a stop between
    sessions, with the machine kept and the runs resumed hours later, does not count as training time."""
    times = {}
    for path in glob.glob(os.path.join(reference_dir, "checkpoints", "*ckpt.*")):
        step = (int(path.rsplit(".", 1)[1]) + 1) * iteration_steps
        times[step] = min(times.get(step, float("inf")), os.path.getmtime(path))
    seconds = [times[step] - times[step - iteration_steps] for step in times if step - iteration_steps in times]
    seconds = [s for s in seconds if s > 0]
    return iteration_steps / float(np.median(seconds)) if seconds else None


def our_speed_and_commit(moe: str) -> tuple[float | None, str]:
    """Agent steps over the summed wall time of the run's segments (each segment's summary.json, or the completed
    run's segments.json), and their commit."""
    steps = seconds = 0.0
    commit, newest = "", -1
    if finished := our_finished(moe):
        with open(os.path.join(finished, "segments.json")) as f:
            segments = json.load(f).values()
        with open(os.path.join(finished, "summary.json")) as f:
            commit = json.load(f)["code"]["commit"][:7]
        steps = sum(s["global_step"] - s["start_step"] for s in segments)
        seconds = sum(s["wall_time"] for s in segments)
        return (steps / seconds if seconds else None), commit
    for run in our_segments(moe):
        with open(os.path.join(run, "summary.json")) as f:
            summary = json.load(f)
        steps += summary["global_step"] - summary["start_step"]
        seconds += summary["wall_time"]
        if summary["global_step"] > newest:  # the commit of the segment that reached furthest
            commit, newest = summary["code"]["commit"][:7], summary["global_step"]
    return (steps / seconds if seconds else None), commit


def our_scalars(moe: str, tags: tuple[str, ...], upto: int) -> tuple[dict, list]:
    """Ours' logged scalars up to `upto`: per tag, the mean of the values logged in each 2,000-step block and their
    count; and every logged losses/phi_grad_rms as (step, value)."""
    from scalars import read_csv, read_scalars

    if finished := our_finished(moe):  # scalars.py's table of all its segments
        logged = read_csv(os.path.join(finished, "scalars.csv"))
    else:
        logged = read_scalars(our_segments(moe))
    blocks, phi = {tag: {} for tag in tags}, []
    for (tag, step), value in sorted(logged.items(), key=lambda kv: kv[0][1]):
        if tag in blocks and step <= upto:
            blocks[tag].setdefault((step - 1) // BLOCK, []).append(value)
            if tag == "losses/phi_grad_rms":
                phi.append([step, value])
    per_block = {
        tag: {(k + 1) * BLOCK: {"mean": float(np.mean(v)), "logged": len(v)} for k, v in sorted(b.items())}
        for tag, b in blocks.items()
    }
    return per_block, phi


def plot_curves(result: dict, path: str) -> None:
    """Both codes' training return per 2,000 steps up to S, and both codes' evaluations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for code, label in (("dopamine", "reference (Dopamine labs/moes)"), ("ours", "ours (rainbow_softmoe.py)")):
        blocks = result["curves"][code]["per_2000_steps"]
        note = "" if blocks else f": no game ended by step {result['reference_steps']:,}"
        ax.plot(list(blocks), list(blocks.values()), marker="o", label=f"{label}, training{note}")
    for key, marker, label in (("dopamine_evaluations", "k^", "reference"), ("ours_evaluations", "rv", "ours")):
        if result.get(key):
            steps, returns = zip(*result[key], strict=True)
            ax.plot(steps, returns, marker, label=f"{label}, evaluation (100 episodes)")
    ax.set_xlabel("agent steps")
    ax.set_ylabel("return per game (mean over 2,000 steps)")
    ax.set_title(f"Breakout, DER.gin network, {result['arm']}, seed 1, to step {result['reference_steps']:,}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_runs(rows: list[dict]) -> None:
    """runs.csv: these rows replace any of the same code, arm and seed (seeds.py adds the reference's seeds 2-3)."""
    path = os.path.join(HERE, "runs.csv")
    kept = []
    replaced = {(x["code"], x["arm"], str(x["seed"])) for x in rows}
    if os.path.exists(path):
        with open(path) as f:
            kept = [r for r in csv.DictReader(f) if (r["code"], r["arm"], r["seed"]) not in replaced]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(sorted(kept + rows, key=lambda r: (r["arm"], r["code"], int(r["seed"]))))


def our_committed_probe(moe: str, step: int) -> tuple[np.ndarray, dict] | None:
    """The completed run's probe states of that step (probes.npz) and ours' routing statistics on them (its row of
    analysis.csv), where both are committed: the routing look once the snapshot is gone."""
    finished = our_finished(moe)
    if not finished or not all(os.path.exists(os.path.join(finished, f)) for f in ("probes.npz", "analysis.csv")):
        return None
    with np.load(os.path.join(finished, "probes.npz")) as probes:
        if str(step) not in probes:
            return None
        states = probes[str(step)]
    with open(os.path.join(finished, "analysis.csv")) as f:
        row = next((r for r in csv.DictReader(f) if int(float(r["global_step"])) == step), None)
    return (states, {key: float(row[key]) for key in ROUTING}) if row else None


def routing(step: int, ours, checkpoint_path: str, dopamine_dir: str, phi_logged: list) -> dict:
    """Both networks' routing statistics at `step`, and Phi's gradient scale (ours from `phi_logged`, our_scalars's
    (step, value) list). `ours`: our snapshot's path (ours' network and probe), or our_committed_probe's (probe
    states, ours' statistics)."""
    import dopamine_reference
    import torch

    import compare_with_dopamine as cw
    import moe_analysis
    import rainbow_softmoe as R

    dopamine_reference.load(dopamine_dir)  # the reference's modules, to unpickle its checkpoint's optimizer state
    with open(checkpoint_path, "rb") as f:
        ckpt = pickle.load(f)
    der_gin = cw.configurations()[0]  # the weight copy's DER.gin network: Nature CNN, Soft MoE with 4 experts
    nets, out = {}, {}
    if isinstance(ours, str):
        snapshot = torch.load(ours, weights_only=True)
        args = R.fill_defaults(R.Args(**snapshot["args"]))
        nets["ours"] = R.build_network(args, 4)
        nets["ours"].load_state_dict(snapshot["q_net"])
        inputs = snapshot["probe"]["states"]
        inputs = {"obs": inputs} if torch.is_tensor(inputs) else inputs
    else:
        states, out["ours"] = ours[0], dict(ours[1], source="analysis.csv")
        inputs = {"obs": torch.from_numpy(states)}
    nets["dopamine"] = cw.loaded_network(cw.flatten(ckpt["online_params"]), der_gin, 4)
    for code, net in nets.items():
        net.eval()
        with torch.no_grad():
            _, aux = net(inputs, return_aux=True)
        out[code] = moe_analysis.routing_statistics(aux)
    out["ours"].setdefault("source", "snapshot")  # where ours' statistics come from
    adam = ckpt["optimizer_state"][0]
    nu = cw.flatten({"params": adam.nu["params"]})["SoftMoE_0/phi_weights"]
    bias = 1 - 0.999 ** int(adam.count)  # optax.adam's b2
    out["dopamine"]["phi_grad_scale"] = float(np.sqrt(np.asarray(nu) / bias).mean())
    recent = [v for s, v in phi_logged if step - BLOCK < s <= step]
    out["ours"]["phi_grad_scale"] = float(np.mean(recent)) if recent else None
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", choices=["softmoe", "baseline"], required=True)
    p.add_argument("--dopamine-dir", required=True)
    p.add_argument("--iteration-steps", type=int, default=2_000, help="the reference run's --iteration-steps")
    p.add_argument(
        "--upto",
        type=int,
        default=None,
        help="compare at this step (the README's sign rule: the smaller S of the arms)",
    )
    cli = p.parse_args()
    moe = "softmoe" if cli.arm == "softmoe" else "none"
    reference_dir = os.path.join(HERE, "work", f"dopamine_Breakout_{cli.arm}_s1")
    ours_dir = our_run(moe)
    ref_episodes, evaluations = reference_episodes(os.path.join(reference_dir, "train_log.txt"), cli.iteration_steps)
    S = reference_latest_step(reference_dir, cli.iteration_steps)
    if S is None:
        raise SystemExit(f"error: the reference run in {reference_dir} has no checkpoint yet")
    if cli.upto is not None:
        if cli.upto > S:
            raise SystemExit(f"error: --upto {cli.upto} is past the reference run's last checkpoint step {S}")
        S = cli.upto
    with open(os.path.join(ours_dir, "summary.json")) as f:
        ours_summary = json.load(f)
    saved = ours_summary["global_step"]
    if saved < S:  # episodes.csv is written with each checkpoint: the games since would be missing
        raise SystemExit(
            f"error: our run has saved its episodes only to step {saved:,}, before S = {S:,}; "
            "rerun after its next checkpoint (every 10 minutes)"
        )
    ours_episodes = our_episodes(ours_dir)
    result = {
        "arm": cli.arm,
        "reference_steps": S,
        "ours_run": os.path.relpath(ours_dir, ROOT),
        "curves": {"dopamine": curve(ref_episodes, S), "ours": curve(ours_episodes, S)},
        "dopamine_evaluations": [e for e in evaluations if e[0] <= S],
        "ours_evaluations": [  # DER's protocol: one, at 100k
            [e["global_step"], e["mean_return"]] for e in ours_summary.get("evaluations", []) if e["global_step"] <= S
        ],
    }
    pairs = [
        (
            step,
            our_snapshot(moe, step) or our_committed_probe(moe, step),
            reference_checkpoint(reference_dir, step, cli.iteration_steps),
        )
        for step in range(S // 10_000 * 10_000, 0, -10_000)
    ]
    shared = next(((step, snap, ckpt) for step, snap, ckpt in pairs if snap and ckpt), None)
    tags = ("losses/td_loss", "losses/phi_grad_rms") if cli.arm == "softmoe" else ("losses/td_loss",)
    result["ours_scalars_per_2000_steps"], phi = our_scalars(moe, tags, S)
    if cli.arm == "softmoe" and shared:
        S10, ours_at_S10, checkpoint_path = shared
        result["routing_step"] = S10
        result["routing"] = routing(S10, ours_at_S10, checkpoint_path, cli.dopamine_dir, phi)
        ref = result["routing"]["dopamine"]
        frozen = ref["routing_dispatch_entropy"] > 0.99 and ref["phi_grad_scale"] < 1.5e-4 / 10
        result["routing_verdict"] = "the reference's routing freezes too" if frozen else "it differs, here"
    if phi:
        result["ours_phi_grad_rms_logged"] = phi
    with open(os.path.join(HERE, f"compare_{cli.arm}_{S}.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot_curves(result, os.path.join(HERE, f"curves_{cli.arm}_{S}.png"))
    ours_speed, ours_commit = our_speed_and_commit(moe)
    evaluations = dict(result["dopamine_evaluations"])
    common = {"game": "Breakout", "arm": cli.arm, "seed": 1, "agent_steps": S}
    reference_row = {
        "code": "dopamine",
        **common,
        "train_return_last_100": result["curves"]["dopamine"]["last_100_mean"],
        "eval_mean_return": evaluations.get(S, ""),
        "steps_per_second": reference_speed(reference_dir, cli.iteration_steps),
        "commit": reference_commit(),
    }
    ours_row = {
        "code": "ours",
        **common,
        "train_return_last_100": result["curves"]["ours"]["last_100_mean"],
        "eval_mean_return": dict(result["ours_evaluations"]).get(S, ""),  # DER's protocol evaluates at 100k
        "steps_per_second": ours_speed,
        "commit": ours_commit,
    }
    write_runs([reference_row, ours_row])
    c = result["curves"]
    line = f"{cli.arm} at the reference's step {S:,}: last 100 training episodes: dopamine "
    line += f"{c['dopamine']['last_100_mean']} ({c['dopamine']['last_100_episodes']} episodes), ours "
    line += f"{c['ours']['last_100_mean']} ({c['ours']['last_100_episodes']})"
    print(line + (f"; {result['routing_verdict']}" if "routing_verdict" in result else ""))


if __name__ == "__main__":
    main()
