"""algos/sarsa_lambda_silu_atari.py: the Sarsa(lambda) equations, selection, activations, the network, the ALE
pre-processing, the DQN-normalised scores, and end-to-end runs on Breakout (smoke, resume, errors, SIGTERM). The
Table 3 / Fig. 7 analysis of benchmark/sarsa_analysis.py is tested in test_sarsa_analysis.py."""

import copy
import csv
import json
import os
import signal
import subprocess
import sys

import ale_py
import numpy as np
import pytest
import torch
from torch import nn

import sarsa_lambda_silu_atari as sarsa
from damage import flip_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "algos", "sarsa_lambda_silu_atari.py")
SCORES_CSV = os.path.join(ROOT, "envs", "atari_scores.csv")  # random / human / DQN reference scores


# ----------------------------------------------------------------------------------------------------------------------
# Eq. 1, 3, 5 on a network small enough to differentiate by hand
# ----------------------------------------------------------------------------------------------------------------------
class TinyQ(nn.Module):
    """Q(s, a) = W_a . s + b_a: grad_W Q(s, a) = onehot(a) s^T and grad_b Q(s, a) = onehot(a)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, obs):
        return self.lin(obs.float())


def tiny_setup(seed=0):
    torch.manual_seed(seed)
    net = TinyQ()
    theta, params = sarsa.flatten_parameters(net, "cpu")
    return theta, params, copy.deepcopy(net).to("meta")


def script_step(theta, params, base, eligibility, s, a, r, s_next, a_next, terminal, first, learn=True, **hp):
    """One step as main() does it: Q and its gradient at (s_t, a_t), Q(s_{t+1}, a_{t+1}), then the update."""
    q_taken, grad_q = sarsa.q_and_grad(base, params, s[None], torch.tensor([a]))
    q_next = sarsa.q_values(base, params, s_next[None])[:, a_next]
    return sarsa.sarsa_lambda_update(
        theta,
        eligibility,
        grad_q,
        q_taken,
        torch.tensor([r]),
        q_next,
        torch.tensor([terminal]),
        torch.tensor([first]),
        torch.tensor([learn]),
        hp["alpha"],
        hp["gamma"],
        hp["lam"],
    )


def hand_q_and_grad(W, b, s, a):
    g_W = np.zeros_like(W)
    g_W[a] = s
    g_b = np.zeros_like(b)
    g_b[a] = 1.0
    return W[a] @ s + b[a], np.concatenate([g_W.ravel(), g_b])


def test_three_steps_equal_a_hand_computation_of_eq_1_3_5():
    hp = dict(alpha=0.1, gamma=0.9, lam=0.8)
    theta, params, base = tiny_setup()
    W, b = theta[:6].double().numpy().reshape(2, 3).copy(), theta[6:].double().numpy().copy()
    states = torch.tensor([[1.0, 0.5, -1.0], [0.0, 2.0, 1.0], [-1.0, 1.0, 0.5], [3.0, -2.0, 1.0]])
    actions, rewards = [0, 1, 1, 0], [1.0, -1.0, 0.5]
    terminal = [False, False, True]  # s_3 is terminal: Q(s_3, .) = 0
    eligibility = torch.zeros(1, 8)
    e = np.zeros(8)
    for t in range(3):
        script_step(theta, params, base, eligibility, states[t], actions[t], rewards[t], states[t + 1], actions[t + 1],
                    terminal[t], t == 0, **hp)  # fmt: skip
        # by hand, everything with theta_t: delta_t (eq. 3), e_t (eq. 5), theta_{t+1} (eq. 1)
        s, s_next = states[t].double().numpy(), states[t + 1].double().numpy()
        q_sa, grad_q = hand_q_and_grad(W, b, s, actions[t])
        q_next = 0.0 if terminal[t] else W[actions[t + 1]] @ s_next + b[actions[t + 1]]
        delta = rewards[t] + hp["gamma"] * q_next - q_sa
        e = hp["gamma"] * hp["lam"] * e + grad_q
        step = hp["alpha"] * delta * e
        W, b = W + step[:6].reshape(2, 3), b + step[6:]
        np.testing.assert_allclose(eligibility[0].numpy(), e, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(theta.numpy(), np.concatenate([W.ravel(), b]), rtol=1e-5, atol=1e-6)
    # the views handed to functional_call follow theta: the network now computes with theta_3
    np.testing.assert_allclose(params["lin.weight"].numpy(), W, rtol=1e-5, atol=1e-6)


def test_lambda_zero_is_one_step_sarsa():
    hp = dict(alpha=0.05, gamma=0.99, lam=0.0)
    theta, params, base = tiny_setup(1)
    eligibility = torch.zeros(1, 8)
    g = torch.Generator().manual_seed(0)
    states = torch.randn(6, 3, generator=g)
    for t in range(5):
        a, a_next = t % 2, (t + 1) % 2
        before = theta.clone()
        q_sa, grad_q = sarsa.q_and_grad(base, params, states[t][None], torch.tensor([a]))
        q_next = float(sarsa.q_values(base, params, states[t + 1][None])[0, a_next])
        delta = script_step(theta, params, base, eligibility, states[t], a, 0.3, states[t + 1], a_next, False, t == 0,
                            **hp)  # fmt: skip
        assert float(delta) == pytest.approx(0.3 + 0.99 * q_next - float(q_sa), abs=1e-6)
        torch.testing.assert_close(eligibility[0], grad_q[0])  # e_t = grad Q(s_t, a_t): no memory of the past
        torch.testing.assert_close(theta - before, 0.05 * float(delta) * grad_q[0])


def test_terminal_step_uses_q_terminal_zero_and_the_trace_restarts_with_the_next_episode():
    hp = dict(alpha=0.1, gamma=0.99, lam=0.8)
    theta, params, base = tiny_setup(2)
    eligibility = torch.ones(1, 8)  # whatever an earlier step left
    s, s_end = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([5.0, 5.0, 5.0])
    q_sa, grad_q = sarsa.q_and_grad(base, params, s[None], torch.tensor([1]))
    delta = script_step(theta, params, base, eligibility, s, 1, 1.0, s_end, 0, True, False, **hp)
    assert float(delta) == pytest.approx(1.0 - float(q_sa), abs=1e-6)  # no gamma Q(s_end, .)
    torch.testing.assert_close(eligibility[0], 0.99 * 0.8 * torch.ones(8) + grad_q[0])
    # ale_py's reset step: its action is ignored; nothing is learned and the old episode's trace is cleared
    before = theta.clone()
    delta = script_step(theta, params, base, eligibility, s_end, 0, 0.0, s, 1, False, False, learn=False, **hp)
    assert float(delta) == 0 and torch.equal(theta, before) and not eligibility.any()
    # the new episode's first step starts from e_0 = 0, even with a trace loaded from a checkpoint
    eligibility.fill_(7.0)
    _, grad_first = sarsa.q_and_grad(base, params, s[None], torch.tensor([1]))
    script_step(theta, params, base, eligibility, s, 1, 0.0, s_end, 0, False, True, **hp)
    torch.testing.assert_close(eligibility[0], grad_first[0])


def test_num_envs_update_equals_n_single_env_updates_summed():
    """N environments: one vmapped gradient call and one update equal N single-environment computations from the
    same theta_t, each with its own trace, whose parameter changes are summed."""
    hp = dict(alpha=0.01, gamma=0.99, lam=0.8)
    torch.manual_seed(0)
    net = sarsa.SarsaQNetwork(4)
    theta, params = sarsa.flatten_parameters(net, "cpu")
    base = copy.deepcopy(net).to("meta")
    N, P = 4, theta.numel()
    g = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (N, 2, 105, 80), generator=g, dtype=torch.uint8)
    next_obs = torch.randint(0, 256, (N, 2, 105, 80), generator=g, dtype=torch.uint8)
    actions, next_actions = torch.tensor([0, 3, 1, 2]), torch.tensor([2, 2, 0, 1])
    reward = torch.tensor([1.0, 0.0, -1.0, 1.0])
    terminal = torch.tensor([False, True, False, False])
    first = torch.tensor([False, False, True, False])
    learn = torch.tensor([True, True, True, False])  # env 3 took a reset step
    traces = torch.randn(N, P, generator=g) * 1e-3

    theta0 = theta.clone()
    singles = []
    for k in range(N):  # single-environment computations, each from theta_t
        q1, g1 = sarsa.q_and_grad(base, params, obs[k : k + 1], actions[k : k + 1])
        q_next = sarsa.q_values(base, params, next_obs[k : k + 1]).gather(1, next_actions[k : k + 1, None])[:, 0]
        singles.append((q1, g1, q_next))
    steps = []
    for k, (q1, g1, q_next) in enumerate(singles):
        theta_k, e_k = theta0.clone(), traces[k : k + 1].clone()
        sarsa.sarsa_lambda_update(theta_k, e_k, g1, q1, reward[k : k + 1], q_next, terminal[k : k + 1],
                                  first[k : k + 1], learn[k : k + 1], **hp)  # fmt: skip
        steps.append(theta_k - theta0)
        singles[k] = e_k

    q_taken, grad_q = sarsa.q_and_grad(base, params, obs, actions)  # the vectorized call
    q_next = sarsa.q_values(base, params, next_obs).gather(1, next_actions[:, None])[:, 0]
    eligibility = traces.clone()
    sarsa.sarsa_lambda_update(theta, eligibility, grad_q, q_taken, reward, q_next, terminal, first, learn, **hp)
    for k in range(N):
        torch.testing.assert_close(eligibility[k : k + 1], singles[k], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(theta - theta0, torch.stack(steps).sum(0), rtol=1e-4, atol=1e-8)
    assert not eligibility[3].any()  # the reset step cleared env 3's trace


def test_vmapped_gradients_equal_per_environment_autograd():
    torch.manual_seed(3)
    net = sarsa.SarsaQNetwork(6, "silu-dsilu", "valid")
    theta, params = sarsa.flatten_parameters(net, "cpu")
    base = copy.deepcopy(net).to("meta")
    obs = torch.randint(0, 256, (3, 2, 105, 80), dtype=torch.uint8)
    actions = torch.tensor([5, 0, 2])
    q_taken, grad_q = sarsa.q_and_grad(base, params, obs, actions)
    for k in range(3):
        net.zero_grad()
        q = net(obs[k : k + 1])[0, actions[k]]
        q.backward()
        expected = torch.cat([p.grad.flatten() for p in net.parameters()])
        assert q_taken[k].item() == pytest.approx(q.item(), abs=1e-5)
        torch.testing.assert_close(grad_q[k], expected, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# Selection (eq. 13, 15) and activations (eq. 9, 10)
# ----------------------------------------------------------------------------------------------------------------------
def test_temperature_schedule_eq_15():
    assert sarsa.temperature(0, 0.5, 0.0005) == 0.5
    assert sarsa.temperature(2000, 0.5, 0.0005) == pytest.approx(0.25)
    assert sarsa.temperature(200_000, 0.5, 0.0005) == pytest.approx(0.00495, abs=1e-5)  # Table 3's tau


def test_softmax_probabilities_eq_13_and_sampling():
    q = torch.tensor([[1.0, 2.0, 0.5, 2.0], [0.0, 0.0, 0.0, 0.3]])
    tau = 0.7
    expected = torch.exp(q / tau) / torch.exp(q / tau).sum(-1, keepdim=True)
    torch.testing.assert_close(sarsa.softmax_probabilities(q, tau), expected)
    rng = torch.Generator().manual_seed(0)
    draws = torch.stack([sarsa.select_actions(q, rng, tau=tau)[0] for _ in range(20_000)])  # (draws, 2)
    for row in range(2):
        freq = torch.bincount(draws[:, row], minlength=4).float() / len(draws)
        torch.testing.assert_close(freq, expected[row], atol=0.015, rtol=0)
    # a cold softmax is greedy, a hot one uniform
    actions, exploratory = sarsa.select_actions(torch.tensor([[0.0, 1.0, 0.2]]), rng, tau=1e-4)
    assert actions.item() == 1 and not exploratory.item()
    hot = torch.softmax(torch.tensor([[0.0, 1.0, 0.2]]) / 1e4, -1)
    torch.testing.assert_close(hot, torch.full((1, 3), 1 / 3), atol=1e-3, rtol=0)


def test_epsilon_greedy_and_exploratory_actions():
    rng = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).expand(50_000, 4)
    actions, exploratory = sarsa.select_actions(q, rng, epsilon=0.0)
    assert (actions == 1).all() and not exploratory.any()
    actions, exploratory = sarsa.select_actions(q, rng, epsilon=0.2)
    assert exploratory.float().mean().item() == pytest.approx(0.2 * 3 / 4, abs=0.01)  # a random pick may be greedy
    assert torch.equal(exploratory, actions != 1)


def test_dsilu_against_autograd_and_the_extrema_of_section_2_2():
    z = torch.linspace(-8, 8, 2001, dtype=torch.float64, requires_grad=True)
    (d_silu,) = torch.autograd.grad(sarsa.silu(z).sum(), z)
    torch.testing.assert_close(sarsa.dsilu(z), d_silu)  # eq. 10 is the derivative of eq. 9
    (d_dsilu,) = torch.autograd.grad(sarsa.dsilu(z).sum(), z)
    s = torch.sigmoid(z)
    torch.testing.assert_close(d_dsilu, s * (1 - s) * (2 + z * (1 - s) - z * s))  # eq. 12 without s_i
    with torch.no_grad():
        a = sarsa.silu(z)
        b = sarsa.dsilu(z)
    assert a.min().item() == pytest.approx(-0.278, abs=1e-3)  # "approximately -0.28 for z = -1.28"
    assert z[a.argmin()].item() == pytest.approx(-1.28, abs=0.01)
    assert b.max().item() == pytest.approx(1.1, abs=0.01) and z[b.argmax()].item() == pytest.approx(2.4, abs=0.01)
    assert b.min().item() == pytest.approx(-0.1, abs=0.01) and z[b.argmin()].item() == pytest.approx(-2.4, abs=0.01)


# ----------------------------------------------------------------------------------------------------------------------
# Network
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("padding, grid", [("same", (4, 3)), ("valid", (2, 1))])
def test_network_shapes_and_parameter_counts(padding, grid):
    assert sarsa.feature_map_size(padding) == grid
    net = sarsa.SarsaQNetwork(18, "silu-dsilu", padding)
    assert net.fc.in_features == 32 * grid[0] * grid[1]
    assert sum(p.numel() for p in net.parameters()) == sarsa.num_parameters(18, padding)
    q = net(torch.zeros(5, 2, 105, 80, dtype=torch.uint8))
    assert q.shape == (5, 18)
    if padding == "same":  # the shapes named in the docstring
        x = net.conv(torch.zeros(1, 2, 105, 80), net.conv1)
        assert x.shape[-2:] == (27, 20) and net.pool(x).shape[-2:] == (14, 10)
        y = net.conv(net.pool(x), net.conv2)
        assert y.shape[-2:] == (7, 5) and net.pool(y).shape[-2:] == (4, 3)


def test_activation_pairs_pick_the_conv_and_fc_units():
    net = sarsa.SarsaQNetwork(4)  # default silu-dsilu
    assert net.conv_act is sarsa.silu and net.fc_act is sarsa.dsilu
    net = sarsa.SarsaQNetwork(4, "relu-relu")
    assert net.conv_act is torch.relu and net.fc_act is torch.relu
    assert sarsa.Args().activations == "silu-dsilu"


def test_defaults_follow_section_3_3():
    args = sarsa.Args()
    assert (args.alpha, args.gamma, args.lam, args.tau0, args.tau_k) == (0.001, 0.99, 0.8, 0.5, 0.0005)
    assert (args.total_episodes, args.frame_skip, args.noop_max, args.max_episode_frames) == (200_000, 4, 30, 18_000)
    assert args.clip_rewards and not args.fire_reset and args.num_envs == 1
    table2 = [f"ALE/{game}-v5" for game in sarsa.TABLE2_SCORES]
    assert len(table2) == 12 and args.env_id == table2[0]  # Alien, the first game of Table 2
    assert all(sarsa.atari.game_from_env_id(g) for g in table2)


# ----------------------------------------------------------------------------------------------------------------------
# Pre-processing through ALE (§3.3)
# ----------------------------------------------------------------------------------------------------------------------
def downsample(frame):
    """210x160 -> 105x80 by averaging 2x2 blocks."""
    return frame.reshape(105, 2, 80, 2).astype(np.float64).mean((1, 3))


def test_frames_are_the_luminance_max_of_the_last_two_frames_downsampled_and_two_are_stacked():
    envs = sarsa.make_env(sarsa.Args(noop_max=0), "breakout")
    obs, _ = envs.reset(seed=3)
    ale = ale_py.ALEInterface()
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(ale_py.roms.get_rom_path("breakout"))
    ale.reset_game()
    minimal = ale.getMinimalActionSet()
    assert obs.shape == (1, 2, 105, 80) and obs.dtype == np.uint8
    assert not obs[0, 0].any()  # no frame before the episode's first
    assert np.abs(obs[0, 1] - downsample(ale.getScreenGrayscale())).max() <= 0.5
    rgb = ale.getScreenRGB().astype(np.float64)
    luminance = 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]  # ITU-R BT.601 luma
    assert np.abs(luminance - ale.getScreenGrayscale()).max() <= 0.5
    last_frame_only = []
    for a in [1] * 3 + [3] * 10 + [2] * 10:
        previous = obs
        obs, *_ = envs.step(np.array([a], dtype=np.int32))
        frames = []
        for _ in range(4):  # frame skip 4
            ale.act(minimal[a])
            frames.append(ale.getScreenGrayscale().copy())
        assert np.abs(obs[0, 1] - downsample(np.maximum(frames[2], frames[3]))).max() <= 0.5
        last_frame_only.append(np.abs(obs[0, 1] - downsample(frames[3])).max())
        assert np.array_equal(obs[0, 0], previous[0, 1])  # the input holds the previous step's frame
    envs.close()
    assert max(last_frame_only) > 50  # Breakout flickers: without the max the frames would differ


def test_no_op_starts_and_the_episode_frame_cap():
    start_frames = []
    envs = sarsa.make_env(sarsa.Args(num_envs=8), "breakout")
    for seed in range(4):
        _, info = envs.reset(seed=seed)
        start_frames += list(info["episode_frame_number"])
    envs.close()
    assert min(start_frames) >= 0 and max(start_frames) < 30 and len(set(start_frames)) > 5
    envs = sarsa.make_env(sarsa.Args(num_envs=2, noop_max=0, max_episode_frames=200), "breakout")
    _, info = envs.reset(seed=0)
    assert (info["episode_frame_number"] == 0).all()
    tracker = sarsa.EpisodeTracker(2, info)
    finished = []
    for t in range(60):
        _, rewards, terminated, truncated, info = envs.step(np.zeros(2, dtype=np.int32))
        learn, episode_end, done = tracker.step(rewards, terminated, truncated, info)
        finished += done
        if t == 49:
            assert truncated.all() and episode_end.all()  # 50 steps x 4 frames = 200
        if t == 50:
            assert not learn.any()  # the reset step that follows is not a transition
    envs.close()
    assert [length for _, _, length in finished] == [50, 50]


def test_episode_tracker_counts_raw_scores_and_skips_reset_steps():
    tracker = sarsa.EpisodeTracker(2, {"episode_frame_number": np.array([0, 0])})
    steps = [  # (rewards, terminated, truncated, frame numbers)
        ([5, 0], [False, False], [False, False], [4, 4]),
        ([2, 1], [True, False], [False, False], [8, 8]),
        ([0, 0], [False, False], [False, True], [3, 12]),  # env 0's reset step; env 1 truncated
        ([1, 0], [False, False], [False, False], [7, 1]),  # env 1's reset step
    ]
    learned, finished = [], []
    for rewards, term, trunc, frames in steps:
        learn, _, done = tracker.step(np.array(rewards), np.array(term), np.array(trunc),
                                      {"episode_frame_number": np.array(frames)})  # fmt: skip
        learned.append(learn.tolist())
        finished += done
    assert learned == [[True, True], [True, True], [False, True], [True, False]]
    assert finished == [(0, 7.0, 2), (1, 1.0, 3)]  # raw (unclipped) scores


# ----------------------------------------------------------------------------------------------------------------------
# Scores (Table 2)
# ----------------------------------------------------------------------------------------------------------------------
def test_dqn_normalised_scores_reproduce_table_2_summary_rows():
    games = [sarsa.atari.camel_name(sarsa.atari.game_from_env_id(f"ALE/{g}-v5")) for g in sarsa.TABLE2_SCORES]
    assert games == list(sarsa.TABLE2_SCORES)
    final = [sarsa.dqn_normalized(sarsa.TABLE2_SCORES[g][2], g) for g in games]
    best = [sarsa.dqn_normalized(sarsa.TABLE2_SCORES[g][3], g) for g in games]
    assert round(100 * np.mean(final)) == 218 and round(100 * np.mean(best)) == 332
    assert round(100 * np.median(final)) == 78 and round(100 * np.median(best)) == 125
    assert sarsa.dqn_normalized(3069.0, "Alien") == 1.0 and sarsa.dqn_normalized(10.0, "Pong") is None
    assert sarsa.dqn_normalized(None, "Alien") is None  # no finished episode yet


def test_table_2_random_and_dqn_scores_are_those_of_the_reference_csv():
    with open(SCORES_CSV) as f:
        rows = {r["game"]: r for r in csv.DictReader(f)}
    table = {g: (float(rows[g]["random_nature"]), float(rows[g]["dqn_nature"])) for g in sarsa.TABLE2_SCORES}
    assert {g: v[:2] for g, v in sarsa.TABLE2_SCORES.items()} == table


def test_best_window_mean_is_the_best_non_overlapping_block():
    # Non-overlapping blocks (Table 2: "over every 100 episodes"): [1, 5] [2, 8], the unfinished [0] does not count.
    assert sarsa.best_window_mean(np.array([1.0, 5.0, 2.0, 8.0, 0.0]), 2) == 5.0
    # A sliding window would find [10, 10] = 10 here; the blocks are [0, 10] and [10, 0].
    assert sarsa.best_window_mean(np.array([0.0, 10.0, 10.0, 0.0]), 2) == 5.0
    assert sarsa.best_window_mean(np.array([3.0, 1.0]), 100) == 2.0
    scores = np.random.default_rng(0).exponential(100.0, 1050)
    blocks = [scores[i : i + 100].mean() for i in range(0, 1000, 100)]  # independent: one slice per block
    assert sarsa.best_window_mean(scores, 100) == pytest.approx(max(blocks))
    assert sarsa.best_window_mean(scores, 100) <= max(scores[i : i + 100].mean() for i in range(951))


# ----------------------------------------------------------------------------------------------------------------------
# Runs on a real game
# ----------------------------------------------------------------------------------------------------------------------
def run(**kw):
    kw.setdefault("env_id", "ALE/Breakout-v5")
    kw.setdefault("max_episode_frames", 600)  # at most 150 agent steps per episode
    kw.setdefault("log_every_seconds", 1000.0)
    return sarsa.main(sarsa.Args(**kw))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three Breakout episodes on two environments with a checkpoint (a few hundred agent steps)."""
    root = tmp_path_factory.mktemp("trained")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        summary = run(total_episodes=3, num_envs=2, save_model=True, capture_video=True)
    finally:
        os.chdir(cwd)
    return root, summary


def test_a_run_without_capture_video_writes_no_video_and_needs_no_moviepy(tmp_path, monkeypatch):
    """Episode 1 is on the video schedule (0, 1, 8, ...): without --capture-video nothing is recorded there either."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "moviepy", None)  # as on a machine without moviepy: importing it fails
    summary = run(total_episodes=2)  # the old code recorded episode 1 and wrote it at its end
    assert not os.path.exists(os.path.join("runs", summary["run_name"], "videos"))


def test_smoke_run_writes_summary_curves_tensorboard_video_and_checkpoint(trained):
    root, summary = trained
    run_dir = root / "runs" / summary["run_name"]
    saved = json.loads((run_dir / "summary.json").read_text())
    for key in ("args", "global_step", "wall_time", "sps", "final_mean_score", "best_mean_score",
                "final_dqn_normalized", "best_dqn_normalized"):  # fmt: skip
        assert key in saved, key
    assert saved["complete"] and saved["episodes"] == 3 and saved["global_step"] >= 3 * 20
    assert saved["random_score"] == 1.7 and saved["paper_final_score"] == 25
    assert saved["final_dqn_normalized"] == pytest.approx((saved["final_mean_score"] - 1.7) / (401.2 - 1.7))
    with open(run_dir / "episodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and all(0 < int(r["length"]) <= 150 for r in rows)
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    assert (run_dir / "learning_curve.csv").exists() and (run_dir / "learning_curve.png").exists()
    assert (run_dir / "videos" / "episode-0.mp4").exists()
    ckpt = torch.load(root / summary["checkpoint"], weights_only=True)
    assert ckpt["episodes"] == 3 and ckpt["global_step"] == saved["global_step"]
    assert ckpt["eligibility"].shape == (2, saved["num_parameters"]) and ckpt["eligibility"].abs().sum() > 0
    assert ckpt["history"]["score"].tolist() == [float(r["score"]) for r in rows]


def test_checkpoint_resume_continues_the_episode_counter_and_the_curve(trained, tmp_path, monkeypatch, capsys):
    root, first = trained
    monkeypatch.chdir(tmp_path)
    path = str(root / first["checkpoint"])
    ckpt = torch.load(path, weights_only=True)
    resumed = run(total_episodes=5, num_envs=2, save_model=True, resume=path)
    assert resumed["start_episode"] == 3 and resumed["episodes"] == 5 and resumed["global_step"] > first["global_step"]
    again = torch.load(resumed["checkpoint"], weights_only=True)
    assert torch.equal(again["history"]["score"][:3], ckpt["history"]["score"])  # the learning curve continues
    assert not torch.equal(again["theta"], ckpt["theta"])
    assert resumed["final_temperature"] == pytest.approx(sarsa.temperature(5, 0.5, 0.0005))
    # every environment starts a new episode on resume (traces restart at e_0 = 0), so another --num-envs may go on
    capsys.readouterr()
    other_n = run(total_episodes=4, num_envs=1, resume=path, tau_k=0.005)
    assert other_n["start_episode"] == 3 and other_n["episodes"] == 4
    # tau(i) goes on with this run's schedule, and a schedule other than the checkpoint's is pointed out
    assert "note: trained with --tau0 0.5 --tau-k 0.0005" in capsys.readouterr().out
    assert other_n["final_temperature"] == pytest.approx(sarsa.temperature(4, 0.5, 0.005))


def test_resuming_the_same_checkpoint_twice_gives_the_same_parameters(trained, tmp_path, monkeypatch):
    """Everything a resumed run depends on is in the checkpoint (theta, counters, sampler) or the seed."""
    root, first = trained
    monkeypatch.chdir(tmp_path)
    path = str(root / first["checkpoint"])
    a, b = (run(total_episodes=4, num_envs=2, save_model=True, resume=path) for _ in range(2))
    ca, cb = (torch.load(s["checkpoint"], weights_only=True) for s in (a, b))
    assert a["run_name"] != b["run_name"] and torch.equal(ca["theta"], cb["theta"])
    assert torch.equal(ca["history"]["score"], cb["history"]["score"]) and ca["global_step"] == cb["global_step"]


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(env_id="ALE/Breakot-v5"), "closest valid ids: ALE/Breakout-v5"),
        (dict(env_id="SpaceInvader"), "ALE/SpaceInvaders-v5"),
        (dict(activations="silu-tanh"), "unknown --activations 'silu-tanh'"),
        (dict(activations="silu"), "unknown --activations"),
        (dict(num_envs=0), "--num-envs must be at least 1, got 0"),
        (dict(total_episodes=0), "--total-episodes must be at least 1 (evaluate a checkpoint with benchmark/"),
        (dict(lam=1.5), "--gamma and --lam"),
        (dict(alpha=float("nan")), "--alpha must be a finite number, got nan"),
        (dict(tau_k=float("inf")), "--tau-k must be a finite number, got inf"),
    ],
)
def test_bad_input_fails_with_one_line_before_anything_is_written(tmp_path, monkeypatch, kw, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        run(**kw)
    assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_bad_checkpoints_fail_with_one_line_before_anything_is_written(trained, tmp_path, monkeypatch):
    root, first = trained
    monkeypatch.chdir(tmp_path)
    path = str(root / first["checkpoint"])
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x80\x04 this is not a checkpoint")
    flipped = flip_bytes(path, tmp_path / "flipped.pt")  # 200 bytes of a weight tensor: torch.load would accept it
    other = tmp_path / "other.pt"
    torch.save({"format": "td_lambda_tetris/1"}, other)
    on_gpu, ckpt = tmp_path / "gpu.pt", torch.load(path, weights_only=True)  # as an older CUDA run wrote it
    del ckpt["device"]
    torch.save(ckpt | {"rng_state": torch.zeros(16, dtype=torch.uint8)}, on_gpu)
    cases = [
        (dict(resume=str(on_gpu), device="cpu"), "was written on cuda; pass --device cuda"),
        (dict(activations="relu-relu"), "activations: checkpoint silu-dsilu vs requested relu-relu"),
        (dict(padding="valid"), "padding: checkpoint same vs requested valid"),
        (dict(env_id="ALE/Pong-v5"), "game: checkpoint breakout vs requested pong"),
        (dict(total_episodes=3), "already at episode 3"),
        (dict(resume=str(corrupt)), "not a readable checkpoint"),
        (dict(resume=flipped), "fails its CRC-32 check); restore it from a copy"),
        (dict(resume=str(other)), "not a sarsa_lambda_silu_atari checkpoint"),
        (dict(resume=str(tmp_path / "missing.pt")), "no such file"),
    ]
    for kw, message in cases:
        kw = {"resume": path, "num_envs": 2, "total_episodes": 10, **kw}
        with pytest.raises(SystemExit) as err:
            run(**kw)
        assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_eta_takes_the_remaining_episodes_as_long_as_the_last_100_at_the_current_rate():
    lengths = [1000] * 50 + [300] * 100  # only the last 100 count: 20 episodes x 300 steps / 600 steps/s = 10 s
    assert sarsa.eta(lengths, 170, 600.0) == "0:00:10"
    assert sarsa.eta([3600.0] * 10, 110, 100.0) == "1:00:00"  # 100 episodes x 3600 steps at 100 steps/s
    assert sarsa.eta(lengths, 150, 600.0) == "0:00:00" and sarsa.eta([], 5, 600.0) == "?"


def test_command_line_error_is_one_line(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, SCRIPT, "--num-envs", "0"], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=120)  # fmt: skip
    assert out.returncode != 0 and out.stderr.strip() == "error: --num-envs must be at least 1, got 0"
    assert not (tmp_path / "runs").exists()


def test_sigterm_stops_the_loop_and_writes_the_summary(tmp_path):
    """The handler sets a flag that the loop reads, so a stop never lands between sending and receiving an env step."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--env-id", "ALE/Breakout-v5", "--max-episode-frames", "600",
         "--total-episodes", "100000", "--log-every-seconds", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    for line in proc.stdout:
        if line.startswith("episodes ") and not line.startswith("episodes 0/"):
            proc.send_signal(signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "interrupted: writing" in rest
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is False and 0 < summary["episodes"] < 100000
