"""The tables of this study's README from the complete runs' files: one row per run (score, routing, Phi's gradient),
then one row per arm (its seeds side by side), then each run's training return per 10k-step iteration. Writes
summary.csv and study.png (training return, output-token diversity and Phi's gradient RMS over training) beside this
file.

    python results/softmoe_100k_freeze/report.py            # this study's runs and, for context, the earlier ones
Runs are read from <run>/summary.json (the evaluation and training scores) and <run>/scalars.csv (the snapshots'
routing statistics, `analysis/*`, and `losses/phi_grad_rms`, logged once a minute while learning).
"""

import csv
import glob
import itertools
import json
import os
import re
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
EARLIER = os.path.join(HERE, "..", "atari100k_cpu")  # same agent and network, emulator-frame no-op starts


def scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    path = os.path.join(run_dir, "scalars.csv")
    if os.path.exists(path):
        with open(path) as f:
            for row in csv.DictReader(f):
                out.setdefault(row["tag"], []).append((int(row["step"]), float(row["value"])))
    return out


def median_between(values: list[tuple[int, float]], lo: int, hi: int) -> float | None:
    inside = [v for step, v in values if lo <= step < hi]
    return statistics.median(inside) if inside else None


def network(args: dict) -> str:
    name = f"{args['encoder']}" + (f" + {args['moe']} ({args['num_experts']} experts)" if args["moe"] != "none" else "")
    if args.get("moe_normalize"):
        name += ", --moe-normalize"
    if args.get("phi_adam_eps") is not None:
        name += f", --phi-adam-eps {args['phi_adam_eps']:g}"
    return name


def load(run_dir: str) -> tuple[dict, dict[str, list[tuple[int, float]]]]:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f), scalars(run_dir)


def row(run_dir: str, earlier: bool, summary: dict, s: dict[str, list[tuple[int, float]]]) -> dict:
    args = summary["args"]
    evaluation = summary["evaluations"][-1]
    # snapshots up to 90k: the runs of the first seeds have none later (later code also snapshots the final network)
    entropy, diversity = ([v for v in s.get(f"analysis/{k}", []) if v[0] <= 90_000]
                          for k in ("routing_dispatch_entropy", "token_diversity_out"))  # fmt: skip
    grad = s.get("losses/phi_grad_rms", [])
    first, last = (lambda v: v[0][1] if v else None), (lambda v: v[-1][1] if v else None)
    end = args["total_timesteps"]
    return dict(
        run=os.path.basename(run_dir) + (" (earlier)" if earlier else ""),
        arm=re.sub(r"_s\d+$", "", os.path.basename(run_dir)), earlier=earlier,
        network=network(args), seed=args["seed"], complete=summary["complete"],
        eval_mean=evaluation["mean_return"], eval_sd=evaluation["std_return"],
        train_last_100=summary["mean_return_last_100"],
        dispatch_entropy_first=first(entropy), dispatch_entropy_last=last(entropy),
        diversity_first=first(diversity), diversity_last=last(diversity),
        snapshots=f"{entropy[0][0] // 1000}k-{entropy[-1][0] // 1000}k" if entropy else "",
        phi_grad_rms_first_10k=median_between(grad, 0, 10_000),
        phi_grad_rms_last_10k=median_between(grad, end - 10_000, end + 1),
        iteration_returns=", ".join(f"{it['mean_return']:.1f}" for it in summary["iteration_returns"]),
    )  # fmt: skip


def plot(runs: list[tuple[dict, dict, dict[str, list[tuple[int, float]]]]], path: str):
    """Three panels over training, one line per run of this study (colour: arm, style: seed): the training return per
    10k-step iteration, the snapshots' output-token diversity and the median of Phi's gradient RMS per iteration
    against Adam's eps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5.4))
    colours = dict(impala8_softmoe="tab:red", impala8_none="black", nature4_softmoe="tab:blue", nature_none="tab:gray",
                   normalize_softmoe="tab:green", phieps_softmoe="tab:purple")  # fmt: skip
    for r, summary, s in runs:
        style = dict(color=colours.get(r["arm"]), ls=["-", "--", ":"][(r["seed"] - 1) % 3])
        size = summary["args"]["iteration_steps"]
        iterations = summary["iteration_returns"]
        axes[0].plot([(i + 1) * size for i in range(len(iterations))], [it["mean_return"] for it in iterations],
                     label=r["run"], marker=".", **style)  # fmt: skip
        if diversity := s.get("analysis/token_diversity_out"):
            axes[1].plot(*zip(*diversity, strict=True), marker=".", **style)
        if grad := s.get("losses/phi_grad_rms"):
            ends = range(size, summary["args"]["total_timesteps"] + 1, size)
            medians = [(end, median_between(grad, end - size, end)) for end in ends]
            axes[2].plot(*zip(*[(x, m) for x, m in medians if m is not None], strict=True), marker=".", **style)
    adam_eps = runs[0][1]["args"]["adam_eps"]  # the paper's Table 1 value in every run here
    axes[2].axhline(adam_eps, color="k", lw=0.8)
    axes[2].annotate(
        f"Adam's ε ({adam_eps:.1e})", (0.02, adam_eps * 1.13), xycoords=("axes fraction", "data"), fontsize=9
    )
    titles = ("training return per 10k-step iteration", "output-token diversity (snapshots)",
              "Φ gradient RMS, median per 10k steps")  # fmt: skip
    for ax, title in zip(axes, titles, strict=True):
        ax.set(title=title, xlabel="agent steps")
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=6, fontsize=9)
    fig.suptitle("DrQ(ε), Breakout, 100k agent steps")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=90)


# Soft MoE against the baseline of its network, on the training return over the last 100 episodes (one value per seed)
COMPARISONS = (("impala8_softmoe", "impala8_none"), ("nature4_softmoe", "nature_none"),
               ("normalize_softmoe", "nature_none"), ("phieps_softmoe", "nature_none"))  # fmt: skip


def exact_permutation_p(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Over every way of splitting the pooled seeds into groups of len(a) and len(b): the share whose difference of
    means is at least ours (one-sided, a above b) and whose |difference| is at least ours (two-sided); and the smallest
    one-sided p these group sizes allow (1 / the number of splits)."""
    pooled, observed = a + b, statistics.mean(a) - statistics.mean(b)
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    total = sum(pooled)
    diffs = [sum(pooled[i] for i in idx) / len(a) - (total - sum(pooled[i] for i in idx)) / len(b) for idx in splits]
    one = sum(d >= observed - 1e-9 for d in diffs) / len(diffs)
    two = sum(abs(d) >= abs(observed) - 1e-9 for d in diffs) / len(diffs)
    return one, two, 1 / len(diffs)


def fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def main():
    runs = [(d, False) for d in sorted(glob.glob(os.path.join(HERE, "*_s[0-9]")))]
    runs += [(d, True) for d in sorted(glob.glob(os.path.join(EARLIER, "drq-eps_Breakout_*_s[0-9]")))]
    runs = [(d, earlier, *load(d)) for d, earlier in runs if os.path.exists(os.path.join(d, "summary.json"))]
    rows = [row(*run) for run in runs]
    with open(os.path.join(HERE, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("| run | network | training, last 100 | evaluation (sd) | dispatch entropy, first → last snapshot | "
          "output-token diversity | snapshots | Φ grad RMS, median: first 10k → last 10k steps |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['network']} | {r['train_last_100']:.1f} | "
              f"{r['eval_mean']:.1f} ({r['eval_sd']:.1f}) | "
              f"{fmt(r['dispatch_entropy_first'], '.6f')} → {fmt(r['dispatch_entropy_last'], '.6f')} | "
              f"{fmt(r['diversity_first'], '.2g')} → {fmt(r['diversity_last'], '.2g')} | {r['snapshots']} | "
              f"{fmt(r['phi_grad_rms_first_10k'], '.2g')} → {fmt(r['phi_grad_rms_last_10k'], '.2g')} |")  # fmt: skip
    print("\n| arm | seeds | training, last 100, per seed | mean | evaluation per seed | mean |")
    print("|---|---|---|---|---|---|")
    for arm in dict.fromkeys((r["arm"], r["earlier"]) for r in rows):
        group = [r for r in rows if (r["arm"], r["earlier"]) == arm]
        evals, trains = [r["eval_mean"] for r in group], [r["train_last_100"] for r in group]
        print(f"| {arm[0]}{' (earlier)' if arm[1] else ''} | {', '.join(str(r['seed']) for r in group)} | "
              f"{', '.join(f'{v:.1f}' for v in trains)} | {statistics.mean(trains):.1f} | "
              f"{', '.join(f'{v:.1f}' for v in evals)} | {statistics.mean(evals):.1f} |")  # fmt: skip
    print("\nExact permutation tests, training return (last 100 episodes), one value per seed:")
    print("| Soft MoE arm | baseline | seeds | means | one-sided p (above) | two-sided p | smallest one-sided p |")
    print("|---|---|---|---|---|---|---|")
    for arm_a, arm_b in COMPARISONS:
        a, b = ([r["train_last_100"] for r in rows if r["arm"] == arm and not r["earlier"]] for arm in (arm_a, arm_b))
        if len(a) >= 2 and len(b) >= 2:
            one, two, least = exact_permutation_p(a, b)
            print(f"| {arm_a} | {arm_b} | {len(a)} v {len(b)} | {statistics.mean(a):.1f} v {statistics.mean(b):.1f} | "
                  f"{one:.3g} | {two:.3g} | {least:.3g} |")  # fmt: skip
    print("\nTraining return per iteration of 10k steps:")
    for r in rows:
        if not r["earlier"]:
            print(f"{r['run']}: {r['iteration_returns']}")
    plot([(r, summary, s) for r, (_, _, summary, s) in zip(rows, runs, strict=True) if not r["earlier"]],
         os.path.join(HERE, "study.png"))  # fmt: skip
    print(f"\nwrote {os.path.join(HERE, 'summary.csv')} and {os.path.join(HERE, 'study.png')}")


if __name__ == "__main__":
    main()
