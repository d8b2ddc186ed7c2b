"""The run's resumable state, small enough to commit: a td_lambda_tetris.py checkpoint without its per-episode history.

    python milestone.py pack runs/<run>/td_lambda_tetris.pt state.npz      # what gets committed (~4 MB at 40 runs)
    python milestone.py unpack state.npz resume.pt                         # then: bash command.sh --resume resume.pt
    python milestone.py split state.npz <folder>                           # one process's runs as two processes
    python milestone.py rates train_log.txt rates.csv                     # placements/s over the run, per segment

Table 1, its tests and Fig. 2 from packs or checkpoints: settle.py.

A checkpoint holds every episode's score and length (40 runs x 200k episodes: ~100 MB at the end), too much for git.
`pack` keeps everything that training reads (the learner's parameters and traces, the games in progress, the random
generator, the episode counters), bit for bit, and of the history only what the results need: the sums of the score,
its square and the length over every complete 1,000-episode block (the learning curve, Fig. 2), and the raw scores and
lengths from the last block boundary at least 1,000 episodes back (the final-1,000 table). `unpack` writes a checkpoint
that resumes the run exactly; in it, the episodes of a summed block alternate between its mean score plus and minus its
sd over episodes (the block's sum and square sum kept, so a later `pack` writes the same sums), with lengths that keep
its placements: per-block means, sds and totals are right, per-episode values inside those blocks are not.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from envs import exit_if_damaged  # noqa: E402

BLOCK = 1000  # even, so that unpack's mean +- sd filling keeps a block's sum and square sum


def tail_start(episodes: np.ndarray) -> np.ndarray:
    """Per run, the first episode kept raw: the last block boundary at least BLOCK episodes before the end."""
    return np.maximum((episodes - BLOCK) // BLOCK * BLOCK, 0)


def pack(ckpt_path: str, out: str):
    exit_if_damaged(ckpt_path)
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
    exit_if_damaged(path)
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    episodes, start, sums = z["episodes"], z["tail_start"], z["block_sums"]
    R, capacity = len(episodes), int(episodes.max())
    scores, lengths = np.zeros((R, capacity), np.float32), np.zeros((R, capacity), np.int64)
    for r in range(R):
        b = start[r] // BLOCK
        mean = sums[0, r, :b] / BLOCK
        sd = np.sqrt(np.maximum(sums[1, r, :b] / BLOCK - mean**2, 0.0))  # mean +- sd, alternating: both sums kept
        scores[r, : start[r]] = (mean[:, None] + sd[:, None] * np.resize([1.0, -1.0], BLOCK)).reshape(-1)
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


def split(path: str, out_dir: str):
    """Two packs of half the runs each, for two processes on two cores: per activation, the runs of seeds
    seed .. seed+h-1 and seed+h .. seed+n-1 (h = n/2; activation i owns rows i n .. (i+1) n - 1 of every array). Every
    run's state is its own rows, bit for bit. The batch draws its pieces from one generator, so the halves cannot both
    continue it: the first keeps it; the second starts the generator of its first seed (as `--seed seed+h` would in a
    fresh process), so the two processes draw different pieces. Each pack resumes with --seed and --num-runs h."""
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    n, seed, acts = meta["num_runs"], meta["args"]["seed"], meta["architecture"]["activation"].split("+")
    if n % 2 or meta["device"] != "cpu":
        raise SystemExit(f"error: {path} holds {n} runs per activation on {meta['device']}; split needs an even "
                         "number on cpu (the generator's state is per device type)")  # fmt: skip
    h = n // 2
    outs = [os.path.join(out_dir, f"state_runs{s}_{s + h - 1}.npz") for s in (seed, seed + h)]
    if taken := [o for o in outs if os.path.exists(o)]:
        raise SystemExit(f"error: {', '.join(taken)} already there; split into another folder")
    os.makedirs(out_dir, exist_ok=True)
    for k, (first, out) in enumerate(zip((seed, seed + h), outs, strict=True)):
        rows = np.concatenate([np.arange(i * n + k * h, i * n + (k + 1) * h) for i in range(len(acts))])
        arrays = {name: z[name][rows] for name in z.files if name.split("/")[0] in RUN_ROWS}
        arrays["block_sums"] = z["block_sums"][:, rows]
        rng = z["rng"] if k == 0 else torch.Generator().manual_seed(first).get_state().numpy()
        part = meta | {"num_runs": h, "args": meta["args"] | {"seed": first, "num_runs": h}}
        np.savez_compressed(out, rng=rng, meta=np.array(json.dumps(part)), **arrays)
        print(f"{out}: runs {first}-{first + h - 1} of each activation, episodes {arrays['episodes'].min():,}-"
              f"{arrays['episodes'].max():,}; resume with --seed {first} --num-runs {h}")  # fmt: skip


RUN_ROWS = ("episodes", "tail_start", "tail_scores", "tail_lengths", "traces", "games")  # a pack's arrays by run


def rates(log_path: str, out: str):
    """placements/s over the run from the training log: per window of ~10 minutes of each segment (a process from its
    start or resume to its end; its progress lines count placements and time from that start), to `out` as CSV, and
    one line per segment."""
    import re

    segments, line = [], re.compile(r"episodes ([\d,]+)/.*\| placements ([\d,]+) \| ([\d,]+) placements/s")
    for text in open(log_path):
        if " run(s) each of " in text:  # a process's first line
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
    commands = {"pack": pack, "unpack": unpack, "split": split, "rates": rates}
    if len(sys.argv) != 4 or sys.argv[1] not in commands:
        raise SystemExit(__doc__)
    commands[sys.argv[1]](sys.argv[2], sys.argv[3])
