"""An offline dataset in the DQN Replay Dataset's on-disk format (Agarwal et al. 2020: Dopamine's logged replay buffer,
as batch_rl's logged_replay_buffer.py wrote it, in the format of dopamine/tf/replay_memory/circular_replay_buffer.py)
from the replay memory that dqn_softmoe.py saves with its checkpoint (--save-model --checkpoint-replay), for
`cql_softmoe.py --dataset-dir DIR`.

    python algos/dqn_softmoe.py --env-id ALE/Breakout-v5 --encoder nature --moe none --num-envs 4 \
        --total-timesteps 500000 --buffer-size 510000 --save-model --checkpoint-replay --exp-name cql_dataset
    python benchmark/replay_to_dataset.py runs/<run>/dqn_softmoe.pt --out dataset --rows-per-file 100000

Checkpoint file N holds --rows-per-file rows: `$store$_observation_ckpt.N.gz` (uint8, rows x 84 x 84, single frames),
`$store$_action_ckpt.N.gz` (int32), `$store$_reward_ckpt.N.gz` (float32, clipped), `$store$_terminal_ckpt.N.gz`
(uint8), each a gzipped .npy, plus `add_count_ckpt.N.gz` and `invalid_range_ckpt.N.gz`. Row t is (o_t, a_t, r_{t+1},
terminal); every episode starts with three all-zero padding rows; the last row of every episode is terminal, the
time-limit cut included (the dataset's quirk: its generating agent stored every episode end as terminal); with a
life-loss protocol a lost life ends the episode. The environments' episodes follow one another in the order in which
they ended; the episodes still running at the checkpoint are written last, cut (terminal). A full file's add_count
counts every row written so far; the last, partial file sets add_count to its rows, as Dopamine's final buffer does.
behaviour_episodes.csv beside the data holds the run's episode returns (the behaviour policy's score), and
dataset.json its game (cql_softmoe.py refuses another --env-id).

What it cannot do: the memory holds the last --buffer-size transitions, so the whole run is written only when the
buffer holds all of its agent steps plus one reset step per finished episode (with 4 environments, the buffer is
shared by them); otherwise the episodes still in memory are written and the tool says how many rows were lost. At a
resume point the checkpoint has no successor for the interrupted step (the resumed run marks it invalid), so each
interrupted episode ends one step early, cut.
"""

import argparse
import csv
import gzip
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from envs import exit_if_damaged  # noqa: E402

FRAME_SHAPE, STACK = (84, 84), 4


class DatasetWriter:
    """Episodes in, checkpoint files out: single frames streamed into the observation gzip as episodes arrive."""

    def __init__(self, directory: str, rows_per_file: int, n_step: int):
        os.makedirs(directory, exist_ok=True)
        self.directory, self.rows_per_file, self.n_step = directory, rows_per_file, n_step
        self.index, self.add_count, self.stream = 0, 0, None

    def write_episode(self, rows: list):
        """rows: (frame (84, 84) uint8, action, clipped reward, terminal) of one episode, after 3 padding rows."""
        pad = (np.zeros(FRAME_SHAPE, dtype=np.uint8), 0, 0.0, False)
        for frame, action, reward, terminal in [pad] * (STACK - 1) + rows:
            if self.stream is None:
                self.open_file()
            self.stream.write(frame.tobytes())
            t = self.cursor
            self.actions[t], self.rewards[t], self.terminals[t] = action, reward, terminal
            self.cursor += 1
            self.add_count += 1
            if self.cursor == self.rows_per_file:
                self.close_file(self.add_count)

    def open_file(self):
        path = os.path.join(self.directory, f"$store$_observation_ckpt.{self.index}.gz")
        self.stream = gzip.open(path, "wb", compresslevel=1)
        header = {"descr": "|u1", "fortran_order": False, "shape": (self.rows_per_file,) + FRAME_SHAPE}
        np.lib.format.write_array_header_1_0(self.stream, header)
        self.actions = np.zeros(self.rows_per_file, dtype=np.int32)
        self.rewards = np.zeros(self.rows_per_file, dtype=np.float32)
        self.terminals = np.zeros(self.rows_per_file, dtype=np.uint8)
        self.cursor = 0

    def close_file(self, add_count: int):
        """Pad the observations to the file's rows, then write the other arrays, the add count and the rows that must
        not be sampled around the write cursor (Dopamine's invalid_range: cursor - n .. cursor + 3)."""
        self.stream.write(bytes((self.rows_per_file - self.cursor) * FRAME_SHAPE[0] * FRAME_SHAPE[1]))
        self.stream.close()
        cursor = add_count % self.rows_per_file
        invalid = (cursor - self.n_step + np.arange(STACK + self.n_step)) % self.rows_per_file
        arrays = {"$store$_action": self.actions, "$store$_reward": self.rewards, "$store$_terminal": self.terminals,
                  "add_count": np.array(add_count), "invalid_range": invalid}  # fmt: skip
        for name, array in arrays.items():
            with gzip.open(os.path.join(self.directory, f"{name}_ckpt.{self.index}.gz"), "wb", compresslevel=1) as f:
                np.save(f, array, allow_pickle=False)
        self.stream, self.index = None, self.index + 1

    def close(self):
        if self.stream is not None:
            self.close_file(self.cursor)  # the final buffer: add_count = its rows, so only rows below it are sampled


def acted_rows(terminals: np.ndarray, valid: np.ndarray, history: np.ndarray) -> np.ndarray:
    """Which rows (chronological, one env) are transitions the agent acted in. ale_py's reset steps and the Atari-100k
    no-op starts are stored invalid and are always followed by a new stack (history 0); the step cut by the time limit
    is stored invalid too, but its successor is the reset step, whose stack goes on (history > 0). The last row has no
    successor: it is a cut if its episode was still running."""
    acted = valid | terminals
    acted[:-1] |= history[1:] > 0
    if len(acted) > 1 and not (valid[-1] or terminals[-1]):
        acted[-1] = valid[-2] and not terminals[-2]
    return acted


def convert(state: dict, episodes: list, out: str, rows_per_file: int, n_step: int, env_id: str | None = None) -> dict:
    """Write the dataset of a replay memory (FrameReplay.state_dict()), and with env_id its dataset.json (the game,
    which cql_softmoe.py checks against --env-id); returns what was written."""
    cursor, count, capacity, num_envs = (int(v) for v in state["pointers"])
    order = (cursor - count + np.arange(count)) % capacity  # oldest row first
    frames, actions, rewards = state["frames"][order], state["actions"][order], state["rewards"][order]
    terminals, valid, history = state["terminals"][order], state["valid"][order], state["history"][order]
    acted = np.stack([acted_rows(terminals[:, k], valid[:, k], history[:, k]) for k in range(num_envs)], 1)
    started = np.zeros(num_envs, dtype=bool)  # the memory may begin in the middle of an episode: skip to the next
    running, writer, written = [[] for _ in range(num_envs)], DatasetWriter(out, rows_per_file, n_step), 0
    for t in range(count):
        for k in range(num_envs):  # a resume point: a new episode begins while the interrupted one has no end
            if acted[t, k] and history[t, k] == 0 and running[k]:
                running[k][-1] = running[k][-1][:3] + (True,)
                writer.write_episode(running[k])
                written, running[k] = written + len(running[k]), []
        for k in np.flatnonzero(acted[t]):
            started[k] |= history[t, k] == 0
            if not started[k]:
                continue
            end = terminals[t, k] or not valid[t, k]  # terminal, or cut by the time limit
            running[k].append((frames[t, k], int(actions[t, k]), float(rewards[t, k]), bool(end)))
            if end:
                writer.write_episode(running[k])
                written, running[k] = written + len(running[k]), []
    for rows in running:  # still running at the checkpoint: cut here, so terminal
        if rows:
            rows[-1] = rows[-1][:3] + (True,)
            writer.write_episode(rows)
            written += len(rows)
    writer.close()
    with open(os.path.join(out, "behaviour_episodes.csv"), "w", newline="") as f:
        csv.writer(f).writerows([("global_step", "return", "length"), *episodes])
    if env_id:
        with open(os.path.join(out, "dataset.json"), "w") as f:
            json.dump({"env_id": env_id, "transitions": written, "n_step": n_step}, f, indent=1)
    return {"transitions": written, "acted_rows_in_memory": int(acted.sum()), "files": writer.index,
            "memory_full": count == capacity}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="runs/<run>/dqn_softmoe.pt, saved with --checkpoint-replay")
    parser.add_argument("--out", required=True, help="a new folder for the dataset")
    parser.add_argument("--rows-per-file", type=int, default=1_000_000, help="rows per file (the dataset's 1M)")
    cli = parser.parse_args()
    if os.path.exists(os.path.join(cli.out, "add_count_ckpt.0.gz")):
        raise SystemExit(f"error: --out {cli.out!r} already holds a dataset; give a new folder")
    exit_if_damaged(cli.checkpoint)
    try:
        ckpt = torch.load(cli.checkpoint, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (missing, or any unpickling failure)
        raise SystemExit(f"error: {cli.checkpoint!r} is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or not str(ckpt.get("format", "")).startswith("dqn_softmoe/"):
        raise SystemExit(f"error: {cli.checkpoint!r} is not a dqn_softmoe.py checkpoint")
    if not ckpt.get("replay"):
        raise SystemExit(f"error: {cli.checkpoint!r} holds no replay memory; train with --checkpoint-replay")
    n_step = int(ckpt["args"].get("n_step", 1))
    if cli.rows_per_file < 2 * STACK + n_step:
        raise SystemExit(f"error: --rows-per-file must be at least {2 * STACK + n_step}")
    replay = os.path.join(os.path.dirname(cli.checkpoint), ckpt["replay"])
    try:
        with np.load(replay, allow_pickle=False) as data:
            state = {k: data[k] for k in data.files}
    except Exception as err:  # noqa: BLE001  (missing, truncated or corrupt: the zip checks each array's CRC-32)
        raise SystemExit(f"error: the replay memory {replay!r} is missing or corrupt ({type(err).__name__})") from None
    episodes = [tuple(e) for e in ckpt["episodes"]]
    done = convert(state, episodes, cli.out, cli.rows_per_file, n_step, env_id=ckpt["args"].get("env_id"))
    print(f"{cli.out}: {done['transitions']:,} transitions in {done['files']} file(s), from a checkpoint at step "
          f"{int(ckpt['global_step']):,}", file=sys.stderr)  # fmt: skip
    if done["memory_full"]:
        print(f"the replay memory was full: only its last {done['acted_rows_in_memory']:,} agent steps were kept "
              "(raise --buffer-size to keep the whole run)", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
