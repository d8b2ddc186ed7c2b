"""algos/rainbow_softmoe.py: the C51 projection, n-step returns, prioritised replay, NoisyNets, dueling, double DQN and
the DrQ augmentation against hand computations and their definitions; the presets against the reference's gin files;
the update path, the evaluation, snapshots for benchmark/moe_analysis.py; short runs on a real game (every preset,
resume with the replay memory and its priorities, old checkpoints, errors). What rainbow shares with dqn_softmoe.py
byte for byte (the encoders, Soft MoE's maths, the outputs' helpers) is tested there, and the environment in
test_atari.py; a test here checks that it is still the same code."""

import glob
import inspect
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import dqn_softmoe as dqn
import rainbow_softmoe as rb
from benchmark import moe_analysis
from damage import flip_bytes
from envs import atari

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "algos", "rainbow_softmoe.py")


def qnet(num_actions, encoder="impala", moe="softmoe", num_experts=None, tokenization=None, **kw):
    """The script's QNetwork for these options (the reference's defaults for the rest, as main() fills them)."""
    args = rb.fill_defaults(rb.Args(encoder=encoder, moe=moe, num_experts=num_experts, tokenization=tokenization, **kw))
    return rb.build_network(args, num_actions)


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
            _, aux = q_net({"obs": batch["states"]["obs"][i : i + 1]}, return_aux=True)
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
    net = qnet(3, "nature", "none", num_atoms=5, v_min=-2, v_max=2, noisy=False, dueling=True)
    x = {"obs": torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)}
    q, aux = net(x, return_aux=True)
    h = aux["head_input"]
    value, advantage = net.value(h).view(4, 1, 5), net.advantage(h).view(4, 3, 5)
    torch.testing.assert_close(aux["logits"], value + advantage - advantage.mean(1, keepdim=True))
    torch.testing.assert_close(q, (torch.softmax(aux["logits"], -1) * torch.linspace(-2, 2, 5)).sum(-1))
    assert aux["logits"].shape == (4, 3, 5) and net.support.tolist() == [-2, -1, 0, 1, 2]
    scalar = qnet(3, "nature", "none", num_atoms=1, noisy=False)
    q, aux = scalar(x, return_aux=True)
    torch.testing.assert_close(q, aux["logits"][..., 0])  # num_atoms 1: Q is the single logit


# ----------------------------------------------------------------------------------------------------------------------
# NoisyNets
# ----------------------------------------------------------------------------------------------------------------------
def test_noisy_layer_noise_statistics_and_its_mean_in_eval_mode():
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
    layer.eval()  # evaluation mode: the means
    torch.testing.assert_close(layer(x)[0], (layer.weight_mu[:, 0] + layer.bias_mu).detach())


def test_eval_mode_switches_the_noise_off_in_every_noisy_layer_and_the_experts():
    torch.manual_seed(4)
    args = rb.fill_defaults(rb.Args(encoder="nature", num_experts=2, expert_width=16))
    net = rb.build_network(args, 4)
    x = {"obs": torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)}
    assert net.training and not torch.allclose(net(x), net(x))  # noisy experts and heads
    net.eval()
    torch.testing.assert_close(net(x), net(x))
    # with the noise off the experts are their means
    experts = net.moe.experts
    assert hasattr(experts, "w1_sigma") and not experts.training
    net.train()
    assert not torch.allclose(net(x), net(x))  # and back on in train mode
    plain = rb.fill_defaults(rb.Args(encoder="nature", num_experts=2, expert_width=16, noisy=False))
    assert not hasattr(rb.build_network(plain, 4).moe.experts, "w1_sigma")


def test_per_sample_noise_is_each_samples_own_factorised_matrix_in_a_layer_and_in_the_experts():
    torch.manual_seed(12)
    layer, x = rb.NoisyLinear(50, 30), torch.randn(3, 50)
    layer.per_sample = True
    torch.manual_seed(13)
    y = layer(x)
    torch.manual_seed(13)  # the same draws, in the layer's order: f(e_in) then f(e_out), one row per sample
    e_in, e_out = rb.factorised_noise((3, 50), "cpu"), rb.factorised_noise((3, 30), "cpu")
    for b in range(3):  # sample b through its own noisy matrix, formed
        weight = layer.weight_mu + layer.weight_sigma * torch.outer(e_out[b], e_in[b])
        expected = weight @ x[b] + layer.bias_mu + layer.bias_sigma * e_out[b]
        torch.testing.assert_close(y[b], expected, rtol=1e-5, atol=1e-5)
    experts = rb.Experts(rb.fill_defaults(rb.Args(encoder="nature", num_experts=2, expert_width=8)), 6)
    experts.per_sample = True
    slots = torch.randn(3, 2, 4, 6)  # (B, n, slots, d)
    torch.manual_seed(14)
    out, hidden = experts(slots)
    torch.manual_seed(14)
    e_in, e_out = rb.factorised_noise((2, 3, 1, 6), "cpu"), rb.factorised_noise((2, 3, 1, 8), "cpu")
    for b in range(3):
        for e in range(2):  # expert e's first layer for sample b: its own matrix, the same for the sample's slots
            w1 = experts.w1[e] + experts.w1_sigma[e] * torch.outer(e_in[e, b, 0], e_out[e, b, 0])
            h = torch.relu(slots[b, e] @ w1 + experts.b1[e] + experts.b1_sigma[e] * e_out[e, b, 0])
            torch.testing.assert_close(hidden[b, e], h, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out[b, e], h @ experts.w2[e] + experts.b2[e], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("moe", ["none", "softmoe"])
def test_an_updates_online_pass_draws_noise_per_sample_and_its_target_and_acting_one_per_batch(moe):
    """The reference's `train` (labs/moes agents) gives each sample of the online pass its own key, and the target's
    passes one key for the batch: on a batch of one state repeated, the online logits differ between rows, the
    target's do not; acting after the update draws one noise for the batch again."""
    torch.manual_seed(15)
    args = rb.fill_defaults(rb.Args(encoder="nature", moe=moe, num_experts=2, expert_width=16))
    q_net, target_net = rb.build_network(args, 4), rb.build_network(args, 4)
    batch = random_batch(4, 4)
    for key in ("states", "next_states"):
        batch[key] = {"obs": batch[key]["obs"][:1].repeat(4, 1, 1, 1)}
    targets = []
    target_net.register_forward_hook(lambda module, inputs, output: targets.append(output[1]["logits"]))
    for per_sample in (True, False):
        args.noise_per_sample = per_sample
        _, metrics = rb.rainbow_loss(q_net, target_net, batch, args)
        online = metrics["aux"]["logits"].detach()
        assert all(torch.equal(online[0], online[b]) != per_sample for b in (1, 2, 3))
        assert all(torch.allclose(targets[-1][0], targets[-1][b]) for b in (1, 2, 3))
        assert not any(getattr(module, "per_sample", False) for module in q_net.modules())
        with torch.no_grad():
            q = q_net(batch["states"])
        assert all(torch.allclose(q[0], q[b]) for b in (1, 2, 3))  # acting: one draw for the batch


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
    tracker = atari.EpisodeTracker(3, "dopamine", envs.info())
    obs, log = envs.stack.copy(), []  # log[t][k] = (reward, terminal, valid) of row t
    for _ in range(120):
        next_obs, reward, terminated, truncated, info = envs.step()
        step = tracker.step(reward, terminated, truncated, info)
        replay.add(frames=obs[:, -1], actions=np.zeros(3), rewards=reward, terminals=step.terminal, valid=step.valid,
                   history=step.history)  # unclipped, to see sums  # fmt: skip
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
        assert batch["next_states"]["obs"][i, -1, 0, 0] == (t + length) % 256  # the frame of s_{t+L}
        assert batch["states"]["obs"][i, -1, 0, 0] == t % 256


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
    tracker = atari.EpisodeTracker(2, "dopamine", envs.info())
    obs = envs.stack.copy()
    for _ in range(40):
        next_obs, reward, terminated, truncated, info = envs.step()
        step = tracker.step(reward, terminated, truncated, info)
        replay.add(frames=obs[:, -1], actions=np.zeros(2), rewards=reward, terminals=step.terminal, valid=step.valid,
                   history=step.history)  # fmt: skip
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
# Presets and defaults (dopamine/labs/moes/configs/full_rainbow.gin, DER.gin; labs/atari_100k/configs/DrQ_eps.gin)
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
    # one snapshot per 10k-step iteration at 100k (the old in-training analysis's cadence), none otherwise
    assert der.snapshot_every == drq.snapshot_every == 10_000 and rb.Args().snapshot_every == 0
    # explicit flags on the command line override the preset; the old --analysis-every still names the snapshots
    args = rb.parse_args(["--preset", "der", "--n-step", "20", "--env-id", "ALE/Pong-v5", "--analysis-every", "0"])
    assert (args.preset, args.n_step, args.learning_starts, args.snapshot_every) == ("der", 20, 1600, 0)


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
# The update, the evaluation, the code shared with dqn_softmoe.py
# ----------------------------------------------------------------------------------------------------------------------
def random_batch(size: int = 8, num_actions: int = 3) -> dict:
    return {
        "states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "next_states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "actions": torch.randint(0, num_actions, (size,)),
        "rewards": torch.randn(size),
        "terminals": (torch.rand(size) < 0.3).float(),
        "weights": torch.rand(size),
    }


SMALL = dict(encoder="nature", num_experts=2, expert_width=32)


@pytest.mark.parametrize("preset, kw", [("full-rainbow", {}), ("drq-eps", {}), ("full-rainbow", dict(random_phi=True))])
def test_train_step_is_the_loss_backward_and_adam_step_and_reports_phis_gradient(preset, kw):
    """The loop's one update path (eager; --cuda-graph records the same function): rainbow_loss, backward, Adam, with
    the per-sample loss that sets the priorities; for a learned Phi the RMS of its gradient (losses/phi_grad_rms)."""
    args = rb.fill_defaults(rb.preset_args(preset, **SMALL, **kw, learning_rate=1e-3))
    torch.manual_seed(1)
    nets = [rb.build_network(args, 3) for _ in range(3)]
    nets[1].load_state_dict(nets[0].state_dict())
    batch = random_batch()
    torch.manual_seed(2)  # the noise, the augmentation and a random Phi draw the same numbers in both
    metrics = rb.train_step(nets[0], nets[2], rb.make_optimizer(nets[0], args), batch, args)
    torch.manual_seed(2)
    optimizer = rb.make_optimizer(nets[1], args)
    loss, expected = rb.rainbow_loss(nets[1], nets[2], batch, args)
    loss.backward()
    optimizer.step()
    assert torch.equal(metrics["td_loss"], expected["td_loss"])
    assert torch.equal(metrics["per_sample_loss"], expected["per_sample_loss"])
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True))
    if kw.get("random_phi"):
        assert "phi_grad_rms" not in metrics
    else:
        assert torch.equal(metrics["phi_grad_rms"], nets[1].moe.phi.grad.pow(2).mean().sqrt())


def test_evaluation_plays_each_game_to_its_end_with_the_noise_off_and_repeats_for_the_same_seed():
    args = rb.fill_defaults(rb.preset_args("der", env_id="ALE/Breakout-v5", max_episode_frames=400, **SMALL))
    torch.manual_seed(0)
    net = rb.build_network(args, 4)
    games = [rb.evaluate(net, args, "breakout", 3, "cpu", np.random.default_rng([1, 500])) for _ in range(2)]
    assert games[0] == games[1] and len(games[0]) == 3  # the same checkpoint and seed: the same returns
    assert all(0 < length <= 100 for _, length in games[0])  # 400 frames = 100 agent steps, no-op starts not counted
    assert all(module.training for module in net.modules())  # train mode again: the noise is back on for training


def test_the_code_shared_with_dqn_is_byte_identical():
    """The shared helper block at the end of every script and the functions rainbow takes unchanged from
    dqn_softmoe.py, so that a diff between the scripts shows the algorithm and dqn's tests cover these."""

    def shared_block(module):
        text = inspect.getsource(module)
        start = text.index("# Shared helpers: byte-identical")
        return text[start : text.index('if __name__ == "__main__":', start)]

    assert shared_block(rb) == shared_block(dqn)
    names = ("lecun_normal_ xavier_layer same_padding pad_same conv_same NatureEncoder tokenize l2_normalize soft_moe "
             "top1_route importance_loss load_loss load_balancing_loss count_parameters build_network architecture "
             "epsilon_schedule make_optimizer to_tensors GraphedUpdate GraphedPolicy period_crossed eta "
             "iteration_returns restore replay_path save_replay remove_stale_replays "
             "load_replay SoftMoE Top1MoE network_inputs select_actions ObservationOnly observation_batch "
             "observation_step").split()  # fmt: skip
    for name in names:
        assert inspect.getsource(getattr(rb, name)) == inspect.getsource(getattr(dqn, name)), name
    # read_checkpoint differs by one clause: a checkpoint at the last step resumes into the final evaluation it lacks
    ours, theirs = (inspect.getsource(m.read_checkpoint).splitlines() for m in (rb, dqn))
    assert [line.split("  #")[0].strip() for line in ours if line not in theirs] == [
        'step, evaluated = ckpt["global_step"], [e["global_step"] for e in ckpt.get("evaluations", [])]',
        "evaluation_left = step == args.total_timesteps and args.eval_episodes and step not in evaluated",
        "if step >= args.total_timesteps and not evaluation_left:",
    ]


def test_the_eta_uses_the_rate_since_learning_started_and_is_a_lower_bound_before(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    clock = [0.0]
    monkeypatch.setattr(rb.time, "time", lambda: clock[0])
    args = rb.fill_defaults(rb.Args(moe="none", encoder="nature", total_timesteps=10_000, log_every_seconds=10.0))
    net = rb.build_network(args, 4)
    run = rb.Run(args, "breakout", net, net, None, rb.FrameReplay(100, 1), None, "cpu", 0, 0, [])
    lines = []
    for t, step, updates in [(10, 1_000, 0), (20, 2_000, 1), (30, 2_100, 100), (40, 2_200, 200)]:
        clock[0] = t
        run.log_step(step, [], None, updates, {}, {"epsilon": 1.0})
        lines.append(capsys.readouterr().out.strip().split(" | ")[-1])
    assert lines == [
        "ETA over 0h01m30s (not yet learning for a whole interval)",  # 9,000 steps at 100 steps/s
        "ETA over 0h01m20s (not yet learning for a whole interval)",  # learning started at step 2,000, t = 20
        "ETA 0h13m10s at the rate while learning",  # 7,900 steps at (2,100 - 2,000) / (30 - 20) steps/s
        "ETA 0h13m00s at the rate while learning",
    ]
    run.writer.close()


# ----------------------------------------------------------------------------------------------------------------------
# Runs on a real game
# ----------------------------------------------------------------------------------------------------------------------
def run(preset="full-rainbow", **kw):
    kw = {
        "env_id": "ALE/Breakout-v5",
        "buffer_size": 3000,
        "log_every_seconds": 1000.0,
        "snapshot_every": 0,
        "batch_size": 8,
    } | kw  # batches of 8: quicker updates, the same code
    return rb.main(rb.preset_args(preset, **kw))


SMOKE = [
    ("full-rainbow", dict(SMALL, total_timesteps=300, learning_starts=200, num_envs=2)),
    ("full-rainbow", dict(encoder="nature", moe="none", compact=True, total_timesteps=300, learning_starts=200)),
    ("der", dict(SMALL, total_timesteps=260, learning_starts=200, eval_episodes=3, max_episode_frames=400)),
    ("drq-eps", dict(SMALL, total_timesteps=260, learning_starts=200, eval_episodes=3, eval_every=240,
                     max_episode_frames=400)),
    pytest.param("full-rainbow", dict(encoder="impala", moe="top1", tokenization="perfeat", num_experts=2,
                                      total_timesteps=240, learning_starts=200, impala_kernel=4),
                 marks=pytest.mark.slow),
]  # fmt: skip


@pytest.mark.parametrize("preset, kw", SMOKE, ids=["full-rainbow", "compact-none", "der", "drq-eps", "top1-impala4"])
def test_smoke_run_on_breakout(tmp_path, monkeypatch, preset, kw):
    monkeypatch.chdir(tmp_path)
    summary = run(preset, **kw)
    saved = json.loads((tmp_path / "runs" / summary["run_name"] / "summary.json").read_text())
    assert saved["complete"] and saved["global_step"] >= kw["total_timesteps"]
    ratio = rb.preset_args(preset, **kw).replay_ratio
    expected = int((saved["global_step"] - kw["learning_starts"]) * ratio)
    assert abs(saved["updates"] - expected) <= kw.get("num_envs", 1)
    if kw.get("eval_episodes"):  # Atari 100k: an evaluation every --eval-every steps and one after training
        evaluations = saved["evaluations"]
        assert len(evaluations) == (2 if kw.get("eval_every") else 1) and evaluations[-1]["episodes"] == 3
        assert saved["eval_mean_return"] == pytest.approx(np.mean(evaluations[-1]["returns"]))
        assert saved["eval_human_normalized_score"] == pytest.approx((saved["eval_mean_return"] - 1.7) / 28.8)


def test_a_resumed_run_keeps_the_evaluations_of_the_segments_before_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, learning_starts=200, eval_episodes=1, eval_every=240, max_episode_frames=200, save_model=True)
    first = run("drq-eps", total_timesteps=250, **kw)  # evaluations at 240 and after training, at 250
    resumed = run("drq-eps", total_timesteps=260, resume=first["checkpoint"], **kw)
    saved = json.loads((tmp_path / "runs" / resumed["run_name"] / "summary.json").read_text())
    assert [e["global_step"] for e in saved["evaluations"]] == [240, 250, 260]
    assert saved["evaluations"][:2] == json.loads(json.dumps(first["evaluations"]))
    assert saved["eval_mean_return"] == saved["evaluations"][-1]["mean_return"]


def test_a_run_stopped_in_its_final_evaluation_resumes_into_it_without_training_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, learning_starts=200, eval_episodes=1, max_episode_frames=200, save_model=True)
    evaluate = rb.evaluate

    def stopped_while_playing(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rb, "evaluate", stopped_while_playing)
    with pytest.raises(KeyboardInterrupt):
        run("drq-eps", total_timesteps=250, **kw)
    (checkpoint,) = (tmp_path / "runs").glob("*/rainbow_softmoe.pt")
    state = torch.load(checkpoint, weights_only=False)
    assert state["global_step"] == 250 and state["evaluations"] == []  # the trained network, not yet evaluated
    assert not json.loads((checkpoint.parent / "summary.json").read_text())["complete"]
    monkeypatch.setattr(rb, "evaluate", evaluate)
    resumed = run("drq-eps", total_timesteps=250, resume=str(checkpoint), **kw)
    assert resumed["complete"] and resumed["start_step"] == 250 and resumed["updates"] == state["updates"]
    assert [e["global_step"] for e in resumed["evaluations"]] == [250]
    with pytest.raises(SystemExit, match="is already at step 250; raise --total-timesteps"):  # evaluated: nothing left
        run("drq-eps", total_timesteps=250, resume=resumed["checkpoint"], **kw)


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
    flipped = flip_bytes(first["checkpoint"], tmp_path / "flipped.pt")  # 200 bytes of a weight: torch.load takes it
    with pytest.raises(SystemExit, match=r"is damaged \(.*/data/\d+ fails its CRC-32 check\); restore it from a copy"):
        run(total_timesteps=300, resume=flipped, **kw)
    state = {k: v for k, v in saved.items() if k not in ("priorities", "max_priority")}  # a uniform run's memory
    np.savez(rb.replay_path(first["checkpoint"], 200), **state)
    with pytest.raises(SystemExit, match="its replay memory holds no priorities .* add --uniform-replay"):
        run(total_timesteps=300, resume=first["checkpoint"], **kw)


def test_a_corrupt_or_truncated_replay_file_is_a_one_line_error_at_resume(tmp_path, monkeypatch):
    """A flipped byte (the zip's CRC-32) or a cut file in a prioritised memory stops the resume with one line naming
    the file, before a run directory is made (load_replay is dqn_softmoe.py's, tested there for a missing array)."""
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, total_timesteps=50, learning_starts=1000, save_model=True, checkpoint_replay=True)
    path = run(**kw)["checkpoint"]
    replay = rb.replay_path(path, 50)
    good = open(replay, "rb").read()
    runs, mid = sorted(os.listdir("runs")), len(good) // 2
    damages = {"BadZipFile: Bad CRC-32": good[:mid] + bytes([good[mid] ^ 1]) + good[mid + 1 :],
               "BadZipFile: File is not a zip file": good[:-100]}  # fmt: skip
    for cause, damage in damages.items():
        open(replay, "wb").write(damage)
        with pytest.raises(SystemExit) as err:
            run(**dict(kw, total_timesteps=100, resume=path))
        message = str(err.value)
        assert message.startswith(f"error: --resume: the replay memory {replay!r} is truncated or corrupt ({cause}")
        assert "\n" not in message and sorted(os.listdir("runs")) == runs


def test_a_checkpoint_of_the_script_before_snapshots_resumes_with_its_replay_memory(tmp_path, monkeypatch):
    """Checkpoints of runs started before --snapshot-every (the 100k queues') hold analysis_every, ntk_memory_mb,
    save_replay and save_replay_rows in their arguments; only the architecture is matched, so they resume, with the
    replay memory and its priorities, and go on learning at once."""
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, learning_starts=100, save_model=True, checkpoint_replay=True)
    path = run(total_timesteps=150, **kw)["checkpoint"]
    ckpt = torch.load(path, weights_only=True)
    ckpt["args"] = {k: v for k, v in ckpt["args"].items() if k != "snapshot_every"}
    ckpt["args"] |= {"analysis_every": 250_000, "ntk_memory_mb": 512, "save_replay": None, "save_replay_rows": 10**6}
    torch.save(ckpt, path)
    resumed = run(total_timesteps=170, resume=path, **kw)
    assert resumed["start_step"] == 150 and resumed["updates"] == ckpt["updates"] + int(19 * 0.25)  # no refill


def test_a_snapshot_gives_the_statistics_of_the_runs_networks_with_the_noise_off(tmp_path, monkeypatch):
    """benchmark/moe_analysis.py on a rainbow snapshot: the run's networks with the noise off, the probe transitions
    with unit importance weights and the run's torch generator state (which DrQ's augmentation draws from); the
    snapshots leave the run's updates and episodes unchanged."""
    monkeypatch.chdir(tmp_path)
    kw = dict(SMALL, total_timesteps=220, learning_starts=150, max_episode_frames=400, eval_episodes=0, save_model=True)
    plain, snapped = run("drq-eps", **kw), run("drq-eps", **kw | dict(snapshot_every=100))
    a, b = (torch.load(s["checkpoint"], weights_only=True) for s in (plain, snapped))
    assert all(torch.equal(a["q_net"][k], b["q_net"][k]) for k in a["q_net"]) and a["episodes"] == b["episodes"]
    paths = sorted(glob.glob(os.path.join(os.path.dirname(snapped["checkpoint"]), "snapshots", "*.pt")))
    assert [os.path.basename(p) for p in paths] == ["rainbow_softmoe_151.pt", "rainbow_softmoe_200.pt"]
    out = moe_analysis.analyse_snapshot(paths[-1])
    snap = torch.load(paths[-1], weights_only=True)
    args = rb.fill_defaults(rb.Args(**snap["args"]))
    net = rb.build_network(args, 4).to(memory_format=torch.channels_last)
    net.load_state_dict(snap["q_net"])
    net.eval()
    batch = snap["probe"] | {"weights": torch.ones(32)}
    torch.set_rng_state(snap["torch_rng"])
    expected = moe_analysis.network_analysis(net, net, batch, args, rb.rainbow_loss)  # target period 1: one network
    assert out == {"global_step": 200} | expected and math.isfinite(out["routing_dispatch_entropy"])


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(num_atoms=0), "--num-atoms must be at least 1"),
        (dict(n_step=0), "--n-step must be at least 1"),
        (dict(v_min=10.0, v_max=-10.0), "--v-min (10.0) must be below --v-max (-10.0)"),
        (dict(eval_every=1000), "--eval-every needs --eval-episodes"),
        (dict(encoder="nature", impala_kernel=4), "--impala-kernel needs --encoder impala"),
        (dict(eval_epsilon=2.0), "--eval-epsilon must lie in [0, 1]"),
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
    monkeypatch.chdir(tmp_path)
    torch.save({"format": "dqn_softmoe/2", "architecture": {}}, tmp_path / "other.pt")
    with pytest.raises(SystemExit) as err:
        run(resume=str(tmp_path / "other.pt"), total_timesteps=1000)
    assert "is not a rainbow_softmoe checkpoint but a dqn_softmoe one" in str(err.value) and "\n" not in str(err.value)


def test_unknown_preset_is_a_one_line_error():
    out = subprocess.run([sys.executable, SCRIPT, "--preset", "drq"], capture_output=True, text=True)
    assert out.returncode != 0
    assert out.stderr.strip() == "error: unknown --preset 'drq'; choose one of full-rainbow, der, drq-eps"
