"""algos/cql_softmoe.py: the DQN Replay Dataset reader against files a test writes in the exact on-disk format, the CQL
penalty by hand, bad files, and smoke runs of both agents on a tiny dataset from a real game (dqn_softmoe.py's replay
memory written by benchmark/replay_to_dataset.py; its own tests are in test_replay_to_dataset.py)."""

import gzip
import inspect
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import cql_softmoe as cql
import dqn_softmoe as dqn
import rainbow_softmoe as rb
from benchmark import replay_to_dataset
from damage import flip_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "algos", "cql_softmoe.py")


# ----------------------------------------------------------------------------------------------------------------------
# A dataset written by hand in the DQN Replay Dataset's format (independently of benchmark/replay_to_dataset.py)
# ----------------------------------------------------------------------------------------------------------------------
def write_gz(path, array):
    with gzip.open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def write_checkpoint(directory, index, episodes, capacity, add_count=None, invalid_range=None, episode_id0=1):
    """Rows as Dopamine writes them: three all-zero padding rows before every episode, the episode's last row terminal.
    Frame pixel (0, 0) = episode id, (0, 1) = step + 1 within the episode; reward = step + 1; action = step % 3.
    Returns the rows (list of (episode id, step) or None for padding)."""
    frames = np.zeros((capacity, 84, 84), np.uint8)
    actions, rewards, terminals = (
        np.zeros(capacity, np.int32),
        np.zeros(capacity, np.float32),
        np.zeros(capacity, np.uint8),
    )
    rows, t = [], 0
    for e, length in enumerate(episodes):
        for _ in range(3):
            rows.append(None)
            t += 1
        for step in range(length):
            if t >= capacity:
                break
            frames[t, 0, 0], frames[t, 0, 1] = episode_id0 + e, step + 1
            actions[t], rewards[t], terminals[t] = step % 3, step + 1, step == length - 1
            rows.append((episode_id0 + e, step))
            t += 1
    os.makedirs(directory, exist_ok=True)
    for name, array in (("observation", frames), ("action", actions), ("reward", rewards), ("terminal", terminals)):
        write_gz(cql.store_path(directory, name, index), array)
    add_count = t if add_count is None else add_count
    cursor = add_count % capacity
    invalid_range = (cursor - 1 + np.arange(5)) % capacity if invalid_range is None else invalid_range
    write_gz(cql.store_path(directory, "add_count", index), np.array(add_count))
    write_gz(cql.store_path(directory, "invalid_range", index), np.asarray(invalid_range))
    return rows[:capacity]


def load(directory, n_step=1, data_percent=100.0, **kw):
    args = cql.Args(
        env_id="ALE/Breakout-v5", dataset_dir=str(directory), data_percent=data_percent, n_step=n_step, **kw
    )
    return cql.load_dataset(args, num_actions=4)


def test_loader_reads_the_on_disk_format_and_samples_only_what_dopamine_would(tmp_path):
    write_checkpoint(tmp_path, 0, [5, 2, 9, 4], capacity=40)  # a partial file: add_count 32 < 40
    write_checkpoint(tmp_path, 1, [6, 12, 3, 7], capacity=40, add_count=80, episode_id0=10)  # a full file
    replay = load(tmp_path)
    assert len(replay.frames) == 80
    allowed = set(replay.indices.tolist())
    for i in range(80):
        f, local = i // 40, i % 40
        add_count, capacity = (32, 40) if f == 0 else (80, 40)
        invalid = set((((add_count % capacity) - 1 + np.arange(5)) % capacity).tolist())
        expected = (
            local >= 3
            and local < 40 - 1
            and (f == 1 or local < add_count - 1)
            and local not in invalid
            and not replay.terminals[i - 3 : i].any()
        )
        assert (i in allowed) == expected, i
    # padding rows are never a state: every sampled state's newest frame is real
    batch = replay.sample(500, np.random.default_rng(0))
    states, next_states = batch["states"]["obs"], batch["next_states"]["obs"]
    assert (states[:, -1, 0, 0] > 0).all()
    for b in range(500):  # stacks: frames of one episode, consecutive steps, zero before the episode's first frame
        episode, step = states[b, :, 0, 0].astype(int), states[b, :, 0, 1].astype(int)
        present = episode > 0
        assert (np.diff(present.astype(int)) >= 0).all() and (episode[present] == episode[-1]).all()
        assert (np.diff(step[present]) == 1).all()
        i = batch["rows"][b]
        assert batch["actions"][b] == replay.actions[i] and batch["rewards"][b] == replay.rewards[i]
        if not batch["terminals"][b]:
            assert next_states[b, -1, 0, 1] == step[-1] + 1 and next_states[b, -1, 0, 0] == episode[-1]


def test_n_step_windows_stop_at_the_first_terminal(tmp_path):
    write_checkpoint(tmp_path, 0, [6, 2, 8], capacity=40)
    replay = load(tmp_path, n_step=3)
    batch = replay.sample(400, np.random.default_rng(1), n_step=3, gamma=0.5)
    for b in range(400):
        i = batch["rows"][b]
        ret, terminal = 0.0, False
        for k in range(3):
            ret += 0.5**k * replay.rewards[i + k]
            if replay.terminals[i + k]:
                terminal = True
                break
        assert batch["rewards"][b] == pytest.approx(ret) and bool(batch["terminals"][b]) == terminal


def test_data_percent_reads_the_first_rows_of_every_file(tmp_path):
    write_checkpoint(tmp_path, 0, [30, 30, 30], capacity=100, add_count=100)
    write_checkpoint(tmp_path, 1, [30, 30, 30], capacity=100, add_count=200)
    files = cql.inspect_dataset(cql.Args(dataset_dir=str(tmp_path), data_percent=10.0))
    assert [f.rows for f in files] == [14, 14]  # 10% of 100 rows, plus the stack (fixed_replay's [0, capacity + 4))
    args = cql.Args(env_id="ALE/Breakout-v5", dataset_dir=str(tmp_path), data_percent=10.0, checkpoints="1")
    replay = cql.load_dataset(args, 4)
    assert len(replay.frames) == 14 and replay.frames[3, 0, 0] == 1  # file 1's first rows


# ----------------------------------------------------------------------------------------------------------------------
# The CQL loss
# ----------------------------------------------------------------------------------------------------------------------
def test_cql_penalty_by_hand():
    q = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    actions = torch.tensor([2, 1])
    expected = torch.tensor([math.log(math.e + math.e**2 + math.e**3) - 3.0, math.log(3.0)])
    torch.testing.assert_close(cql.cql_penalty(q, actions), expected)


def random_batch(size=6, num_actions=4):
    return {
        "states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "next_states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "actions": torch.randint(0, num_actions, (size,)),
        "rewards": torch.randn(size),
        "terminals": (torch.rand(size) < 0.3).float(),
    }


def test_cql_loss_is_huber_td_plus_alpha_times_the_penalty_for_the_scalar_agent():
    torch.manual_seed(3)
    args = cql.fill_defaults(cql.agent_args("cql", encoder="nature", moe="none", cql_coef=0.5, gamma=0.9))
    q_net, target_net = cql.build_network(args, 4), cql.build_network(args, 4)
    batch = random_batch()
    loss, metrics = cql.cql_loss(q_net, target_net, batch, args)
    with torch.no_grad():
        q = q_net(batch["states"])
        y = batch["rewards"] + 0.9 * (1 - batch["terminals"]) * target_net(batch["next_states"]).max(1).values
        q_a = q[torch.arange(6), batch["actions"]]
        td = torch.where((y - q_a).abs() <= 1, 0.5 * (y - q_a) ** 2, (y - q_a).abs() - 0.5)
        penalty = torch.logsumexp(q, 1) - q_a
    torch.testing.assert_close(loss.detach(), (td + 0.5 * penalty).mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics["cql_penalty"], penalty.mean(), rtol=1e-5, atol=1e-6)


def test_cql_c51_penalty_uses_the_expected_q_values():
    torch.manual_seed(4)
    args = cql.fill_defaults(cql.agent_args("cql-c51", encoder="nature", moe="none"))
    assert (args.num_atoms, args.dueling, args.double, args.n_step) == (51, True, True, 3)
    q_net, target_net = cql.build_network(args, 4), cql.build_network(args, 4)
    batch = random_batch()
    _, metrics = cql.cql_loss(q_net, target_net, batch, args)
    with torch.no_grad():
        _, aux = q_net(batch["states"], return_aux=True)
        expected_q = (torch.softmax(aux["logits"], -1) * torch.linspace(-10, 10, 51)).sum(-1)  # (B, A)
        penalty = torch.logsumexp(expected_q, 1) - expected_q[torch.arange(6), batch["actions"]]
    torch.testing.assert_close(metrics["cql_penalty"], penalty.mean(), rtol=1e-5, atol=1e-6)
    per_sample_td = metrics["per_sample_loss"].detach() - 0.1 * (
        torch.logsumexp(expected_q, 1) - expected_q[torch.arange(6), batch["actions"]]
    )
    torch.testing.assert_close(metrics["td_loss"], per_sample_td.mean(), rtol=1e-5, atol=1e-5)


def test_agents_set_what_table_3_says():
    c = cql.agent_args("cql")
    assert (c.learning_rate, c.adam_eps, c.n_step, c.num_atoms, c.dueling, c.double) == (
        5e-5,
        3.125e-4,
        1,
        1,
        False,
        False,
    )
    c51 = cql.agent_args("cql-c51")
    assert (c51.learning_rate, c51.adam_eps, c51.n_step, c51.num_atoms) == (6.25e-5, 1.5e-4, 3, 51)
    for a in (c, c51):
        assert (a.batch_size, a.gamma, a.cql_coef, a.num_iterations, a.steps_per_iteration) == (
            32,
            0.99,
            0.1,
            200,
            62_500,
        )
        assert (a.encoder, a.moe, a.eval_steps, a.eval_epsilon, a.protocol) == (
            "impala",
            "softmoe",
            125_000,
            0.001,
            "dopamine",
        )
    args = cql.parse_args(["--agent", "cql-c51", "--n-step", "1", "--dataset-dir", "x"])
    assert (args.n_step, args.num_atoms) == (1, 51)  # explicit flags override the agent


def test_train_step_is_the_cql_loss_backward_and_adam_step_and_reports_phis_gradient():
    """The loop's one update path: cql_loss, backward, Adam; for a learned Phi the RMS of its gradient."""
    for agent, kw in (("cql", dict(moe="softmoe", num_experts=2, expert_width=8)), ("cql-c51", dict(moe="none"))):
        args = cql.fill_defaults(cql.agent_args(agent, encoder="nature", learning_rate=1e-3, **kw))
        torch.manual_seed(1)
        nets = [cql.build_network(args, 4) for _ in range(3)]
        nets[1].load_state_dict(nets[0].state_dict())
        batch = random_batch()
        metrics = cql.train_step(nets[0], nets[2], cql.make_optimizer(nets[0], args), batch, args)
        optimizer = cql.make_optimizer(nets[1], args)
        loss, expected = cql.cql_loss(nets[1], nets[2], batch, args)
        loss.backward()
        optimizer.step()
        assert torch.equal(metrics["td_loss"], expected["td_loss"])
        assert torch.equal(metrics["cql_penalty"], expected["cql_penalty"])
        assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True))
        assert ("phi_grad_rms" in metrics) == (kw["moe"] == "softmoe")


def test_a_resume_keeps_adams_moments_and_takes_this_runs_learning_rate_and_eps():
    torch.manual_seed(0)
    net = cql.build_network(cql.fill_defaults(cql.Args(encoder="nature", num_experts=4)), 4)
    saved = cql.make_optimizer(net, cql.Args(learning_rate=1e-3))
    net({"obs": torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)}).sum().backward()
    saved.step()
    rng = np.random.default_rng(0)
    ckpt = {"q_net": net.state_dict(), "target_net": net.state_dict(), "optimizer": saved.state_dict(), "updates": 5,
            "numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "evaluations": []}  # fmt: skip
    optimizer = cql.make_optimizer(net, cql.Args(learning_rate=5e-4, adam_eps=1e-8))
    assert cql.restore(ckpt, net, net, optimizer, rng) == (5, [])
    assert [(g["lr"], g["eps"]) for g in optimizer.param_groups] == [(5e-4, 1e-8)]
    assert len(optimizer.state) == len(saved.state) > 0
    for p, state in saved.state.items():
        assert torch.equal(optimizer.state[p]["exp_avg"], state["exp_avg"])


def test_environment_and_network_are_dqn_softmoes_own():
    """The network's pieces are dqn_softmoe.py's, character for character, so that its tests (the Soft MoE equations,
    the encoders, ...) hold here and a diff of the scripts shows CQL; the environment is envs/atari.py for both."""
    names = ["lecun_normal_", "xavier_layer", "same_padding", "pad_same", "conv_same", "NatureEncoder", "ResidualBlock",
             "ImpalaEncoder", "tokenize", "Experts", "l2_normalize", "soft_moe", "SoftMoE", "top1_route", "Top1MoE",
             "importance_loss", "load_loss", "load_balancing_loss", "count_parameters", "build_network",
             "architecture", "fill_defaults", "to_tensors"]  # fmt: skip
    for name in names:
        assert inspect.getsource(getattr(cql, name)) == inspect.getsource(getattr(dqn, name)), name
    assert inspect.getsource(cql.project_distribution) == inspect.getsource(rb.project_distribution)  # C51's

    def shared_block(module):  # the helper block at the end of every script
        text = inspect.getsource(module)
        start = text.index("# Shared helpers: byte-identical")
        return text[start : text.index('if __name__ == "__main__":', start)]

    assert shared_block(cql) == shared_block(dqn)


def test_old_flag_names_still_parse():
    args = cql.parse_args(["--dataset-dir", "d", "--load-model", "x.pt", "--checkpoint-every-minutes", "5"])
    assert (args.resume, args.write_every_minutes) == ("x.pt", 5.0)


def test_eta_adds_the_evaluations_to_come_and_is_a_lower_bound_until_one_is_timed():
    assert cql.eta(3600, 2.0, 3, None) == "ETA over 0h30m00s (no evaluation timed yet)"
    assert cql.eta(3600, 2.0, 3, 100.0) == "ETA 0h35m00s (evaluations included)"
    assert cql.eta(0, 2.0, 0, None) == "ETA 0h00m00s (evaluations included)"
    assert cql.eta(3600, 0.0, 3, 100.0) == "ETA ?"


def test_the_progress_line_rate_leaves_the_evaluations_out(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path / "data", 0, [7, 9, 6], capacity=40)
    clock = [0.0]
    monkeypatch.setattr(cql.time, "time", lambda: clock[0])
    kw = dict(env_id="ALE/Breakout-v5", dataset_dir=str(tmp_path / "data"), moe="none", encoder="nature")
    args = cql.fill_defaults(cql.agent_args("cql", num_iterations=3, steps_per_iteration=100, **kw))
    net = cql.build_network(args, 4)
    run = cql.Run(args, "breakout", net, net, None, load(tmp_path / "data"), None, "cpu", 0, [])
    clock[0] = 10.0
    run.log_step(50, {})
    assert capsys.readouterr().out.strip().endswith("ETA over 0h00m50s (no evaluation timed yet)")  # 250 at 5/s
    run.log_evaluation(100, [(3.0, 20)], seconds=30.0)
    clock[0] = 50.0  # 100 steps in 50 - 30 s of learning: 5 steps/s; 200 steps and 2 evaluations of 30 s to come
    run.log_step(100, {})
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert " 5.0 steps/s " in line and line.endswith("ETA 0h01m40s (evaluations included)")
    run.writer.close()


def test_a_step_budget_keeps_the_games_that_end_within_it_and_episodes_play_one_game_each():
    kw = dict(env_id="ALE/Breakout-v5", moe="none", encoder="nature", max_episode_frames=120, eval_epsilon=1.0)
    args = cql.fill_defaults(cql.agent_args("cql", eval_steps=80, eval_envs=2, **kw))
    net = cql.build_network(args, 4)
    games = cql.evaluate(net, args, "breakout", "cpu", np.random.default_rng(0))
    assert len(games) >= 2 and sum(n for _, n in games) <= 80 and all(n <= 30 for _, n in games)
    for protocol in ("dopamine", "atari100k"):  # atari100k: the no-op start steps are not counted in the length
        args.eval_episodes, args.protocol = 2, protocol
        games = cql.evaluate(net, args, "breakout", "cpu", np.random.default_rng(0))
        assert len(games) == 2 and all(n <= 30 for _, n in games)


# ----------------------------------------------------------------------------------------------------------------------
# Bad data: one line naming the file, before training
# ----------------------------------------------------------------------------------------------------------------------
def bad_dataset_error(directory, **kw) -> str:
    with pytest.raises(SystemExit) as err:
        cql.main(cql.Args(**{"env_id": "ALE/Breakout-v5", "dataset_dir": str(directory), "data_percent": 100.0, **kw}))
    message = str(err.value)
    assert message.startswith("error: ") and "\n" not in message
    return message


def test_each_bad_file_gives_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good"
    write_checkpoint(good, 0, [5, 5], capacity=30)
    os.makedirs(tmp_path / "empty")
    assert "holds no checkpoint" in bad_dataset_error(tmp_path / "empty")
    assert "no such directory" in bad_dataset_error(tmp_path / "nowhere")
    # a missing file
    missing = tmp_path / "missing"
    write_checkpoint(missing, 0, [5, 5], capacity=30)
    os.remove(cql.store_path(str(missing), "reward", 0))
    assert "$store$_reward_ckpt.0.gz: missing" in bad_dataset_error(missing)
    # a truncated gzip
    truncated = tmp_path / "truncated"
    write_checkpoint(truncated, 0, [5, 5], capacity=30)
    path = cql.store_path(str(truncated), "observation", 0)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    assert "$store$_observation_ckpt.0.gz: truncated or corrupt gzip" in bad_dataset_error(truncated)
    # a wrong dtype and a wrong shape
    wrong = tmp_path / "wrong"
    write_checkpoint(wrong, 0, [5, 5], capacity=30)
    write_gz(cql.store_path(str(wrong), "action", 0), np.zeros(30, np.float64))
    assert "$store$_action_ckpt.0.gz: float64 (30,), expected int32 (rows)" in bad_dataset_error(wrong)
    write_gz(cql.store_path(str(wrong), "action", 0), np.zeros(30, np.int32))
    write_gz(cql.store_path(str(wrong), "observation", 0), np.zeros((30, 84, 80), np.uint8))
    assert "$store$_observation_ckpt.0.gz: uint8 (30, 84, 80), expected uint8 (rows, 84, 84)" in bad_dataset_error(
        wrong
    )
    # not a gzip at all
    write_checkpoint(wrong, 0, [5, 5], capacity=30)
    open(cql.store_path(str(wrong), "terminal", 0), "wb").write(b"plain bytes")
    assert "$store$_terminal_ckpt.0.gz" in bad_dataset_error(wrong)
    # not enough memory for the chosen subset
    monkeypatch.setattr(cql, "physical_memory_bytes", lambda: 2**30)
    assert "lower --data-percent" in bad_dataset_error(good)
    assert not (tmp_path / "runs").exists()  # nothing was written


@pytest.fixture
def no_training(tmp_path, monkeypatch):
    """cwd = tmp_path, and the test fails the moment a run would start (its directory, then training)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cql, "Run", lambda *a, **k: pytest.fail("training started on a bad dataset"))


@pytest.mark.parametrize("n_step", sorted({agent["n_step"] for agent in cql.AGENTS.values()}))
@pytest.mark.parametrize("data_percent", [100.0, 50.0])
def test_nstep_window_never_straddles_the_write_cursor(tmp_path, n_step, data_percent):
    """Dopamine draws i from [cursor - capacity + 3, cursor - n) mod capacity (max_id = cursor - update_horizon), then
    rejects the file's invalid_range, which the logging agent wrote for its n = 1 (cursor - 1 .. cursor + 3)."""
    capacity, cursor = 60, 20
    write_checkpoint(tmp_path, 0, [40, 12], capacity=capacity, add_count=3 * capacity + cursor)  # full; cursor in ep. 1
    replay = load(tmp_path, n_step=n_step, data_percent=data_percent)
    rows = len(replay.frames)
    assert cursor < rows  # the cursor lies inside the rows read
    window = {(cursor - capacity + 3 + k) % capacity for k in range(capacity - 3 - n_step)}
    invalid = {(cursor - 1 + k) % capacity for k in range(5)}
    expected = {i for i in window - invalid if 3 <= i < rows - n_step and not replay.terminals[i - 3 : i].any()}
    assert set(replay.indices.tolist()) == expected and cursor - n_step - 1 in expected
    batch = replay.sample(2000, np.random.default_rng(0), n_step=n_step)
    age = (batch["rows"][:, None] + np.arange(-3, n_step + 1) - cursor) % capacity  # rows since the cursor, oldest
    assert (np.diff(age, axis=1) == 1).all()  # the stack, the n-step window and s_{t+n}: one stretch of time


def test_flipped_gzip_byte_never_gives_wrong_data(tmp_path):
    """At 100% every file is read to its end, where gzip checks the CRC-32 and length of what it decoded: any flipped
    byte or cut is one DatasetError line naming the file, or (gzip header's timestamp) changes nothing."""
    write_checkpoint(tmp_path, 0, [7, 9, 6], capacity=40, add_count=55)
    good = load(tmp_path)
    path = cql.store_path(str(tmp_path), "observation", 0)
    data = open(path, "rb").read()
    damaged = [data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1 :] for i in range(len(data))]
    damaged += [data[:cut] for cut in range(len(data))]
    for bad in damaged:
        open(path, "wb").write(bad)
        try:
            replay = load(tmp_path)
        except cql.DatasetError as err:
            assert str(err).startswith(f"{path}: ") and "\n" not in str(err)
            continue
        for name in ("frames", "actions", "rewards", "terminals", "indices"):
            np.testing.assert_array_equal(getattr(replay, name), getattr(good, name))


@pytest.mark.parametrize("damage", ["flipped byte", "zeroed bytes", "flipped crc", "cut inside", "cut trailer"])
def test_corrupt_gzip_is_one_line_error_naming_the_file_and_nothing_is_trained(tmp_path, no_training, damage):
    """A flipped byte in the deflate block's code tables (a zlib error), 64 zeroed bytes that still decode (to wrong
    bytes), a wrong CRC-32, a stream cut inside or in its trailer: the observations of a 512-byte file."""
    write_checkpoint(tmp_path / "data", 0, [7, 9, 6], capacity=40)
    path = cql.store_path(str(tmp_path / "data"), "observation", 0)
    data, mid = open(path, "rb").read(), 200
    data = {"flipped byte": data[:60] + bytes([data[60] ^ 1]) + data[61:],
            "zeroed bytes": data[:mid] + bytes(64) + data[mid + 64 :],
            "flipped crc": data[:-8] + bytes([data[-8] ^ 1]) + data[-7:],
            "cut inside": data[:mid], "cut trailer": data[:-4]}[damage]  # fmt: skip
    open(path, "wb").write(data)
    assert bad_dataset_error(tmp_path / "data").startswith(f"error: {path}: truncated or corrupt gzip (")
    assert not (tmp_path / "runs").exists()


def test_verify_dataset_reads_every_file_whole_below_100_percent(tmp_path, no_training, capsys):
    write_checkpoint(tmp_path / "data", 0, [7, 9, 6], capacity=40)
    load(tmp_path / "data", data_percent=10.0, verify_dataset=True)
    assert "--verify-dataset read every file to its end (CRC-32 checked) in 0h00m0" in capsys.readouterr().out
    path = cql.store_path(str(tmp_path / "data"), "reward", 0)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-8] + bytes([data[-8] ^ 1]) + data[-7:])  # the CRC of the rows not read
    load(tmp_path / "data", data_percent=10.0)  # not verified: only the rows read are decoded
    message = bad_dataset_error(tmp_path / "data", data_percent=10.0, verify_dataset=True)
    assert message.startswith(f"error: {path}: truncated or corrupt gzip (BadGzipFile: CRC check failed")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "name, array",
    [("add_count", np.array([30, 30])), ("add_count", np.array(30.0)), ("add_count", np.array(-1)),
     ("invalid_range", np.zeros((5, 1), np.int64)), ("invalid_range", np.zeros(5, np.float32))],
)  # fmt: skip
def test_bad_add_count_or_invalid_range_is_one_line_error_naming_the_file(tmp_path, no_training, name, array):
    write_checkpoint(tmp_path / "data", 0, [7, 9, 6], capacity=40)
    path = cql.store_path(str(tmp_path / "data"), name, 0)
    write_gz(path, array)
    message = bad_dataset_error(tmp_path / "data")
    assert message.startswith(
        f"error: {path}: {array.dtype} {array.shape}, expected {int(name == 'invalid_range')}-d integers"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(), "--dataset-dir is required"),
        (dict(dataset_dir="x", data_percent=0.0), "--data-percent must lie in (0, 100]"),
        (dict(dataset_dir="x", checkpoints="3-1"), "--checkpoints '3-1'"),
        (dict(dataset_dir="x", num_atoms=0), "--num-atoms must be at least 1"),
        (dict(dataset_dir="x", eval_steps=0), "the evaluation needs a budget"),
        (dict(dataset_dir="x", learning_rate=float("nan")), "--learning-rate must be a finite number"),
        (dict(dataset_dir="x", env_id="ALE/Pongg-v5"), "closest valid ids: ALE/Pong-v5"),
    ],
)
def test_bad_flags_fail_with_one_line(tmp_path, monkeypatch, kw, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        cql.main(cql.Args(**kw))
    assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)


def test_unknown_agent_is_a_one_line_error():
    out = subprocess.run([sys.executable, SCRIPT, "--agent", "cql51"], capture_output=True, text=True)
    assert out.returncode != 0 and out.stderr.strip() == "error: unknown --agent 'cql51'; choose one of cql, cql-c51"


# ----------------------------------------------------------------------------------------------------------------------
# End to end on a real game: dqn_softmoe.py's replay memory as a dataset (benchmark/replay_to_dataset.py), both agents
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def breakout_dataset(tmp_path_factory):
    where = tmp_path_factory.mktemp("dataset")
    cwd = os.getcwd()
    os.chdir(where)
    try:
        summary = dqn.main(dqn.Args(env_id="ALE/Breakout-v5", encoder="nature", moe="none", total_timesteps=500,
                                    learning_starts=500, buffer_size=1000, save_model=True, checkpoint_replay=True,
                                    log_every_seconds=1000.0, snapshot_every=0))  # fmt: skip
        ckpt = torch.load(summary["checkpoint"], weights_only=True)
        memory = np.load(os.path.join(os.path.dirname(summary["checkpoint"]), ckpt["replay"]))
        replay_to_dataset.convert(dict(memory), ckpt["episodes"], "data", 200, n_step=1, env_id="ALE/Breakout-v5")
    finally:
        os.chdir(cwd)
    return where / "data"


@pytest.mark.parametrize("agent", ["cql", "cql-c51"])
def test_smoke_run_of_both_agents_on_a_dataset_from_a_real_game(tmp_path, monkeypatch, breakout_dataset, agent):
    monkeypatch.chdir(tmp_path)
    args = cql.agent_args(agent, env_id="ALE/Breakout-v5", dataset_dir=str(breakout_dataset), data_percent=100.0,
                          encoder="nature", num_experts=2, expert_width=32, num_iterations=2, steps_per_iteration=4,
                          eval_steps=60, eval_envs=2, target_network_frequency=5, save_model=True,
                          log_every_seconds=1000.0)  # fmt: skip
    summary = cql.main(args)
    saved = json.loads((tmp_path / "runs" / summary["run_name"] / "summary.json").read_text())
    assert saved["complete"] and saved["updates"] == 8 and [e["iteration"] for e in saved["evaluations"]] == [1, 2]
    assert saved["dataset"]["transitions_sampled_from"] > 400 and saved["behaviour_policy"]["episodes"] >= 1
    assert saved["sampler_batches_per_second"] > saved["gradient_steps_per_second"]
    assert (tmp_path / "runs" / summary["run_name"] / "eval_curve.png").exists()
    # resume: the iterations go on from the checkpoint, also one whose arguments hold a flag the script no longer has
    ckpt = torch.load(summary["checkpoint"], weights_only=True)
    torch.save(ckpt | {"args": ckpt["args"] | {"truncation_is_terminal": False}}, summary["checkpoint"])
    resumed = cql.main(replace_args(args, resume=summary["checkpoint"], num_iterations=3))
    assert resumed["updates"] == 12 and [e["iteration"] for e in resumed["evaluations"]] == [1, 2, 3]
    flipped = flip_bytes(summary["checkpoint"], tmp_path / "flipped.pt")  # 200 bytes of a weight: torch.load takes it
    with pytest.raises(SystemExit, match=r"is damaged \(.*/data/\d+ fails its CRC-32 check\); restore it from a copy"):
        cql.main(replace_args(args, resume=flipped, num_iterations=4))
    other = replace_args(args, resume=summary["checkpoint"], num_iterations=4, data_percent=50, n_step=args.n_step + 1)
    with pytest.raises(SystemExit, match=f"another part of the data; pass --data-percent 100.0 --n-step {args.n_step}"):
        cql.main(other)


@pytest.mark.slow
def test_a_resumed_run_goes_on_as_the_uninterrupted_run_also_from_an_earlier_scripts_checkpoint(tmp_path, monkeypatch):
    """The checkpoint holds the networks, Adam, the counters and both generators, and the evaluations draw from their
    own, so the resumed run ends with the uninterrupted run's weights and scores. Checkpoints hold the arguments of the
    script that wrote them (the earlier one had --truncation-is-terminal); only the architecture is matched."""
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path / "data", 0, [7, 9, 6], capacity=40)
    kw = dict(env_id="ALE/Breakout-v5", dataset_dir=str(tmp_path / "data"), data_percent=100.0, moe="none",
              encoder="nature", steps_per_iteration=3, eval_episodes=2, max_episode_frames=200, eval_epsilon=0.5,
              save_model=True)  # fmt: skip
    whole = cql.main(cql.agent_args("cql", num_iterations=2, **kw))
    path = cql.main(cql.agent_args("cql", num_iterations=1, **kw))["checkpoint"]
    ckpt = torch.load(path, weights_only=True)
    ckpt["args"]["truncation_is_terminal"] = False
    torch.save(ckpt, path)
    resumed = cql.main(cql.agent_args("cql", num_iterations=2, resume=path, **kw))
    assert resumed["start_updates"] == 3 and resumed["updates"] == 6
    a, b = (torch.load(s["checkpoint"], weights_only=True) for s in (whole, resumed))
    assert all(torch.equal(a["q_net"][k], b["q_net"][k]) for k in a["q_net"])
    scores = [[(e["mean_return"], e["mean_length"]) for e in s["evaluations"]] for s in (whole, resumed)]
    assert scores[0] == scores[1]


def replace_args(args, **kw):
    from dataclasses import replace

    return replace(args, **kw)
