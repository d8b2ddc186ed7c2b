"""benchmark/replay_to_dataset.py: the DQN Replay Dataset written from a run's replay memory holds every transition the
agent acted in, once, in the order and format an in-run logger of the dataset writes them (padding rows, terminal
episode ends, the time-limit cut, lost lives, reset steps left out), and cql_softmoe.py reads it."""

import gzip
import os
from dataclasses import replace

import numpy as np
import pytest
import torch

import cql_softmoe as cql
import dqn_softmoe as dqn
from benchmark import replay_to_dataset as convert
from envs import atari


def play(steps: int, capacity: int, num_envs: int = 2, seed: int = 3):
    """Random Breakout play stored as the training loop stores it (the nature protocol: lost lives are terminal; 400
    frames per episode: many time-limit cuts), and the episodes as the dataset must hold them, in the order they end:
    each a list of (frame, action, clipped reward, terminal), the episodes still running at the end cut (terminal)."""
    args = dqn.Args(env_id="ALE/Breakout-v5", protocol="nature", num_envs=num_envs, max_episode_frames=400)
    envs = atari.make_env(args.protocol, "breakout", num_envs, args.max_episode_frames)
    replay, rng = dqn.FrameReplay(capacity, num_envs), np.random.default_rng(seed)
    obs, info = envs.reset(seed=seed)
    tracker = atari.EpisodeTracker(num_envs, args.protocol, info)
    running, ended, first_row, cuts = [[] for _ in range(num_envs)], [], {}, 0
    for t in range(steps):
        actions = rng.integers(0, envs.single_action_space.n, size=num_envs).astype(np.int32)
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        step = tracker.step(reward, terminated, truncated, info)
        clipped = np.clip(reward, -1, 1)
        replay.add(frames=obs[:, -1], actions=actions, rewards=clipped, terminals=step.terminal, valid=step.valid,
                   history=step.history)  # fmt: skip
        for k in np.flatnonzero(step.acted):
            end = bool(step.terminal[k] or not step.valid[k])
            cuts += not step.terminal[k] and not step.valid[k]
            first_row.setdefault(k, t)
            running[k].append((obs[k, -1].copy(), int(actions[k]), float(clipped[k]), end))
            if end:
                ended.append((first_row.pop(k), running[k]))
                running[k] = []
        obs = tracker.agent_view(next_obs)
    envs.close()
    for k, rows in enumerate(running):
        if rows:
            ended.append((first_row.pop(k), rows[:-1] + [rows[-1][:3] + (True,)]))
    assert cuts > 0  # the time-limit cut ends an episode terminal, as in the DQN Replay Dataset
    return replay, ended


def read(directory) -> list:
    """The dataset's files in order: (frames, actions, rewards, terminals, add_count, invalid_range) of each."""
    files = []
    while os.path.exists(os.path.join(directory, f"add_count_ckpt.{len(files)}.gz")):
        names = ("$store$_observation", "$store$_action", "$store$_reward", "$store$_terminal", "add_count",
                 "invalid_range")  # fmt: skip
        files.append([np.load(gzip.open(os.path.join(directory, f"{n}_ckpt.{len(files)}.gz"))) for n in names])
    return files


def episodes_written(files) -> list:
    """The dataset's rows up to the last file's add_count, split into episodes after their 3 padding rows."""
    rows = []
    for i, (frames, actions, rewards, terminals, add_count, _) in enumerate(files):
        n = int(add_count) if i == len(files) - 1 else len(frames)
        rows += list(zip(frames[:n], actions[:n], rewards[:n], terminals[:n], strict=True))
    episodes, t = [], 0
    while t < len(rows):
        assert all(not f.any() and not a and not r and not d for f, a, r, d in rows[t : t + 3])  # padding
        t += 3
        episode = []
        while True:
            episode.append(rows[t])
            t += 1
            if episode[-1][3]:
                break
        episodes.append(episode)
    return episodes


def same(written, expected) -> bool:
    return len(written) == len(expected) and all(
        len(w) == len(e) and all(np.array_equal(a[0], b[0]) and a[1:] == b[1:] for a, b in zip(w, e, strict=True))
        for w, e in zip(written, expected, strict=True)
    )


def test_every_acted_transition_is_written_once_in_the_order_its_episode_ended(tmp_path):
    replay, ended = play(steps=500, capacity=2 * 600)
    episodes = [(10, 1.0, 5), (20, 2.0, 6)]
    done = convert.convert(replay.state_dict(), episodes, str(tmp_path / "data"), rows_per_file=200, n_step=3)
    assert not done["memory_full"] and done["transitions"] == sum(len(rows) for _, rows in ended)
    files = read(tmp_path / "data")
    assert len(files) == done["files"] > 2
    written = [[(f, int(a), float(r), bool(d)) for f, a, r, d in episode] for episode in episodes_written(files)]
    assert same(written, [rows for _, rows in ended])
    total = sum(len(rows) + 3 for _, rows in ended)  # 3 padding rows before each episode
    for i, (*_, add_count, invalid) in enumerate(files):  # full files count every row so far; the last its own rows
        assert int(add_count) == (200 * (i + 1) if i < len(files) - 1 else total - 200 * i)
        cursor = int(add_count) % 200
        assert invalid.tolist() == [(cursor - 3 + j) % 200 for j in range(4 + 3)]
    with open(tmp_path / "data" / "behaviour_episodes.csv") as f:
        assert f.read().splitlines() == ["global_step,return,length", "10,1.0,5", "20,2.0,6"]
    # cql_softmoe.py reads it: the stacks it samples start after the padding and never show a padding frame last
    args = cql.Args(env_id="ALE/Breakout-v5", dataset_dir=str(tmp_path / "data"), n_step=3, data_percent=100.0)
    data = cql.load_dataset(args, 4)
    assert len(data.indices) > 0
    assert all(data.frames[i].any() for i in data.indices)


def test_a_memory_that_wrapped_around_gives_the_episodes_that_started_in_it(tmp_path):
    steps, rows = 500, 300  # per environment: the first 200 rows are overwritten
    replay, ended = play(steps=steps, capacity=2 * rows)
    done = convert.convert(replay.state_dict(), [], str(tmp_path / "data"), rows_per_file=1000, n_step=1)
    assert done["memory_full"]
    written = [[(f, int(a), float(r), bool(d)) for f, a, r, d in e] for e in episodes_written(read(tmp_path / "data"))]
    assert same(written, [episode for first, episode in ended if first >= steps - rows])


def test_the_dataset_records_its_game_and_cql_refuses_another(tmp_path):
    replay, _ = play(steps=150, capacity=400)
    convert.convert(replay.state_dict(), [], str(tmp_path / "data"), 1000, n_step=1, env_id="ALE/Breakout-v5")
    args = cql.Args(env_id="ALE/Pong-v5", dataset_dir=str(tmp_path / "data"), data_percent=100.0)
    with pytest.raises(cql.DatasetError, match="holds ALE/Breakout-v5 data; pass --env-id ALE/Breakout-v5"):
        cql.inspect_dataset(args)
    assert cql.inspect_dataset(replace(args, env_id="ALE/Breakout-v5"))  # the same game under another spelling: read


def test_the_cli_refuses_what_is_not_a_dqn_checkpoint_with_its_replay_memory(tmp_path, monkeypatch):
    (tmp_path / "corrupt.pt").write_bytes(b"\x80\x04 not a checkpoint")
    torch.save({"format": "rainbow_softmoe/2", "replay": "x.npz"}, tmp_path / "rainbow.pt")
    torch.save({"format": "dqn_softmoe/2", "replay": "gone.npz", "args": {}}, tmp_path / "dqn.pt")
    cases = [("corrupt.pt", "is not a readable checkpoint"), ("missing.pt", "is not a readable checkpoint"),
             ("rainbow.pt", "is not a dqn_softmoe.py checkpoint"), ("dqn.pt", "gone.npz' is missing or")]  # fmt: skip
    for name, message in cases:
        monkeypatch.setattr("sys.argv", ["replay_to_dataset.py", str(tmp_path / name), "--out", str(tmp_path / "d")])
        with pytest.raises(SystemExit) as err:
            convert.main()
        assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "d").exists()
