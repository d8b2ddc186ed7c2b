"""algos/rainbow_softmoe.py: the C51 projection, n-step returns, prioritised replay, NoisyNets, dueling, double DQN and
the DrQ augmentation against hand computations and their definitions; the presets against the reference's gin files;
short runs on a real game (every preset, resume with the replay memory and its priorities, errors)."""

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import rainbow_softmoe as rb
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "algos", "rainbow_softmoe.py")


# ----------------------------------------------------------------------------------------------------------------------
# C51
# ----------------------------------------------------------------------------------------------------------------------
def test_projection_onto_the_support_by_hand():
    support = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])  # dz = 1
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.25, 0.15]] * 3)
    # sample 0: r = 0.5, gamma^n = 0.5 -> T z = (-0.5, 0, 0.5, 1, 1.5): each atom splits between its neighbours
    # sample 1: terminal -> T z = r = 3 for every atom: all mass clipped onto v_max = 2
    # sample 2: r = -1.5, gamma^n = 1 -> T z = (-3.5, -2.5, -1.5, -0.5, 0.5): two atoms fall below v_min
    rewards, discounts = torch.tensor([0.5, 3.0, -1.5]), torch.tensor([0.5, 0.0, 1.0])
    target_support = rewards[:, None] + discounts[:, None] * support
    m = rb.project_distribution(target_support, probs, support)
    expected = torch.tensor(
        [
            [0.0, 0.05, 0.05 + 0.2 + 0.15, 0.15 + 0.25 + 0.075, 0.075],
            [0.0, 0.0, 0.0, 0.0, 1.0],
            [0.1 + 0.2 + 0.15, 0.15 + 0.125, 0.125 + 0.075, 0.075, 0.0],
        ]
    )
    torch.testing.assert_close(m, expected)
    torch.testing.assert_close(m.sum(1), torch.ones(3))
    # the projection keeps the mean when no atom leaves the support (sample 0)
    assert float((m[0] * support).sum()) == pytest.approx(float((probs[0] * target_support[0]).sum()))


def test_rainbow_loss_is_the_cross_entropy_against_the_double_dqn_projected_target():
    torch.manual_seed(0)
    args = rb.fill_defaults(rb.Args(encoder="nature", moe="none", noisy=False, gamma=0.9, n_step=2))
    q_net, target_net = rb.build_network(args, 4), rb.build_network(args, 4)
    batch = random_batch(6, 4)
    loss, metrics = rb.rainbow_loss(q_net, target_net, batch, args)
    with torch.no_grad():
        a_star = q_net(batch["next_states"]).argmax(1)  # the online network picks a*
        _, target_aux = target_net(batch["next_states"], return_aux=True)
        p_next = torch.softmax(target_aux["logits"][torch.arange(6), a_star], -1)  # the target network evaluates it
        z = torch.linspace(-10, 10, 51)
        expected = []
        for i in range(6):
            tz = (batch["rewards"][i] + 0.81 * (1 - batch["terminals"][i]) * z).clamp(-10, 10)
            m = torch.zeros(51)
            for j in range(51):  # C51's projection written atom by atom
                b = (tz[j] + 10) / 0.4
                lo, hi = int(math.floor(b)), int(math.ceil(b))
                if lo == hi:
                    m[lo] += p_next[i, j]
                else:
                    m[lo] += p_next[i, j] * (hi - b)
                    m[hi] += p_next[i, j] * (b - lo)
            _, aux = q_net(batch["states"][i : i + 1], return_aux=True)
            log_p = torch.log_softmax(aux["logits"][0, batch["actions"][i]], -1)
            expected.append(-(m * log_p).sum())
        expected = torch.stack(expected)
    torch.testing.assert_close(metrics["per_sample_loss"].detach(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.detach(), (batch["weights"] * expected).mean(), rtol=1e-4, atol=1e-5)


def test_double_dqn_takes_the_argmax_of_the_online_network():
    torch.manual_seed(1)
    args = rb.fill_defaults(rb.Args(encoder="nature", moe="none", noisy=False, num_atoms=1, dueling=False))
    q_net, target_net = rb.build_network(args, 3), rb.build_network(args, 3)
    with torch.no_grad():  # constant Q-values: online prefers action 0, target prefers action 2
        for net, bias in ((q_net, [5.0, 0.0, 1.0]), (target_net, [7.0, 3.0, 9.0])):
            net.head.weight.zero_()
            net.head.bias.copy_(torch.tensor(bias))
    batch = random_batch(5, 3) | {"terminals": torch.zeros(5), "rewards": torch.zeros(5)}
    _, metrics = rb.rainbow_loss(q_net, target_net, batch, args)
    # scalar Q, Huber loss: target = gamma^3 Q_target(s', argmax_a Q_online(s', a)) = 0.99^3 * 7, not 0.99^3 * 9
    q_taken = torch.tensor([5.0, 0.0, 1.0])[batch["actions"]]
    expected = torch.nn.functional.huber_loss(q_taken, torch.full((5,), 0.99**3 * 7.0), reduction="none")
    torch.testing.assert_close(metrics["per_sample_loss"].detach(), expected)
    args.double = False  # plain max over the target network
    _, metrics = rb.rainbow_loss(q_net, target_net, batch, args)
    expected = torch.nn.functional.huber_loss(q_taken, torch.full((5,), 0.99**3 * 9.0), reduction="none")
    torch.testing.assert_close(metrics["per_sample_loss"].detach(), expected)


def test_dueling_aggregation_and_expected_q():
    torch.manual_seed(2)
    net = rb.QNetwork(3, "nature", "none", num_atoms=5, v_min=-2, v_max=2, noisy=False, dueling=True)
    x = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)
    q, aux = net(x, return_aux=True)
    h = aux["head_input"]
    value, advantage = net.value(h).view(4, 1, 5), net.advantage(h).view(4, 3, 5)
    torch.testing.assert_close(aux["logits"], value + advantage - advantage.mean(1, keepdim=True))
    torch.testing.assert_close(q, (torch.softmax(aux["logits"], -1) * torch.linspace(-2, 2, 5)).sum(-1))
    assert aux["logits"].shape == (4, 3, 5) and net.support.tolist() == [-2, -1, 0, 1, 2]
    scalar = rb.QNetwork(3, "nature", "none", num_atoms=1, noisy=False)
    q, aux = scalar(x, return_aux=True)
    torch.testing.assert_close(q, aux["logits"][..., 0])  # num_atoms 1: Q is the single logit


# ----------------------------------------------------------------------------------------------------------------------
# NoisyNets
# ----------------------------------------------------------------------------------------------------------------------
def test_noisy_layer_noise_statistics_and_switching_it_off():
    torch.manual_seed(3)
    layer = rb.NoisyLinear(400, 300)
    assert float(layer.weight_mu.detach().abs().max()) <= 1 / 20 and torch.all(layer.weight_sigma == 0.1 / 20)
    x = torch.eye(400)[:1]  # picks row 0 of W^T: y_j = W_j0 + b_j
    draws = torch.stack([layer(x)[0] for _ in range(4000)]) - (layer.weight_mu[:, 0] + layer.bias_mu).detach()
    # W_j0 - mu = sigma f(e_out_j) f(e_in_0), b_j - mu = sigma f(e_out_j): mean 0, and with E f(e)^2 = E|e| = sqrt(2/pi)
    # the sum has variance sigma^2 E[f(e_out)^2] E[(f(e_in) + 1)^2] = sigma^2 sqrt(2/pi) (sqrt(2/pi) + 1)
    expected_var = (0.1 / 20) ** 2 * math.sqrt(2 / math.pi) * (math.sqrt(2 / math.pi) + 1)
    draws = draws.detach()
    assert abs(float(draws.mean())) < 0.05 * math.sqrt(expected_var)
    assert float(draws.var()) == pytest.approx(expected_var, rel=0.05)
    # within one forward pass the noise is one draw, shared by the batch, and it is the factorised matrix
    torch.manual_seed(11)
    y = layer(torch.randn(20, 400))
    torch.manual_seed(11)
    x20 = torch.randn(20, 400)
    e_in, e_out = rb.factorised_noise(400, "cpu"), rb.factorised_noise(300, "cpu")
    weight = layer.weight_mu + layer.weight_sigma * torch.outer(e_out, e_in)
    torch.testing.assert_close(y, x20 @ weight.T + layer.bias_mu + layer.bias_sigma * e_out, rtol=1e-5, atol=1e-5)
    rb.set_noise(layer, False)
    torch.testing.assert_close(layer(x)[0], (layer.weight_mu[:, 0] + layer.bias_mu).detach())


def test_noise_switches_off_in_every_noisy_layer_and_the_experts():
    torch.manual_seed(4)
    args = rb.fill_defaults(rb.Args(encoder="nature", num_experts=2, expert_width=16))
    net = rb.build_network(args, 4)
    x = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert not torch.allclose(net(x), net(x))  # noisy experts and heads
    rb.set_noise(net, False)
    torch.testing.assert_close(net(x), net(x))
    # with the noise off the experts are their means
    experts = net.moe.experts
    assert hasattr(experts, "w1_sigma") and not experts.noise
    plain = rb.fill_defaults(rb.Args(encoder="nature", num_experts=2, expert_width=16, noisy=False))
    assert not hasattr(rb.build_network(plain, 4).moe.experts, "w1_sigma")


# ----------------------------------------------------------------------------------------------------------------------
# Replay: n-step returns across episode ends with several environments
# ----------------------------------------------------------------------------------------------------------------------
class ScriptedEnvs:
    """NEXT_STEP autoreset like ale_py; env k's episodes have the lengths lengths[k] (cycled); the reward of step t of
    an episode is t + 1 + 100 k (so every reward is different), and the newest frame's pixel (0, 0) counts steps."""

    def __init__(self, lengths):
        self.lengths, self.n = lengths, len(lengths)
        self.t, self.episode, self.done = np.zeros(self.n, int), np.zeros(self.n, int), np.zeros(self.n, bool)
        self.clock = 0
        self.stack = np.zeros((self.n, 4, 84, 84), np.uint8)

    def info(self):
        return {"lives": np.zeros(self.n, int), "episode_frame_number": 4 * self.t.copy()}

    def step(self):
        self.clock += 1
        reward, terminated = np.zeros(self.n), np.zeros(self.n, bool)
        for k in range(self.n):
            if self.done[k]:
                self.done[k], self.t[k] = False, 0
                self.stack[k] = 0
            else:
                self.t[k] += 1
                reward[k] = self.t[k] + 100 * k
                self.episode_length = self.lengths[k][self.episode[k] % len(self.lengths[k])]
                if self.t[k] == self.episode_length:
                    terminated[k] = self.done[k] = True
                    self.episode[k] += 1
                self.stack[k] = np.roll(self.stack[k], -1, 0)
            self.stack[k, -1] = self.clock % 256
        return self.stack.copy(), reward, terminated, np.zeros(self.n, bool), self.info()


def test_n_step_returns_across_episode_ends_with_several_envs():
    envs = ScriptedEnvs([[3, 7, 2], [5, 1, 9], [4]])
    replay = rb.FrameReplay(3 * 200, 3)
    tracker = rb.EpisodeTracker(3, False, False, envs.info())
    obs, log = envs.stack.copy(), []  # log[t][k] = (reward, terminal, valid) of row t
    for _ in range(120):
        next_obs, reward, terminated, truncated, info = envs.step()
        step = tracker.step(reward, terminated, truncated, info)
        replay.add(obs[:, -1], np.zeros(3), reward, step.terminal, step.valid, step.history)  # unclipped, to see sums
        log.append([(reward[k], step.terminal[k], step.valid[k]) for k in range(3)])
        obs = next_obs
    gamma, n = 0.9, 3
    batch = replay.sample(3000, np.random.default_rng(0), n_step=n, gamma=gamma)
    age = (batch["rows"] - (replay.cursor - replay.count)) % replay.rows
    assert len(np.unique(age * 3 + batch["envs"])) > 150  # most valid (row, env) pairs were drawn
    for i in range(len(age)):
        t, k = age[i], batch["envs"][i]
        assert log[t][k][2]  # a real transition, never a reset step
        ret, length, terminal = 0.0, 0, False
        for j in range(n):  # the n-step return, cut at the first terminal
            r, term, _ = log[t + j][k]
            ret += gamma**j * r
            length += 1
            if term:
                terminal = True
                break
        assert batch["rewards"][i] == pytest.approx(ret, rel=1e-6)
        assert batch["terminals"][i] == terminal
        assert batch["next_states"][i, -1, 0, 0] == (t + length) % 256  # the frame of s_{t+L}
        assert batch["states"][i, -1, 0, 0] == t % 256


# ----------------------------------------------------------------------------------------------------------------------
# Prioritised replay
# ----------------------------------------------------------------------------------------------------------------------
def test_sum_tree_sums_finds_and_keeps_the_last_of_repeated_updates():
    tree = rb.SumTree(5)
    tree.set(np.arange(5), np.array([1.0, 0.0, 3.0, 2.0, 4.0]))
    assert tree.total == 10.0 and tree.max_recorded == 4.0
    # mass in [0, 1) -> 0, [1, 4) -> 2 (slot 1 has no mass), [4, 6) -> 3, [6, 10) -> 4
    np.testing.assert_array_equal(tree.find(np.array([0.0, 0.99, 1.0, 3.99, 4.0, 6.5, 9.99])), [0, 0, 2, 2, 3, 4, 4])
    tree.set(np.array([2, 4, 2]), np.array([7.0, 0.5, 0.25]))  # slot 2 is given twice: the last value stays
    assert tree.total == pytest.approx(1 + 0.25 + 2 + 0.5)
    np.testing.assert_array_equal(tree.get(np.arange(5)), [1.0, 0.0, 0.25, 2.0, 0.5])
    assert tree.max_recorded == 7.0  # the largest priority ever set, as Dopamine's sum tree keeps it


def test_prioritised_sampling_frequencies_follow_the_priorities():
    rng = np.random.default_rng(5)
    priorities = rng.uniform(0.1, 2.0, size=50)
    priorities[7] = 0.0  # never drawn
    tree = rb.SumTree(50)
    tree.set(np.arange(50), priorities)
    counts = np.zeros(50)
    for _ in range(400):  # 400 stratified batches of 32
        np.add.at(counts, tree.sample(32, rng), 1)
    expected = 400 * 32 * priorities / priorities.sum()
    assert counts[7] == 0
    mask = expected > 0
    chi2 = float((((counts - expected) ** 2)[mask] / expected[mask]).sum())
    assert chi2 < 91.0  # the 0.9999 quantile of chi^2 with 48 degrees of freedom (stratification only lowers it)


def test_importance_weights_by_hand():
    envs = ScriptedEnvs([[50], [50]])
    replay = rb.FrameReplay(2 * 100, 2, prioritized=True)
    tracker = rb.EpisodeTracker(2, False, False, envs.info())
    obs = envs.stack.copy()
    for _ in range(40):
        next_obs, reward, terminated, truncated, info = envs.step()
        step = tracker.step(reward, terminated, truncated, info)
        replay.add(obs[:, -1], np.zeros(2), reward, step.terminal, step.valid, step.history)
        obs = next_obs
    assert np.all(replay.tree.get(np.arange(80)) == 1.0)  # every new row got the largest priority so far (1)
    rng = np.random.default_rng(6)
    batch = replay.sample(8, rng, n_step=3, gamma=0.99)
    losses = torch.arange(1.0, 9.0)
    replay.update_priorities(batch, losses)
    slots = batch["rows"] * 2 + batch["envs"]
    unique, last = np.unique(slots[::-1], return_index=True)
    np.testing.assert_allclose(replay.tree.get(unique), np.sqrt(losses.numpy()[::-1][last] + 1e-10))
    batch = replay.sample(16, rng, n_step=3, gamma=0.99)
    p = replay.tree.get(batch["rows"] * 2 + batch["envs"])
    w = 1 / np.sqrt(p / replay.tree.total + 1e-10)
    np.testing.assert_allclose(batch["weights"], w / w.max(), rtol=1e-6)
    assert batch["weights"].max() == pytest.approx(1.0)
    # the newest rows (whose 3-step window is not complete) are never returned, however high their priority
    assert ((batch["rows"] - (replay.cursor - replay.count)) % replay.rows < replay.count - 3).all()


# ----------------------------------------------------------------------------------------------------------------------
# DrQ augmentation
# ----------------------------------------------------------------------------------------------------------------------
def test_augmentation_shifts_by_at_most_4_pixels_and_scales_each_image():
    torch.manual_seed(7)
    states = torch.randint(1, 256, (64, 4, 84, 84), dtype=torch.uint8)
    out = rb.augment(states)
    assert out.shape == states.shape and out.dtype == torch.float32
    padded = torch.nn.functional.pad(states.float(), (4, 4, 4, 4), mode="replicate")
    shifts = set()
    for b in range(64):
        found = []
        for dy in range(9):
            for dx in range(9):
                window = padded[b, :, dy : dy + 84, dx : dx + 84]
                ratio = out[b] / window
                if torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio), rtol=1e-5):
                    found.append((dy - 4, dx - 4, float(ratio.flatten()[0])))
        assert found, b
        dy, dx, scale = found[0]
        assert abs(dy) <= 4 and abs(dx) <= 4 and 0.9 - 1e-6 <= scale <= 1.1 + 1e-6  # 1 + 0.05 clip(N(0,1), -2, 2)
        shifts.add((dy, dx))
    assert len(shifts) > 20  # offsets differ from image to image
    a, b = rb.augment(states), rb.augment(states)
    assert not torch.equal(a, b)  # a fresh draw at every call (states and next states independently)


# ----------------------------------------------------------------------------------------------------------------------
# Presets and defaults (softmoe_dopamine.md §5.2-5.4)
# ----------------------------------------------------------------------------------------------------------------------
def test_defaults_are_full_rainbow_gin():
    args = rb.fill_defaults(rb.Args())
    assert (args.num_atoms, args.v_min, args.v_max, args.n_step, args.gamma) == (51, -10, 10, 3, 0.99)
    assert args.noisy and args.dueling and args.double and not args.uniform_replay and not args.data_augmentation
    assert (args.learning_rate, args.adam_eps, args.batch_size) == (6.25e-5, 1.5e-4, 32)
    assert (args.learning_starts, args.replay_ratio, args.target_network_frequency) == (20_000, 0.25, 8000)
    assert (args.buffer_size, args.protocol, args.total_timesteps) == (1_000_000, "dopamine", 50_000_000)
    assert (args.encoder, args.moe, args.num_experts, args.tokenization) == ("impala", "softmoe", 8, "perconv")
    assert args.eval_episodes == 0 and args.eval_epsilon == 0.001


def test_each_preset_sets_what_the_reference_says():
    der = rb.preset_args("der")
    assert (der.n_step, der.learning_starts, der.replay_ratio, der.target_network_frequency) == (10, 1600, 1.0, 2000)
    assert (der.learning_rate, der.adam_eps, der.epsilon_decay_steps) == (1e-4, 1.5e-4, 2000)
    assert (der.protocol, der.total_timesteps, der.iteration_steps, der.eval_episodes) == (
        "atari100k",
        100_000,
        10_000,
        100,
    )
    assert der.noisy and der.dueling and der.double and der.num_atoms == 51 and not der.uniform_replay
    assert not der.data_augmentation and (der.encoder, der.num_experts) == ("impala", None)  # Fig. 12: Impala, 8
    drq = rb.preset_args("drq-eps")
    assert (drq.n_step, drq.learning_starts, drq.replay_ratio, drq.target_network_frequency) == (10, 1600, 1.0, 1)
    assert (drq.learning_rate, drq.adam_eps, drq.epsilon_decay_steps, drq.end_e) == (1e-4, 1.5e-4, 5000, 0.01)
    assert drq.num_atoms == 1 and not drq.noisy and drq.dueling and drq.double and drq.uniform_replay
    assert drq.data_augmentation and drq.protocol == "atari100k" and drq.eval_episodes == 100
    compact = rb.fill_defaults(rb.Args(compact=True))
    assert not (compact.noisy or compact.dueling or compact.double) and compact.num_atoms == 51
    assert compact.n_step == 3 and not compact.uniform_replay
    # explicit flags on the command line override the preset
    args = rb.parse_args(["--preset", "der", "--n-step", "20", "--env-id", "ALE/Pong-v5"])
    assert (args.preset, args.n_step, args.learning_starts) == ("der", 20, 1600)


def test_help_of_a_preset_shows_its_values():
    env = dict(os.environ, COLUMNS="250")
    out = subprocess.run(
        [sys.executable, SCRIPT, "--preset", "drq-eps", "--help"], capture_output=True, text=True, env=env
    )
    text = re.sub(r"[\s│]+", " ", out.stdout)
    assert out.returncode == 0
    for flag, value in (("--n-step", "10"), ("--learning-starts", "1600"), ("--target-network-frequency", "1")):
        assert re.search(rf"{flag} INT .*?\(default: {value}\)", text), flag
    assert "--noisy, --no-noisy" in text and "(default: False)" in text


# ----------------------------------------------------------------------------------------------------------------------
# Runs on a real game
# ----------------------------------------------------------------------------------------------------------------------
def random_batch(size: int = 8, num_actions: int = 3) -> dict:
    return {
        "states": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8),
        "next_states": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8),
        "actions": torch.randint(0, num_actions, (size,)),
        "rewards": torch.randn(size),
        "terminals": (torch.rand(size) < 0.3).float(),
        "weights": torch.rand(size),
    }


def run(preset="full-rainbow", **kw):
    kw = {"env_id": "ALE/Breakout-v5", "buffer_size": 3000, "log_every_seconds": 1000.0, "analysis_every": 0} | kw
    return rb.main(rb.preset_args(preset, **kw))


SMALL = dict(encoder="nature", num_experts=2, expert_width=32)
SMOKE = [
    ("full-rainbow", dict(SMALL, total_timesteps=300, learning_starts=200, analysis_every=250, num_envs=2)),
    (
        "full-rainbow",
        dict(
            encoder="impala",
            moe="top1",
            tokenization="perfeat",
            num_experts=2,
            total_timesteps=240,
            learning_starts=200,
            impala_kernel=4,
        ),
    ),  # fmt: skip
    ("full-rainbow", dict(encoder="nature", moe="none", compact=True, total_timesteps=300, learning_starts=200)),
    ("der", dict(SMALL, total_timesteps=260, learning_starts=200, eval_episodes=3, max_episode_frames=2000)),
    (
        "drq-eps",
        dict(
            SMALL,
            total_timesteps=260,
            learning_starts=200,
            eval_episodes=3,
            eval_every=240,
            max_episode_frames=2000,
            analysis_every=250,
        ),
    ),  # fmt: skip
]


@pytest.mark.parametrize("preset, kw", SMOKE, ids=[f"{p}-{i}" for i, (p, _) in enumerate(SMOKE)])
def test_smoke_run_on_breakout(tmp_path, monkeypatch, preset, kw):
    monkeypatch.chdir(tmp_path)
    summary = run(preset, **kw)
    saved = json.loads((tmp_path / "runs" / summary["run_name"] / "summary.json").read_text())
    assert saved["complete"] and saved["global_step"] >= kw["total_timesteps"]
    ratio = rb.preset_args(preset, **kw).replay_ratio
    expected = int((saved["global_step"] - kw["learning_starts"]) * ratio)
    assert abs(saved["updates"] - expected) <= kw.get("num_envs", 1)
    if kw.get("eval_episodes"):
        evaluations = saved["evaluations"]
        assert len(evaluations) == (2 if kw.get("eval_every") else 1) and evaluations[-1]["episodes"] == 3
        assert saved["eval_mean_return"] == pytest.approx(np.mean(evaluations[-1]["returns"]))
        assert saved["eval_human_normalized_score"] == pytest.approx((saved["eval_mean_return"] - 1.7) / 28.8)
    if kw.get("analysis_every"):
        keys = (
            "dormant_percentage",
            "srank_head_input",
            "srank_expert_hidden",
            "entk_srank_0.01",
            "routing_dispatch_entropy",
        )
        for key in keys + ("routing_combine_entropy", "token_diversity_in", "token_diversity_out"):
            assert math.isfinite(saved["analysis"][key]), key


def test_resume_with_the_replay_memory_keeps_the_priorities(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, learning_starts=100, save_model=True, checkpoint_replay=True)
    first = run(total_timesteps=200, **kw)
    saved = np.load(rb.replay_path(first["checkpoint"], 200))
    priorities = saved["priorities"]
    assert (priorities[: saved["pointers"][1]] != 1.0).sum() > 10  # learned priorities, not only the initial ones
    memory = rb.FrameReplay(3000, 1, prioritized=True)
    memory.load_state_dict(rb.load_replay(first["checkpoint"], f"{rb.SCRIPT}_replay_200.npz"))
    np.testing.assert_array_equal(memory.tree.get(np.arange(3000)), priorities)
    assert memory.tree.max_recorded == float(saved["max_priority"])
    resumed = run(total_timesteps=260, resume=first["checkpoint"], **kw)
    assert resumed["start_step"] == 200 and resumed["updates"] == first["updates"] + int(59 * 0.25)


def test_a_corrupt_or_truncated_replay_file_is_a_one_line_error_at_resume(tmp_path, monkeypatch):
    """The memory is restored whole or not at all: a flipped byte (the zip's CRC-32), a cut file or a file that lacks
    an array (a damaged zip index) stops the resume with one line naming the file, before a run directory is made."""
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, total_timesteps=50, learning_starts=1000, save_model=True, checkpoint_replay=True)
    path = run(**kw)["checkpoint"]
    replay = os.path.join(os.path.dirname(path), torch.load(path, weights_only=True)["replay"])
    good, arrays = open(replay, "rb").read(), dict(np.load(replay))
    runs, mid = sorted(os.listdir("runs")), len(good) // 2
    damages = {"BadZipFile: Bad CRC-32": good[:mid] + bytes([good[mid] ^ 1]) + good[mid + 1 :],
               "BadZipFile: File is not a zip file": good[:-100], "ValueError: no history array": None}  # fmt: skip
    for cause, damage in damages.items():
        if damage is None:
            np.savez(replay, **{k: v for k, v in arrays.items() if k != "history"})
        else:
            open(replay, "wb").write(damage)
        with pytest.raises(SystemExit) as err:
            run(**dict(kw, total_timesteps=100, resume=path))
        message = str(err.value)
        assert message.startswith(f"error: --resume: the replay memory {replay!r} is truncated or corrupt ({cause}")
        assert "\n" not in message and sorted(os.listdir("runs")) == runs


def test_the_analysis_leaves_the_training_run_unchanged(tmp_path, monkeypatch):
    """DrQ(eps) draws augmentations from torch's generator and batches from the run's: the analysis uses its own."""
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, total_timesteps=230, learning_starts=150, max_episode_frames=400, eval_episodes=0, save_model=True)
    plain, analysed = run("drq-eps", **kw), run("drq-eps", analysis_every=100, **kw)
    assert not plain["analysis"]
    assert analysed["analysis"]["global_step"] == 200
    a, b = (torch.load(s["checkpoint"], weights_only=True)["q_net"] for s in (plain, analysed))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same updates on the same batches
    episodes = [(tmp_path / "runs" / s["run_name"] / "episodes.csv").read_text() for s in (plain, analysed)]
    assert episodes[0] == episodes[1]


def test_the_shared_helpers_are_byte_identical_in_every_script():
    def shared_block(name):
        text = open(os.path.join(ROOT, "algos", name)).read()
        start = text.index("# Shared helpers: byte-identical")
        return text[start : text.index('if __name__ == "__main__":', start)]

    scripts = [
        n for n in ("dqn_softmoe.py", "rainbow_softmoe.py", "cql_softmoe.py") if os.path.exists(f"{ROOT}/algos/{n}")
    ]
    blocks = {name: shared_block(name) for name in scripts}
    assert len(blocks) >= 2
    for name, block in blocks.items():
        assert block == blocks["dqn_softmoe.py"], name


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(num_atoms=0), "--num-atoms must be at least 1"),
        (dict(n_step=0), "--n-step must be at least 1"),
        (dict(v_min=10.0, v_max=-10.0), "--v-min (10.0) must be below --v-max (-10.0)"),
        (dict(eval_every=1000), "--eval-every needs --eval-episodes"),
        (dict(learning_rate=float("inf")), "--learning-rate must be a finite number"),
    ],
)
def test_bad_input_fails_with_one_line_before_anything_is_written(tmp_path, monkeypatch, kw, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        rb.main(rb.Args(**kw))
    assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_dqn_checkpoint_is_refused_with_one_line(tmp_path, monkeypatch):
    import dqn_softmoe as dqn

    monkeypatch.chdir(tmp_path)
    first = dqn.main(dqn.Args(env_id="ALE/Breakout-v5", encoder="nature", moe="none", total_timesteps=50,
                              learning_starts=1000, buffer_size=500, save_model=True))  # fmt: skip
    with pytest.raises(SystemExit) as err:
        run(resume=first["checkpoint"], total_timesteps=1000)
    assert "is not a rainbow_softmoe checkpoint but a dqn_softmoe one" in str(err.value) and "\n" not in str(err.value)


def test_unknown_preset_is_a_one_line_error():
    out = subprocess.run([sys.executable, SCRIPT, "--preset", "drq"], capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.strip() == "error: unknown --preset 'drq'; choose one of full-rainbow, der, drq-eps"


def test_atari100k_episodes_start_with_0_to_29_noop_agent_steps_that_are_not_learned_or_counted():
    """Dopamine's 100k runner: k ~ U{0..29} agent steps of action 0 (4 frames each) after every reset, not stored as
    transitions, not counted, not scored; the agent's first stack starts after them."""
    args = rb.preset_args("drq-eps", env_id="ALE/Breakout-v5")
    n = 16
    envs = rb.make_env(args, rb.game_from_env_id(args.env_id), n)
    obs, info = envs.reset(seed=0)
    assert (np.asarray(info["episode_frame_number"]) == 0).all()  # ale_py itself adds no no-op frames
    tracker = rb.EpisodeTracker(n, True, False, info, 30, np.random.default_rng(5))
    want = np.random.default_rng(5).integers(0, 30, n)
    first_acted = np.full(n, -1)
    for t in range(32):
        sent = tracker.actions(np.full(n, 3, dtype=np.int32))
        assert ((sent == 0) == (t < want)).all()
        next_obs, rewards, terminated, truncated, info = envs.step(sent)
        step = tracker.step(rewards, terminated, truncated, info)
        assert (step.acted == (t >= want)).all() and not step.valid[t < want].any()
        new = step.acted & (first_acted < 0)
        first_acted[new] = t
        # the first acted step began from a stack of the frame after the no-ops alone
        assert (step.history[new] == 0).all()
        assert (np.asarray(info["episode_frame_number"])[new] == 4 * (want[new] + 1)).all()
    assert (first_acted == want).all() and len(set(want.tolist())) > 8
    envs.close()


def test_phi_adam_eps_gives_phi_its_own_eps_and_leaves_the_rest_at_adam_eps():
    """Adam's first step is lr g / (|g| + eps) per element (bias correction cancels): with Phi's gradient far below
    eps = 1.5e-4 that is a sliver of lr, with --phi-adam-eps 1e-12 it is lr sign(g) for Phi alone."""
    lr = 1e-4
    steps = {}
    for phi_eps in (None, 1e-12):
        args = rb.fill_defaults(rb.preset_args("drq-eps", **SMALL, phi_adam_eps=phi_eps, learning_rate=lr))
        torch.manual_seed(0)
        net = rb.build_network(args, 4)
        optimizer = rb.make_optimizer(net, args)
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        net(torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)).pow(2).mean().mul(1e-3).backward()
        grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
        assert "moe.phi" in grads
        optimizer.step()
        for n, p in net.named_parameters():
            if n not in grads:
                assert torch.equal(p.detach(), before[n]), n
                continue
            eps = phi_eps if (phi_eps and n == "moe.phi") else 1.5e-4
            expected = -lr * grads[n] / (grads[n].abs() + eps)
            assert torch.allclose(p.detach() - before[n], expected, atol=lr * 1e-3), n
        steps[phi_eps] = float((net.moe.phi.detach() - before["moe.phi"]).abs().mean() / lr)
    assert steps[1e-12] > 0.9 and steps[None] < 0.01, steps


def test_eta_counts_only_learning_intervals_so_it_does_not_grow_as_the_rate_settles(monkeypatch, capsys):
    script = rb
    args = script.Args(total_timesteps=10_000, log_every_seconds=1.0, write_every_minutes=1e9)

    class Writer:
        def add_scalar(self, *a, **kw):
            pass

    clock = [0.0]
    monkeypatch.setattr(script.time, "time", lambda: clock[0])
    run = script.Run(args, "breakout", "unused", Writer(), {}, [], start_step=0, t_start=0.0, t_log=0.0, t_write=0.0)
    # 100 steps/s acting until step 2,000, where learning starts; 10 steps/s from then on
    lines = []
    for t, step, updates in [(10, 1_000, 0), (20, 2_000, 0), (30, 2_100, 100), (40, 2_200, 200), (50, 2_300, 300)]:
        clock[0] = t
        script.log_step(run, step, [], None, 0.0, updates, {}, None, None, None)
        lines.append(capsys.readouterr().out.strip().split(" | ")[-1])
    # before learning: the acting rate gives a lower bound only; the interval in which learning starts is left out
    assert lines[:3] == [
        "ETA over 0h01m30s (learning has not started)",
        "ETA over 0h01m20s (learning has not started)",
        "ETA over 0h13m10s (no whole interval of learning yet)",
    ]
    # learning at a steady 10 steps/s: the ETA is the steps left at that rate and only shrinks
    assert lines[3:] == ["ETA 0h13m00s at the recent rate", "ETA 0h12m50s at the recent rate"]

    # resumed at step 5,000 with 3,000 updates done and no replay memory: acting only while the memory refills
    times = dict(t_start=0.0, t_log=0.0, t_write=0.0)
    run = script.Run(args, "breakout", "unused", Writer(), {}, [], 5_000, **times, log_step=5_000, log_updates=3_000)
    lines = []
    for t, step, updates in [(10, 6_000, 3_000), (20, 7_000, 3_000), (30, 7_100, 3_100), (40, 7_200, 3_200)]:
        clock[0] = t
        script.log_step(run, step, [], None, 0.0, updates, {}, None, None, None)
        lines.append(capsys.readouterr().out.strip().split(" | ")[-1])
    assert lines == [
        "ETA over 0h00m40s (learning has not started)",
        "ETA over 0h00m30s (learning has not started)",
        "ETA over 0h04m50s (no whole interval of learning yet)",
        "ETA 0h04m40s at the recent rate",
    ]
