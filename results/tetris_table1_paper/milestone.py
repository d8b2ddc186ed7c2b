"""The run's resumable state, small enough to commit: a td_lambda_tetris.py checkpoint without its per-episode history.

    python milestone.py pack runs/<run>/td_lambda_tetris.pt state.npz      # what gets committed (~4 MB at 40 runs)
    python milestone.py unpack state.npz resume.pt                         # then: bash command.sh --resume resume.pt
    python milestone.py table runs/<run>/td_lambda_tetris.pt 25000          # the table and Fig. 2 at episode 25,000
    python milestone.py rates train_log.txt rates.csv                     # placements/s over the run, per segment

A checkpoint holds every episode's score and length (40 runs x 200k episodes: ~100 MB at the end), too much for git.
`pack` keeps everything that training reads (the learner's parameters and traces, the games in progress, the random
generator, the episode counters), bit for bit, and of the history only what the results need: the sums of the score,
its square and the length over every complete 1,000-episode block (the learning curve, Fig. 2), and the raw scores and
lengths from the last block boundary at least 1,000 episodes back (the final-1,000 table). `unpack` writes a checkpoint
that resumes the run exactly; in it, the episodes of the summed blocks hold their block's mean score and lengths that
keep the block's placements (so per-block means and totals are right, per-episode values inside those blocks are not).
"""

import itertools
import json
import math
import os
import sys

import numpy as np
import torch

BLOCK = 1000


def tail_start(episodes: np.ndarray) -> np.ndarray:
    """Per run, the first episode kept raw: the last block boundary at least BLOCK episodes before the end."""
    return np.maximum((episodes - BLOCK) // BLOCK * BLOCK, 0)


def pack(ckpt_path: str, out: str):
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    if "state" not in ckpt:
        raise SystemExit(f"error: {ckpt_path} has no resume state (written before checkpoints resumed exactly)")
    episodes = ckpt["episodes"].numpy()
    scores, lengths = ckpt["scores"].numpy().astype(np.float64), ckpt["lengths"].numpy()
    start = tail_start(episodes)
    blocks = int(start.max()) // BLOCK
    R = len(episodes)
    sums = np.zeros((3, R, blocks))  # score, score^2, length per complete block before the tail
    width = int((episodes - start).max())
    tail_scores, tail_lengths = np.zeros((R, width), np.float32), np.zeros((R, width), np.int64)
    for r in range(R):
        b = start[r] // BLOCK
        sc, ln = scores[r, : start[r]].reshape(b, BLOCK), lengths[r, : start[r]].reshape(b, BLOCK)
        sums[0, r, :b], sums[1, r, :b], sums[2, r, :b] = sc.sum(1), (sc**2).sum(1), ln.sum(1)
        n = episodes[r] - start[r]
        tail_scores[r, :n] = ckpt["scores"][r, start[r] : episodes[r]]
        tail_lengths[r, :n] = lengths[r, start[r] : episodes[r]]
    state = ckpt["state"]
    arrays = {f"traces/{k}": v.numpy() for k, v in state["traces"].items()}
    arrays.update({f"games/{k}": v.numpy() for k, v in state["games"].items()})
    meta = {k: ckpt[k] for k in ("format", "architecture", "num_runs", "env_id", "args")}
    meta["device"] = state["device"]
    np.savez_compressed(
        out, rng=state["rng"].numpy(), episodes=episodes, block_sums=sums, tail_start=start,
        tail_scores=tail_scores, tail_lengths=tail_lengths, meta=np.array(json.dumps(meta)), **arrays,
    )  # fmt: skip
    print(f"{out}: episodes per run {episodes.min():,}-{episodes.max():,}, {blocks} summed blocks")


def unpack(path: str, out: str):
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    episodes, start, sums = z["episodes"], z["tail_start"], z["block_sums"]
    R, capacity = len(episodes), int(episodes.max())
    scores, lengths = np.zeros((R, capacity), np.float32), np.zeros((R, capacity), np.int64)
    for r in range(R):
        b = start[r] // BLOCK
        scores[r, : start[r]] = np.repeat(sums[0, r, :b] / BLOCK, BLOCK)
        q, extra = np.divmod(sums[2, r, :b].astype(np.int64), BLOCK)  # lengths summing to each block's placements
        lengths[r, : start[r]] = (q[:, None] + (np.arange(BLOCK) < extra[:, None])).reshape(-1)
        n = episodes[r] - start[r]
        scores[r, start[r] : episodes[r]] = z["tail_scores"][r, :n]
        lengths[r, start[r] : episodes[r]] = z["tail_lengths"][r, :n]
    traces = {k.split("/", 1)[1]: torch.from_numpy(z[k]) for k in z.files if k.startswith("traces/")}
    games = {k.split("/", 1)[1]: torch.from_numpy(z[k]) for k in z.files if k.startswith("games/")}
    if "table" in traces:  # the shallow learner: theta = U + A E, as ShallowTD.parameters computes it
        table, v, A = traces["table"], traces["v"], traces["A"]
        Hd = v.shape[1] - 1
        F_ = table.shape[1] - 1
        W = torch.addcmul(table[..., :Hd], table[..., Hd:], A.view(-1, 1, 1))
        params = {"W1": W[:, :F_], "b1": W[:, F_], "w2": v[:, :Hd], "b2": v[:, Hd]}
    else:
        raise SystemExit("error: only the shallow network's state is packed")
    ckpt = {
        **{k: meta[k] for k in ("format", "architecture", "num_runs", "env_id", "args")},
        "params": {k: t.clone() for k, t in params.items()},
        "episodes": torch.from_numpy(episodes),
        "scores": torch.from_numpy(scores),
        "lengths": torch.from_numpy(lengths),
        "state": {"traces": traces, "games": games, "rng": torch.from_numpy(z["rng"]), "device": meta["device"]},
    }
    torch.save(ckpt, out)
    print(f"{out}: resumes at episodes {episodes.min():,}-{episodes.max():,} per run")


# Table 1: final average score (mean ± sd) and final best score (the best run's mean ± the sd of its episodes)
PAPER = {
    "dsilu": (263, 80, 320, 87),
    "sigmoid": (232, 75, 293, 73),
    "silu": (214, 74, 253, 83),
    "relu": (191, 58, 227, 76),
}


def table(ckpt_path: str, at: str):
    """Table 1 at episode `at` of every run (its episodes at-1000 .. at-1), beside the paper's (mean ± sd, best run ±
    sd), the ordering with the z of each gap, and Fig. 2 (mean score per 1,000 episodes up to `at`: each activation's
    mean of the runs, and each run) as CSV and PNG here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ckpt, at = torch.load(ckpt_path, map_location="cpu", weights_only=True), int(at)
    if int(ckpt["episodes"].min()) < at:
        raise SystemExit(
            f"error: the slowest run of {ckpt_path} is at episode {int(ckpt['episodes'].min()):,} < {at:,}"
        )
    scores, n = ckpt["scores"][:, :at].double().numpy(), ckpt["num_runs"]
    acts = ckpt["architecture"]["activation"].split("+")
    rows = [
        "| activation | ours: mean ± sd (episodes) | sd over runs | best run ± sd (episodes) | paper: mean ± sd "
        "| paper best ± sd | within the paper's mean ± sd (gap; z over runs) |",
        "|---|---|---|---|---|---|---|",
    ]
    run_means, episodes = {}, {}
    curves = {"episode": np.arange(1000, at + 1, 1000)}
    # top: the mean of the runs, every activation; below: each activation's runs (Fig. 2's thin dashed lines)
    fig, axes = plt.subplot_mosaic([["mean"] * len(acts), acts], figsize=(9, 7), height_ratios=[3, 2], sharey=True)
    ax = axes["mean"]
    for k, act in enumerate(acts):
        last = scores[k * n : (k + 1) * n, at - 1000 :]  # (runs, 1000)
        per_run = last.mean(1)
        mean, best = per_run.mean(), per_run.argmax()
        p = PAPER[act]
        run_means[act], episodes[act] = per_run, last.ravel()
        inside = "yes" if abs(mean - p[0]) <= p[1] else "no"
        z_paper = (mean - p[0]) / (per_run.std(ddof=1) / np.sqrt(n))  # against the paper's mean, over our runs
        rows.append(
            f"| {act} | {mean:.1f} ± {last.std():.1f} | {per_run.std():.1f} "
            f"| {per_run[best]:.1f} ± {last[best].std():.1f} | {p[0]} ± {p[1]} | {p[2]} ± {p[3]} "
            f"| {inside} ({mean - p[0]:+.1f}; z {z_paper:+.1f}) |"
        )
        per_block = scores[k * n : (k + 1) * n].reshape(n, -1, 1000).mean(2)  # (runs, blocks)
        curve = curves[act] = per_block.mean(0)
        (line,) = ax.plot(curves["episode"], curve, lw=2, label=f"{act} ({n} runs; final {mean:.0f}, paper {p[0]})")
        for r in range(n):
            curves[f"{act}_run{r}"] = per_block[r]
            axes[act].plot(curves["episode"], per_block[r], color=line.get_color(), ls="--", lw=0.6)
        for a in (ax, axes[act]):
            a.axhline(p[0], color=line.get_color(), ls=":", lw=1)
        axes[act].set_title(f"{act}: {n} runs", fontsize=8)
        axes[act].set_xlabel("episode", fontsize=8)
        axes[act].tick_params(labelsize=7)
    print("\n".join(rows))
    # the ordering, and the z of each neighbouring gap: difference of the means over its standard error, with the run
    # means as the samples (n runs each; the honest test, as a run's episodes are not independent of each other), and
    # with the episodes pooled (n x 1,000 each; the paper reports "p < 0.0001" between all four without naming its
    # test or sample, and pooled episodes give p values of that size where 10 run means would need tight runs)
    order = sorted(run_means, key=lambda a: -run_means[a].mean())
    gaps = []
    for a, b in itertools.pairwise(order):
        z = [
            (x.mean() - y.mean()) / np.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))
            for x, y in ((run_means[a], run_means[b]), (episodes[a], episodes[b]))
        ]
        p_pooled = math.erfc(z[1] / 2**0.5) / 2  # one-sided, normal approximation (10,000 episodes a side)
        gaps.append(f"{a} > {b} (z {z[0]:.1f} over runs; {z[1]:.1f} over pooled episodes, p {p_pooled:.0e})")
    print(f"ordering: {', '.join(gaps)}; the paper's: dsilu > sigmoid > silu > relu")
    here = os.path.dirname(os.path.abspath(__file__))
    names = ["episode", *acts] + [k for k in curves if "_run" in k]  # the means first, then every run
    np.savetxt(os.path.join(here, "learning_curves.csv"), np.column_stack([curves[k] for k in names]), fmt="%.3f",
               delimiter=",", header=",".join(names), comments="")  # fmt: skip
    ax.set(xlabel="episode", ylabel="mean score per 1,000 episodes")
    axes[acts[0]].set_ylabel("per run", fontsize=8)
    ax.set_title(
        f"SZ-Tetris, shallow, {at:,} of 200,000 episodes per run (dotted: the paper's final score)", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(here, "learning_curves.png"), dpi=110)


def rates(log_path: str, out: str):
    """placements/s over the run from the training log: per window of ~10 minutes of each segment (a process from its
    start or resume to its end; its progress lines count placements and time from that start), to `out` as CSV, and
    one line per segment."""
    import re

    segments, line = [], re.compile(r"episodes ([\d,]+)/.*\| placements ([\d,]+) \| ([\d,]+) placements/s")
    for text in open(log_path):
        if ": 10 run(s) each of" in text:  # a process's first line
            segments.append([])
        elif m := line.match(text):
            episode, placements, rate = (int(g.replace(",", "")) for g in m.groups())
            segments[-1].append((episode, placements / max(rate, 1), placements))  # (episode, seconds, placements)
    rows = []
    for k, points in enumerate(segments):
        if not points:
            continue
        last = (points[0][0], 0.0, 0)
        for episode, t, placements in points:
            if t - last[1] >= 600 or (episode, t, placements) == points[-1]:
                rows.append((k, last[0], episode, t, placements, (placements - last[2]) / max(t - last[1], 1e-9)))
                last = (episode, t, placements)
        (e0, _, _), (e1, t1, p1) = points[0], points[-1]
        print(f"segment {k}: episodes {e0:,}-{e1:,} of the slowest run, {t1:,.0f} s, {p1:,} placements, "
              f"{p1 / t1:,.0f} placements/s")  # fmt: skip
    with open(out, "w") as f:
        f.write("segment,episode_from,episode_to,seconds_in_segment,placements_in_segment,placements_per_s\n")
        f.writelines(f"{k},{a},{b},{t:.0f},{p},{r:.0f}\n" for k, a, b, t, p, r in rows)


if __name__ == "__main__":
    commands = {"pack": pack, "unpack": unpack, "table": table, "rates": rates}
    if len(sys.argv) != 4 or sys.argv[1] not in commands:
        raise SystemExit(__doc__)
    commands[sys.argv[1]](sys.argv[2], sys.argv[3])
