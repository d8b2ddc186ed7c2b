"""A checkpoint with its replay memory, small enough to commit: the frames are left out and played again from the
emulator when the checkpoint is unpacked.

    python benchmark/compact_checkpoint.py pack runs/<run>/rainbow_softmoe.pt resume/<name>
    python benchmark/compact_checkpoint.py unpack resume/<name> runs/<restored>/rainbow_softmoe.pt
    python <script> ... --resume runs/<restored>/rainbow_softmoe.pt

A run with --save-model --checkpoint-replay keeps ~7 kB per transition beside its checkpoint (0.7 GB at 100k steps):
too big for git, so a long run that spans machines would start again. The frames are 99.9% of it and they are a
function of the actions: ALE's emulator is deterministic given its seed, each segment of a run (its start and every
--resume) begins with `envs.reset(seed=args.seed)`, and every row of the replay memory is one step of the envs. `pack`
keeps everything else (networks, optimiser, counters, generators, episodes, the replay memory's actions, rewards,
flags and priorities) with the rows where each segment began (read along the chain of --resume checkpoints) and a
SHA-256 of the frames. `unpack` steps a fresh emulator through each segment with the stored actions, sending what
the script sent (action 0 during a no-op start, whose length is the run of unlearnable rows it left), checks every
row's reward and flags against the packed ones and the frames against the hash, and writes the checkpoint and its
replay file as the script does, so that --resume goes on exactly as from the original.

For `rainbow_softmoe.py` runs of one env whose replay memory has not wrapped (Atari 100k: 1M rows hold every step).
Packing follows the --resume chain back to the run's start, or to an unpacked checkpoint (which keeps the rows where
its segments began), so the checkpoints and replay files on the way must still exist. The networks and Adam's moments
stay whole: 4.7 MB for Impala + Soft MoE with 8 experts, 25 MB for the Impala baseline (2.1M parameters), added to
git history by each pack committed.
"""

import argparse
import dataclasses
import hashlib
import importlib
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "algos"))

STATE, REPLAY = "state.pt", "replay.npz"
FORMAT = "rainbow_softmoe/2"  # the checkpoints this tool reads: the script's format, which names the script
script = importlib.import_module(FORMAT.split("/")[0])
from envs import atari, exit_if_damaged  # noqa: E402  (the script put the repository root on sys.path)


def load(path: str) -> dict:
    """A rainbow_softmoe.py checkpoint (or a pack's state.pt), or a one-line error."""
    exit_if_damaged(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"error: {path!r}: no such file") from None
    except Exception as err:  # noqa: BLE001  (any unpickling failure: not a checkpoint)
        raise SystemExit(f"error: {path!r} is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise SystemExit(f"error: {path!r} is not a {FORMAT} checkpoint ({found})")
    return ckpt


def replay_count(ckpt: dict, path: str) -> int:
    """The rows written to the replay memory saved with the checkpoint at `path`."""
    if "segment_starts" in ckpt:  # an unpacked checkpoint knows its own
        return int(ckpt["replay_rows"])
    if not ckpt.get("replay"):
        raise SystemExit(f"error: {path!r} was saved without its replay memory; run with --checkpoint-replay")
    try:
        with np.load(os.path.join(os.path.dirname(path), ckpt["replay"])) as data:
            return int(data["pointers"][1])
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt)
        raise SystemExit(
            f"error: the replay file of {path!r}, {ckpt['replay']!r}, is missing or unreadable "
            f"({type(err).__name__}): the row where the next segment began is unknown"
        ) from None


def segment_starts(ckpt: dict, path: str) -> list[int]:
    """The replay rows at which the run's segments began: 0, then the rows held by each checkpoint resumed from."""
    if "segment_starts" in ckpt:
        return list(ckpt["segment_starts"])
    before = ckpt["args"].get("resume")
    if not before:
        return [0]
    if not os.path.exists(before):
        raise SystemExit(f"error: {path!r} resumed from {before!r} (relative to {os.getcwd()!r}), which is gone: the "
                         "rows where its segments began cannot be recovered")  # fmt: skip
    previous = load(before)
    return segment_starts(previous, before) + [replay_count(previous, before)]


def pack(checkpoint: str, out: str):
    ckpt = load(checkpoint)
    if not ckpt.get("replay"):
        raise SystemExit(f"error: {checkpoint!r} was saved without its replay memory; run with --checkpoint-replay")
    packed = os.path.join(out, STATE)
    if os.path.exists(packed):
        before, run = load(packed), ("exp_name", "env_id", "seed")
        if (theirs := [before["args"].get(k) for k in run]) != [ckpt["args"].get(k) for k in run]:
            other = ", ".join(map(str, theirs))
            raise SystemExit(f"error: {out!r} holds the pack of another run ({other}); pack elsewhere")
        if before["global_step"] > ckpt["global_step"]:
            raise SystemExit(f"error: {out!r} holds a later step than {checkpoint!r} ({ckpt['global_step']:,}); "
                             "unpack it to go on, or pack elsewhere")  # fmt: skip
    try:
        replay = script.load_replay(checkpoint, ckpt["replay"])
    except ValueError as err:  # a running script replaces its checkpoint and replay file every --write-every-minutes
        message = str(err).removeprefix("--resume: ")
        raise SystemExit(f"error: {message} (if the run is going on, it was writing a newer one: pack again)") from None
    cursor, count, rows, num_envs = (int(v) for v in replay["pointers"])
    if num_envs != 1 or cursor != count or count >= rows:
        raise SystemExit(f"error: {checkpoint!r}: packing needs one env and a replay memory that has not wrapped "
                         f"({num_envs} envs, {count:,} of {rows:,} rows, next row {cursor:,})")  # fmt: skip
    state = {k: v for k, v in ckpt.items() if k != "replay"}
    state["target_is_online"] = all(torch.equal(v, state["target_net"][k]) for k, v in state["q_net"].items())
    if state["target_is_online"]:
        del state["target_net"]
    state |= {"segment_starts": segment_starts(ckpt, checkpoint), "replay_rows": count,
              "frames_sha256": hashlib.sha256(replay["frames"]).hexdigest()}  # fmt: skip
    os.makedirs(out, exist_ok=True)
    torch.save(state, os.path.join(out, f"{STATE}.tmp"))
    with open(os.path.join(out, f"{REPLAY}.tmp"), "wb") as f:
        arrays = {k: v for k, v in replay.items() if k != "frames"}
        np.savez_compressed(f, packed_step=np.array(ckpt["global_step"]), **arrays)  # pairs it with state.pt
    for name in (STATE, REPLAY):  # both written before either replaces the older pair
        os.replace(os.path.join(out, f"{name}.tmp"), os.path.join(out, name))
    size = sum(os.path.getsize(os.path.join(out, n)) for n in (STATE, REPLAY)) / 1e6
    print(f"{out}: step {ckpt['global_step']:,}, {count:,} replay rows in {len(state['segment_starts'])} segment(s), "
          f"{size:.1f} MB")  # fmt: skip


class NoopLengths:
    """Stands in for the run's generator in EpisodeTracker: a no-op start's length is the run of unlearnable rows
    from the row it begins at (capped at the largest draw; where the episode ended within it, any larger length
    plays the same steps)."""

    def __init__(self, valid: np.ndarray, start: int, end: int):
        self.valid, self.row, self.end = valid, start, end

    def integers(self, low, high, size):
        learnable = np.flatnonzero(self.valid[self.row : self.end])
        length = learnable[0] if len(learnable) else self.end - self.row
        return np.full(size, min(length, high - 1), dtype=np.int64)


def replay_frames(args, arrays: dict, starts: list[int], count: int) -> np.ndarray:
    """Every segment stepped again from `envs.reset(seed=args.seed)`; each row's reward and flags must match."""
    frames = np.zeros((count, 1, *atari.FRAME_SHAPE), dtype=np.uint8)
    for start, end in zip(starts, [*starts[1:], count], strict=True):
        resumed_after = end < count  # a segment resumed from: its last row is unlearnable and has no successor
        envs = atari.make_env(args.protocol, atari.game_from_env_id(args.env_id), 1, args.max_episode_frames)
        obs, info = envs.reset(seed=args.seed)
        lengths = NoopLengths(arrays["valid"][:, 0], start, end - resumed_after)  # --resume, not a no-op, made it so
        tracker = atari.EpisodeTracker(1, args.protocol, info, lengths, args.truncation_is_terminal)  # as main() does
        for row in range(start, end):
            frames[row] = obs[:, -1]
            sent = tracker.actions(arrays["actions"][row].astype(np.int64))
            obs, rewards, terminated, truncated, info = envs.step(sent)
            lengths.row = row + 1
            step = tracker.step(rewards, terminated, truncated, info)
            if resumed_after and row == end - 1:  # whatever was sent there, no learning sample reads this row
                continue
            got = {
                "rewards": np.clip(rewards, -1, 1),
                "terminals": step.terminal,
                "history": step.history,
                "valid": step.valid,
            }
            for name, value in got.items():
                if not np.array_equal(np.asarray(value, dtype=arrays[name].dtype), arrays[name][row]):
                    envs.close()
                    raise SystemExit(f"error: replay row {row:,} ({name}) differs from the packed one: the emulator "
                                     "does not play this run again (another ale-py or ROM?)")  # fmt: skip
        envs.close()
    return frames


def unpack(packed: str, checkpoint: str):
    if os.path.exists(checkpoint):
        raise SystemExit(f"error: {checkpoint!r} exists; unpack to a new path (a checkpoint is never overwritten)")
    state = load(os.path.join(packed, STATE))
    exit_if_damaged(os.path.join(packed, REPLAY))
    try:
        with np.load(os.path.join(packed, REPLAY), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        if missing := sorted({*script.FrameReplay.FIELDS, "pointers", "packed_step"} - {"frames", *arrays}):
            raise ValueError(f"no {', '.join(missing)} array")
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt)
        raise SystemExit(
            f"error: {os.path.join(packed, REPLAY)!r} is missing or corrupt ({type(err).__name__}: {err})"
        ) from None
    if int(arrays.pop("packed_step")) != state["global_step"] or int(arrays["pointers"][1]) != state["replay_rows"]:
        raise SystemExit(f"error: {packed!r}: its state.pt and replay.npz come from different packs; pack again")
    fields = {f.name for f in dataclasses.fields(script.Args)}
    args = script.Args(**{k: v for k, v in state["args"].items() if k in fields})
    count = int(state["replay_rows"])
    frames = replay_frames(args, arrays, state["segment_starts"], count)
    if hashlib.sha256(frames).hexdigest() != state["frames_sha256"]:
        raise SystemExit("error: the frames played again differ from the packed run's (another ale-py or ROM?)")
    if state.pop("target_is_online"):
        state["target_net"] = state["q_net"]
    os.makedirs(os.path.dirname(checkpoint) or ".", exist_ok=True)
    replay_file = script.replay_path(checkpoint, state["global_step"])
    with open(f"{replay_file}.tmp", "wb") as f:
        np.savez(f, frames=frames, **arrays)
    os.replace(f"{replay_file}.tmp", replay_file)
    state["replay"] = os.path.basename(replay_file)
    torch.save(state, f"{checkpoint}.tmp")
    os.replace(f"{checkpoint}.tmp", checkpoint)
    print(f"{checkpoint}: step {state['global_step']:,}, {count:,} replay rows played again and checked")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="checkpoint -> folder of state.pt and replay.npz (no frames)")
    p.add_argument("checkpoint")
    p.add_argument("out")
    u = sub.add_parser("unpack", help="folder -> checkpoint and replay file that --resume takes")
    u.add_argument("packed")
    u.add_argument("checkpoint")
    cli = parser.parse_args()
    if cli.command == "pack":
        pack(cli.checkpoint, cli.out)
    else:
        unpack(cli.packed, cli.checkpoint)


if __name__ == "__main__":
    main()
