"""algos/dqn_softmoe.py: Soft MoE / Top1-MoE against their equations, encoders and parameter counts against the
reference table, the frame-once replay against the stacks ale_py returns, the DQN pieces, and short runs on a real
game (smoke runs, checkpoint resume, errors)."""

import functools
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import tyro

import dqn_softmoe as dqn
from damage import flip_bytes
from envs import atari

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "algos", "dqn_softmoe.py")


def qnet(num_actions, encoder="impala", moe="softmoe", num_experts=None, tokenization=None, **kw):
    """The script's QNetwork for these options (the reference's defaults for the rest, as main() fills them)."""
    args = dqn.fill_defaults(
        dqn.Args(encoder=encoder, moe=moe, num_experts=num_experts, tokenization=tokenization, **kw)
    )
    return dqn.build_network(args, num_actions)


def moe_cfg(num_experts, expert_width, moe="softmoe", **kw):
    """The Network options a Soft MoE / Top1-MoE layer reads."""
    return dqn.fill_defaults(dqn.Args(moe=moe, num_experts=num_experts, expert_width=expert_width, **kw))


# ----------------------------------------------------------------------------------------------------------------------
# Soft MoE
# ----------------------------------------------------------------------------------------------------------------------
def test_dispatch_sums_to_one_over_tokens_and_combine_over_all_slots():
    torch.manual_seed(0)
    layer = dqn.SoftMoE(moe_cfg(8, 32), dim=16, num_tokens=121)
    outputs, aux = layer(torch.randn(3, 121, 16))
    assert layer.slots == 16 and outputs.shape == (3, 121, 16)
    dispatch, combine = aux["dispatch"], aux["combine"]  # (B, m, n, p)
    assert dispatch.shape == combine.shape == (3, 121, 8, 16)
    torch.testing.assert_close(dispatch.sum(1), torch.ones(3, 8, 16))  # every slot: weights over tokens
    torch.testing.assert_close(combine.sum((2, 3)), torch.ones(3, 121))  # every token: weights over n*p slots
    assert aux["hidden"].shape == (3, 8, 16, 32)


def paper_soft_moe(X, Phi, experts, p):
    """§2.2 written out with loops for one sample: X (m, d), Phi (d, n*p), experts[e](x) -> y."""
    m, np_ = X.shape[0], Phi.shape[1]
    L = [[sum(X[i, k] * Phi[k, j] for k in range(X.shape[1])) for j in range(np_)] for i in range(m)]
    D = [[math.exp(L[i][j]) / sum(math.exp(L[i2][j]) for i2 in range(m)) for j in range(np_)] for i in range(m)]
    C = [[math.exp(L[i][j]) / sum(math.exp(L[i][j2]) for j2 in range(np_)) for j in range(np_)] for i in range(m)]
    X_tilde = [sum(D[i][j] * X[i] for i in range(m)) for j in range(np_)]  # X~ = D^T X
    Y_tilde = [experts[j // p](X_tilde[j]) for j in range(np_)]  # Y~_i = f_{floor(i/p)}(X~_i)
    return torch.stack([sum(C[i][j] * Y_tilde[j] for j in range(np_)) for i in range(m)])  # Y = C Y~


def test_soft_moe_equals_the_papers_equations_on_random_inputs():
    torch.manual_seed(1)
    m, d, n, p, width = 5, 3, 2, 3, 4
    experts = dqn.Experts(moe_cfg(n, width), d).double()
    with torch.no_grad():
        for param in (experts.b1, experts.b2):
            param.normal_()  # non-zero biases so that every term of f_e is exercised
    tokens, phi = torch.randn(2, m, d, dtype=torch.float64), torch.randn(d, n, p, dtype=torch.float64)
    outputs, _, _, _ = dqn.soft_moe(tokens, phi, experts)

    def expert(e):
        return lambda x: torch.relu(x @ experts.w1[e] + experts.b1[e]) @ experts.w2[e] + experts.b2[e]

    for b in range(2):
        expected = paper_soft_moe(tokens[b], phi.reshape(d, n * p), [expert(e) for e in range(n)], p)
        torch.testing.assert_close(outputs[b], expected.detach())


def test_normalised_logits_use_unit_tokens_and_phi_columns_times_the_scalar():
    torch.manual_seed(2)
    experts = dqn.Experts(moe_cfg(2, 8), 4)
    tokens, phi, scale = torch.randn(1, 6, 4), torch.randn(4, 2, 3), torch.tensor([2.5])
    _, dispatch, _, _ = dqn.soft_moe(tokens, phi, experts, scale)
    x_hat = tokens / tokens.norm(dim=-1, keepdim=True)
    phi_hat = 2.5 * phi / phi.norm(dim=0, keepdim=True)
    expected = torch.softmax(torch.einsum("bmd,dnp->bmnp", x_hat, phi_hat), dim=1)
    torch.testing.assert_close(dispatch, expected, atol=1e-5, rtol=1e-5)


def test_perconv_output_permutes_with_its_input_tokens():
    torch.manual_seed(3)
    net = qnet(6, encoder="nature", moe="softmoe", num_experts=4, tokenization="perconv")
    tokens = dqn.tokenize(net.encoder(torch.rand(2, 4, 84, 84)), "perconv").detach()  # (2, 121, 64)
    perm = torch.randperm(tokens.shape[1])
    with torch.no_grad():
        out, _ = net.moe(tokens)
        out_perm, _ = net.moe(tokens[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-4)


def test_random_phi_is_redrawn_at_every_call_and_is_not_a_parameter():
    torch.manual_seed(4)
    layer = dqn.SoftMoE(moe_cfg(2, 4, random_phi=True), dim=8, num_tokens=10)
    assert layer.phi is None and dqn.count_parameters(layer) == 1 + 2 * (8 * 4 + 4 + 4 * 8 + 8)
    tokens = torch.randn(2, 10, 8)
    first, second = layer(tokens)[1]["dispatch"], layer(tokens)[1]["dispatch"]
    assert not torch.allclose(first, second)
    assert not torch.allclose(first[0], first[1])  # one Phi per sample, as the reference's per-sample keys


# ----------------------------------------------------------------------------------------------------------------------
# Parameter counts (the reference's networks: dopamine/labs/moes/architectures/softmoe.py and networks.py)
# ----------------------------------------------------------------------------------------------------------------------
def parts(net):
    return {name: dqn.count_parameters(child) for name, child in net.named_children()}


def test_parameter_counts_match_the_reference_table():
    assert dqn.count_parameters(dqn.Experts(moe_cfg(1, 512), 64)) == 66_112
    assert dqn.count_parameters(dqn.Experts(moe_cfg(8, 512), 64)) == 528_896
    assert dqn.count_parameters(dqn.Experts(moe_cfg(1, 512), 32)) == 33_312
    assert dqn.count_parameters(dqn.Experts(moe_cfg(8, 512), 32)) == 266_496

    nature_moe = parts(qnet(18, "nature", "softmoe", 8, "perconv"))
    assert nature_moe["moe"] == 528_896 + 64 * 8 * 16 + 1  # experts + Phi + the scalar
    assert nature_moe["head"] == 139_410
    impala_moe = parts(qnet(18, "impala", "softmoe", 8, "perconv"))
    assert impala_moe["moe"] == 266_496 + 32 * 8 * 16 + 1
    assert impala_moe["encoder"] == 4 * 16 * 9 + 16 + 4 * (16 * 16 * 9 + 16) + 16 * 32 * 9 + 32 + 9 * (32 * 32 * 9 + 32)
    nature_base = parts(qnet(18, "nature", "none"))
    assert nature_base["dense"] == 3_965_440 and nature_base["head"] == 9_234
    assert (
        nature_base["encoder"] == nature_moe["encoder"] == (4 * 64 * 32 + 32) + (32 * 16 * 64 + 64) + (64 * 9 * 64 + 64)
    )
    assert parts(qnet(18, "impala", "none"))["dense"] == 1_982_976

    # Fig. 1: Soft MoE with 8 experts against the baseline widened 8-fold
    wide = parts(qnet(18, "nature", "none", width_multiplier=8))
    assert wide["dense"] == 7744 * 4096 + 4096 and wide["head"] == 4096 * 18 + 18
    assert sum(nature_moe.values()) < sum(wide.values()) / 10
    # Fig. 5: experts of width 512 / 8
    assert dqn.count_parameters(dqn.Experts(moe_cfg(8, 64), 64)) == 8 * (64 * 64 + 64 + 64 * 64 + 64)
    top1 = parts(qnet(18, "nature", "top1", 8, "perconv"))
    assert top1["moe"] == 528_896 + 64 * 8  # router Dense(n) without bias


@pytest.mark.parametrize(
    "encoder, tokenization, experts, slots",
    [
        ("nature", "perconv", (1, 2, 4, 8), (121, 61, 31, 16)),
        ("impala", "perconv", (1, 2, 4, 8), (121, 61, 31, 16)),
        ("nature", "perfeat", (1, 2, 4, 8), (64, 32, 16, 8)),
        ("impala", "perfeat", (1, 2, 4, 8), (32, 16, 8, 4)),
        ("nature", "persamp", (1, 8), (1, 1)),
    ],
)
def test_slots_per_expert(encoder, tokenization, experts, slots):
    for n, p in zip(experts, slots, strict=True):
        assert qnet(4, encoder, "softmoe", n, tokenization, expert_width=8).moe.slots == p


# ----------------------------------------------------------------------------------------------------------------------
# Top1-MoE and the load-balancing losses (dopamine/labs/moes/architectures/moe.py, routers.py, agents/losses.py)
# ----------------------------------------------------------------------------------------------------------------------
def test_top1_capacity_token_order_dropping_and_gate_scaling():
    torch.manual_seed(5)
    layer = dqn.Top1MoE(moe_cfg(2, 4, moe="top1"), dim=2, num_tokens=6)
    with torch.no_grad():
        layer.router.copy_(torch.tensor([[3.0, 0.0], [0.0, 3.0]]))
        layer.experts.b1.normal_()
        layer.experts.b2.normal_()
    # tokens 0-3 prefer expert 0 (token 3 most strongly), tokens 4-5 expert 1; capacity ceil(6 / 2) = 3
    tokens = torch.tensor([[[1.0, 0], [2, 0], [3, 0], [5, 0], [0, 1], [0, 2]]])
    outputs, aux = layer(tokens)
    assert layer.capacity == 3
    assert aux["expert"].tolist() == [[0, 0, 0, 0, 1, 1]]
    assert aux["kept"].tolist() == [[True, True, True, False, True, True]]  # token order, not router score, decides
    assert torch.all(outputs[0, 3] == 0)  # an overflowing token outputs zero (no pass-through)
    probs = torch.softmax(tokens @ layer.router, -1)
    for i, e in ((0, 0), (1, 0), (2, 0), (4, 1), (5, 1)):
        x = tokens[0, i]
        f = torch.relu(x @ layer.experts.w1[e] + layer.experts.b1[e]) @ layer.experts.w2[e] + layer.experts.b2[e]
        torch.testing.assert_close(outputs[0, i], probs[0, i, e] * f)
    # each expert processes C slots; expert 1's unused slot holds a zero vector (hidden = relu(b1))
    assert aux["hidden"].shape == (1, 2, 3, 4)
    torch.testing.assert_close(aux["hidden"][0, 1, 2], torch.relu(layer.experts.b1[1]))


def test_top1_each_token_reaches_at_most_one_expert_and_capacity_holds():
    torch.manual_seed(6)
    probs = torch.softmax(torch.randn(4, 121, 8) * 3, -1)
    expert, gate, position, kept = dqn.top1_route(probs, capacity=16)
    torch.testing.assert_close(gate, probs.max(-1).values)
    chosen = torch.nn.functional.one_hot(expert, 8) * kept[..., None]  # (B, m, n): at most one 1 per token
    assert chosen.sum(-1).max() <= 1
    assert chosen.sum(1).max() <= 16  # no expert takes more than its capacity
    for b in range(4):  # the kept tokens of an expert are its first ones in token order
        for e in range(8):
            routed = (expert[b] == e).nonzero().flatten()
            assert kept[b, routed].tolist() == [True] * min(len(routed), 16) + [False] * max(len(routed) - 16, 0)


def test_importance_loss_on_hand_made_routing():
    all_to_one = torch.tensor([[[1.0, 0.0]] * 4])  # importance (4, 0): std / mean = 1
    assert dqn.importance_loss(all_to_one).item() == pytest.approx(1.0)
    assert dqn.importance_loss(torch.full((2, 4, 2), 0.5)).item() == pytest.approx(0.0)
    skewed = torch.tensor([[[0.75, 0.25]] * 4])  # importance (3, 1): mean 2, std 1
    assert dqn.importance_loss(skewed).item() == pytest.approx(0.25)


def test_load_loss_on_hand_made_routing():
    def normal_cdf(x):
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    logits = torch.tensor([[[1.0, 0.0]] * 3])  # every token's winner is expert 0 (no noise drawn)
    p = np.array([1 - normal_cdf(0.0), 1 - normal_cdf(1.0)])  # P(expert wins) with sigma = 1
    expected = (p.std() / p.mean()) ** 2
    assert dqn.load_loss(logits, logits, 1.0).item() == pytest.approx(expected, rel=1e-5)
    assert dqn.load_loss(torch.zeros(2, 5, 4), torch.zeros(2, 5, 4), 0.25).item() == pytest.approx(0.0)
    far = torch.tensor([[[10.0, 0.0]] * 3])  # P = (0.5, ~0): coefficient of variation 1
    assert dqn.load_loss(far, far, 0.5).item() == pytest.approx(1.0, rel=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# Encoders and tokens
# ----------------------------------------------------------------------------------------------------------------------
def test_same_padding_matches_the_reference_table():
    def pads(size, kernel, stride):
        x = dqn.pad_same(torch.ones(1, 1, size, size), kernel, stride)
        rows = x[0, 0, :, size // 2]
        before = int((rows == 0).nonzero().lt(size // 2).sum())
        return before, x.shape[-1] - size - before

    assert pads(84, 8, 4) == (2, 2) and pads(21, 4, 2) == (1, 2) and pads(11, 3, 1) == (1, 1)
    assert pads(84, 3, 2) == (0, 1) and pads(42, 3, 2) == (0, 1) and pads(21, 3, 2) == (1, 1)
    pooled = dqn.pad_same(torch.full((1, 1, 21, 21), -5.0), 3, 2, value=float("-inf"))
    assert torch.nn.functional.max_pool2d(pooled, 3, 2).max() == -5.0  # -inf padding never wins the max


def test_conv_same_equals_the_conv_of_the_padded_input():
    torch.manual_seed(0)
    for size, (i, o, k, s) in ((84, (4, 32, 8, 4)), (21, (32, 64, 4, 2)), (11, (64, 64, 3, 1))):
        conv = torch.nn.Conv2d(i, o, k, s).double()
        x = torch.randn(2, i, size, size, dtype=torch.float64, requires_grad=True)
        ours = dqn.conv_same(conv, x)
        ref = conv(dqn.pad_same(x, k, s))
        assert torch.allclose(ours, ref, atol=1e-12)
        g = torch.randn_like(ref)
        grads = torch.autograd.grad((ours * g).sum(), [x, conv.weight])
        ref_grads = torch.autograd.grad((ref * g).sum(), [x, conv.weight])
        assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grads, ref_grads, strict=True))


def test_encoder_output_and_token_shapes():
    x = torch.rand(2, 4, 84, 84)
    nature, impala = dqn.NatureEncoder()(x), dqn.ImpalaEncoder()(x)
    assert nature.shape == (2, 64, 11, 11) and impala.shape == (2, 32, 11, 11)
    sizes = [84]
    for conv in dqn.NatureEncoder().convs:
        sizes.append(-(-sizes[-1] // conv.stride[0]))
    assert sizes == [84, 21, 11, 11]
    expected = {"perconv": ((121, 64), (121, 32)), "perfeat": ((64, 121), (32, 121)), "persamp": ((1, 7744), (1, 3872))}
    for kind, (n_shape, i_shape) in expected.items():
        assert dqn.tokenize(nature, kind).shape == (2, *n_shape)
        assert dqn.tokenize(impala, kind).shape == (2, *i_shape)
    # perconv token k is the channel vector at grid position (k // 11, k % 11); perfeat is its transpose
    torch.testing.assert_close(dqn.tokenize(nature, "perconv")[1, 25], nature[1, :, 2, 3])
    torch.testing.assert_close(dqn.tokenize(nature, "perfeat"), dqn.tokenize(nature, "perconv").transpose(1, 2))


def test_q_network_outputs_for_every_variant():
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    for encoder in ("nature", "impala"):
        for moe, tokenization in (("softmoe", "perconv"), ("top1", "perfeat"), ("softmoe", "persamp"), ("none", None)):
            net = qnet(5, encoder, moe, 2, tokenization, expert_width=16)
            q, aux = net({"obs": x}, return_aux=True)
            assert q.shape == (3, 5) and torch.isfinite(q).all() and "hidden" in aux


# ----------------------------------------------------------------------------------------------------------------------
# Replay memory
# ----------------------------------------------------------------------------------------------------------------------
def collect(protocol, steps, capacity, num_envs=2, seed=3, truncation_is_terminal=False, max_episode_frames=108_000):
    """Random play on Breakout stored exactly as the training loop stores it; returns the replay memory, every
    observation the agent saw (steps, num_envs, 4, 84, 84), the rewards and the finished episodes."""
    envs = atari.make_env(protocol, "breakout", num_envs, max_episode_frames)
    replay = dqn.FrameReplay(capacity, num_envs)
    obs, info = envs.reset(seed=seed)
    tracker = atari.EpisodeTracker(num_envs, protocol, info, truncation_is_terminal=truncation_is_terminal)
    rng = np.random.default_rng(seed)
    observations, rewards, finished = [], [], []
    for _ in range(steps):
        actions = rng.integers(0, envs.single_action_space.n, size=num_envs).astype(np.int32)
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        step = tracker.step(reward, terminated, truncated, info)
        replay.add(frames=obs[:, -1], actions=actions, rewards=np.clip(reward, -1, 1), terminals=step.terminal,
                   valid=step.valid, history=step.history)  # fmt: skip
        finished += step.finished
        observations.append(obs)
        rewards.append(reward)
        obs = tracker.agent_view(next_obs)
    envs.close()
    return replay, np.stack(observations), np.stack(rewards), finished


@pytest.mark.parametrize("protocol", ["dopamine", "nature"])
def test_rebuilt_stacks_equal_the_stacks_the_environment_returned(protocol):
    steps = 700
    replay, observations, rewards, finished = collect(protocol, steps, capacity=2 * (steps + 1))
    assert len(finished) >= 2 and (~replay.valid[:steps]).sum() >= 2  # several episode boundaries were crossed
    ages = np.arange(steps)
    for env in range(2):
        np.testing.assert_array_equal(replay.stacks(ages, np.full(steps, env)), observations[:, env])
    np.testing.assert_array_equal(replay.rewards[:steps], np.clip(rewards, -1, 1))
    if protocol == "nature":  # a lost life is terminal; the game goes on but the agent starts a new stack
        lost_life = replay.terminals[: steps - 1] & replay.valid[1:steps]
        assert lost_life.any() and (replay.history[1:steps][lost_life] == 0).all()
        after = np.flatnonzero(lost_life[:, 0])[0] + 1
        assert observations[after, 0, :3].max() == 0 and observations[after + 1, 0, :2].max() == 0

    batch = replay.sample(256, np.random.default_rng(0))
    age = (batch["rows"] - (replay.cursor - replay.count)) % replay.rows
    np.testing.assert_array_equal(batch["states"]["obs"], observations[age, batch["envs"]])
    np.testing.assert_array_equal(batch["next_states"]["obs"], observations[age + 1, batch["envs"]])
    assert replay.valid[batch["rows"], batch["envs"]].all()  # never the reset step that follows an episode end


def test_the_step_cut_by_the_time_limit_is_stored_but_never_sampled():
    # 400 frames = 100 agent steps per episode: every episode of random Breakout play ends at the cap
    replay, _, _, finished = collect("dopamine", 450, capacity=2 * 500, max_episode_frames=400)
    assert len(finished) >= 4 and all(length == 100 for _, _, length in finished)
    cut_rows = [99, 200, 301]  # 100 steps (the last one cut), the reset step (invalid), the next episode
    for env in range(2):
        for row in cut_rows:
            assert not replay.valid[row, env] and not replay.terminals[row, env] and replay.valid[row - 1, env]
    batch = replay.sample(2000, np.random.default_rng(0), n_step=3)
    age = (batch["rows"] - (replay.cursor - replay.count)) % replay.rows
    for row in cut_rows:  # no n-step window reaches the cut transition: rows row-2 .. row are never drawn
        assert not np.isin(age, [row - 2, row - 1, row]).any()
    assert not batch["terminals"].any()  # the cut is not a terminal
    # Dopamine at HEAD: the cut is stored as a terminal transition and sampled
    replay, _, _, _ = collect("dopamine", 250, capacity=2 * 300, max_episode_frames=400, truncation_is_terminal=True)
    assert replay.valid[99].all() and replay.terminals[99].all()


def test_stacks_after_the_memory_wraps_around():
    replay, observations, _, _ = collect("dopamine", steps=400, capacity=2 * 150)
    assert replay.count == replay.rows == 150
    first = 400 - 150  # observation index of the oldest row kept
    ages = np.arange(3, 150)  # the oldest rows may reach into overwritten frames
    for env in range(2):
        np.testing.assert_array_equal(replay.stacks(ages, np.full(len(ages), env)), observations[first + ages, env])
    batch = replay.sample(128, np.random.default_rng(1))
    age = (batch["rows"] - (replay.cursor - replay.count)) % replay.rows
    assert (age >= replay.history[batch["rows"], batch["envs"]]).all()
    np.testing.assert_array_equal(batch["states"]["obs"], observations[first + age, batch["envs"]])
    np.testing.assert_array_equal(batch["next_states"]["obs"], observations[first + age + 1, batch["envs"]])


class FakeVectorEnv:
    """NEXT_STEP autoreset with zero-filled stacks, like ale_py; frame pixel (0, 0) = episode id, (0, 1) = step + 1."""

    def __init__(self, num_envs, lengths):
        self.num_envs, self.lengths = num_envs, lengths  # lengths[k]: episode lengths of env k, cycled
        self.episode = np.zeros(num_envs, dtype=int)
        self.t = np.zeros(num_envs, dtype=int)
        self.stack = np.zeros((num_envs, 4, 84, 84), dtype=np.uint8)
        self.ids = [0] * num_envs
        self.next_id = 1
        self.done = np.zeros(num_envs, dtype=bool)
        for k in range(num_envs):
            self._new_episode(k)

    def _frame(self, k):
        frame = np.zeros((84, 84), dtype=np.uint8)
        frame[0, 0], frame[0, 1] = self.ids[k], self.t[k] + 1
        return frame

    def _new_episode(self, k):
        self.ids[k], self.next_id = self.next_id, self.next_id % 250 + 1
        self.t[k] = 0
        self.stack[k] = 0
        self.stack[k, -1] = self._frame(k)

    def info(self):
        return {"lives": np.zeros(self.num_envs, dtype=int), "episode_frame_number": 4 * self.t.copy()}

    def step(self):
        terminated = np.zeros(self.num_envs, dtype=bool)
        reward = np.ones(self.num_envs)
        for k in range(self.num_envs):
            if self.done[k]:  # the reset step: new episode, reward 0
                self._new_episode(k)
                self.done[k], reward[k] = False, 0.0
                continue
            self.t[k] += 1
            self.stack[k] = np.roll(self.stack[k], -1, 0)
            self.stack[k, -1] = self._frame(k)
            length = self.lengths[k][self.episode[k] % len(self.lengths[k])]
            if self.t[k] >= length:
                terminated[k] = self.done[k] = True
                self.episode[k] += 1
        return self.stack.copy(), reward, terminated, np.zeros(self.num_envs, dtype=bool), self.info()


def test_sampled_stacks_never_mix_episodes():
    env = FakeVectorEnv(2, lengths=[[1, 2, 5, 3, 9], [4, 1, 1, 7]])
    replay = dqn.FrameReplay(2 * 37, 2)
    tracker = atari.EpisodeTracker(2, "dopamine", env.info())
    obs = env.stack.copy()
    for _ in range(300):
        next_obs, reward, terminated, truncated, info = env.step()
        step = tracker.step(reward, terminated, truncated, info)
        replay.add(frames=obs[:, -1], actions=np.zeros(2), rewards=reward, terminals=step.terminal, valid=step.valid,
                   history=step.history)  # fmt: skip
        obs = next_obs
    batch = replay.sample(512, np.random.default_rng(2))
    for key in ("states", "next_states"):
        stacks = batch[key]["obs"]  # (B, 4, 84, 84)
        episode, step = stacks[:, :, 0, 0].astype(int), stacks[:, :, 0, 1].astype(int)
        present = episode > 0
        assert present[:, -1].all()  # the newest frame is always real
        assert (np.diff(present.astype(int), axis=1) >= 0).all()  # zeros only before the episode's first frame
        assert ((episode == episode[:, -1:]) | ~present).all()  # one episode per stack
        gaps = np.diff(step, axis=1)[present[:, :-1]]
        assert (gaps == 1).all()  # consecutive steps of that episode
    assert (batch["next_states"]["obs"][:, -1, 0, 0] == batch["states"]["obs"][:, -1, 0, 0]).all()
    assert batch["terminals"].any() and not (batch["rewards"] == 0).any()  # no reset step was stored as a transition


def test_bytes_per_transition():
    assert dqn.FrameReplay.BYTES_PER_TRANSITION == 84 * 84 + 8
    replay = dqn.FrameReplay(1000, 4)
    assert replay.nbytes == 1000 * dqn.FrameReplay.BYTES_PER_TRANSITION
    assert 1_000_000 * dqn.FrameReplay.BYTES_PER_TRANSITION < 7.5e9  # the "about 7.5 GB" for 1M


# ----------------------------------------------------------------------------------------------------------------------
# DQN pieces and analysis metrics
# ----------------------------------------------------------------------------------------------------------------------
def test_defaults_follow_the_labs_moes_dqn_config():
    args = dqn.fill_defaults(dqn.Args())
    assert (args.learning_rate, args.adam_eps, args.batch_size, args.gamma) == (6.25e-5, 1.5e-4, 32, 0.99)
    assert (args.replay_ratio, args.target_network_frequency, args.learning_starts) == (0.25, 8000, 20_000)
    assert (args.end_e, args.epsilon_decay_steps, args.buffer_size) == (0.01, 250_000, 1_000_000)
    assert (args.num_experts, args.tokenization, args.expert_width, args.encoder) == (8, "perconv", 512, "impala")
    assert args.protocol == "dopamine" and args.max_episode_frames == 108_000 and not args.truncation_is_terminal
    assert args.n_step == 1 and args.iteration_steps == 250_000


def test_epsilon_schedule_is_dopamines_linear_decay_after_warmup():
    def eps(t):
        return dqn.epsilon_schedule(t, 250_000, 20_000, 0.01)

    assert eps(0) == eps(20_000) == 1.0
    assert eps(20_000 + 125_000) == pytest.approx(0.505)
    assert eps(270_000) == pytest.approx(0.01) and eps(10**7) == pytest.approx(0.01)
    assert eps(20_001) < 1.0


def test_td_target():
    next_q = torch.tensor([[1.0, 3.0], [2.0, -1.0], [0.5, 0.2]])
    target = dqn.td_target(next_q, torch.tensor([1.0, -1.0, 0.0]), torch.tensor([0.0, 1.0, 0.0]), 0.9)
    torch.testing.assert_close(target, torch.tensor([1 + 0.9 * 3, -1.0, 0.9 * 0.5]))


def test_target_network_period():
    for step_size in (1, 3, 8):
        steps = range(0, 100_000, step_size)
        crossings = [b for a, b in zip(steps, steps[1:], strict=False) if dqn.period_crossed(a, b, 8000)]
        assert len(crossings) == 12  # 8000, 16000, ..., 96000 whatever the number of environments
        assert all(c % 8000 < step_size for c in crossings)


def train_step(q_net, target_net, optimizer, batch, **kw):
    """The training loop's update: dqn_loss, then one optimiser step."""
    args = dqn.fill_defaults(dqn.Args(moe="none", **kw))
    loss, metrics = dqn.dqn_loss(q_net, target_net, batch, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return metrics


def test_dqn_loss_is_the_mean_squared_td_error_with_the_n_step_discount():
    torch.manual_seed(9)
    q_net, target_net = qnet(3, "nature", moe="none"), qnet(3, "nature", moe="none")
    batch = random_batch()
    for n_step in (1, 3):
        args = dqn.fill_defaults(dqn.Args(moe="none", n_step=n_step, gamma=0.9))
        loss, metrics = dqn.dqn_loss(q_net, target_net, batch, args)
        with torch.no_grad():
            y = (
                batch["rewards"]
                + 0.9**n_step * (1 - batch["terminals"]) * target_net(batch["next_states"]).max(1).values
            )
            q = q_net(batch["states"])[torch.arange(8), batch["actions"]]
        torch.testing.assert_close(metrics["per_sample_loss"].detach(), (y - q) ** 2)
        torch.testing.assert_close(loss, ((y - q) ** 2).mean())


def test_train_step_moves_q_towards_the_td_target_and_leaves_the_target_network_alone():
    torch.manual_seed(7)
    q_net, target_net = qnet(3, "nature", moe="none"), qnet(3, "nature", moe="none")
    target_before = [p.clone() for p in target_net.parameters()]
    optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3, eps=1.5e-4)
    batch = {
        "states": {"obs": torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)},
        "next_states": {"obs": torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)},
        "actions": torch.randint(0, 3, (8,)),
        "rewards": torch.ones(8),
        "terminals": torch.ones(8),  # target = r = 1
    }
    first = train_step(q_net, target_net, optimizer, batch)["td_loss"]
    for _ in range(10):
        last = train_step(q_net, target_net, optimizer, batch)["td_loss"]
    assert last < first
    assert all(torch.equal(a, b) for a, b in zip(target_before, target_net.parameters(), strict=True))


def random_batch(size: int = 8, num_actions: int = 3) -> dict:
    return {
        "states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "next_states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "actions": torch.randint(0, num_actions, (size,)),
        "rewards": torch.randn(size),
        "terminals": (torch.rand(size) < 0.3).float(),
    }


def test_fused_adam_and_channels_last_give_the_same_update_as_the_plain_step():
    torch.manual_seed(3)
    plain, target = qnet(3, "nature", moe="none"), qnet(3, "nature", moe="none")
    fast = qnet(3, "nature", moe="none")
    fast.load_state_dict(plain.state_dict())
    fast = fast.to(memory_format=torch.channels_last)
    opt_plain = torch.optim.Adam(plain.parameters(), lr=1e-3, eps=1.5e-4)
    opt_fast = torch.optim.Adam(fast.parameters(), lr=1e-3, eps=1.5e-4, fused=True)
    for _ in range(3):
        batch = random_batch()
        train_step(plain, target, opt_plain, batch)
        train_step(fast, target, opt_fast, batch)
    for a, b in zip(plain.parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_train_step_is_the_loss_backward_and_adam_step_and_reports_phis_gradient():
    """The loop's one update path (eager; --cuda-graph records the same function): dqn_loss, backward, Adam; for a
    learned Phi the RMS of its gradient (losses/phi_grad_rms), for a random Phi or no MoE none."""
    for kw in (
        dict(moe="softmoe", num_experts=2),
        dict(moe="softmoe", num_experts=2, random_phi=True),
        dict(moe="none"),
    ):
        args = dqn.fill_defaults(dqn.Args(encoder="nature", learning_rate=1e-3, **kw))
        torch.manual_seed(1)
        nets = [dqn.build_network(args, 3) for _ in range(3)]
        nets[1].load_state_dict(nets[0].state_dict())
        batch = random_batch()
        torch.manual_seed(2)
        metrics = dqn.train_step(nets[0], nets[2], dqn.make_optimizer(nets[0], args), batch, args)
        torch.manual_seed(2)
        optimizer = dqn.make_optimizer(nets[1], args)
        loss, expected = dqn.dqn_loss(nets[1], nets[2], batch, args)
        loss.backward()
        optimizer.step()
        assert torch.equal(metrics["td_loss"], expected["td_loss"])
        assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True))
        if kw["moe"] == "softmoe" and not kw.get("random_phi"):
            assert torch.equal(metrics["phi_grad_rms"], nets[1].moe.phi.grad.pow(2).mean().sqrt())
            assert torch.equal(metrics["phi_norm"], nets[1].moe.phi.detach().norm())  # after the step: losses/phi_norm
        else:
            assert "phi_grad_rms" not in metrics and "phi_norm" not in metrics


def test_phi_adam_eps_gives_phi_its_own_eps_and_leaves_the_rest_at_adam_eps():
    """Adam's first step is lr g / (|g| + eps) per element (bias correction cancels): with Phi's gradient far below
    eps = 1.5e-4 that is a sliver of lr, with --phi-adam-eps 1e-12 it is lr sign(g) for Phi alone."""
    lr, steps = 1e-4, {}
    for phi_eps in (None, 1e-12):
        args = dqn.fill_defaults(dqn.Args(encoder="nature", num_experts=4, phi_adam_eps=phi_eps, learning_rate=lr))
        torch.manual_seed(0)
        net = dqn.build_network(args, 4)
        optimizer = dqn.make_optimizer(net, args)
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        net({"obs": torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)}).pow(2).mean().mul(1e-3).backward()
        grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
        optimizer.step()
        for n, p in net.named_parameters():
            if n not in grads:  # the scalar of --moe-normalize: unused, unchanged
                assert torch.equal(p.detach(), before[n]), n
                continue
            eps = phi_eps if (phi_eps and n == "moe.phi") else 1.5e-4
            expected = -lr * grads[n] / (grads[n].abs() + eps)
            assert torch.allclose(p.detach() - before[n], expected, atol=lr * 1e-3), n
        moved, g = (net.moe.phi.detach() - before["moe.phi"]).abs() / lr, grads["moe.phi"].abs()
        steps[phi_eps] = (float(moved[g > 1e-10].min()), float(moved.max()), float((g > 1e-10).float().mean()))
    # with eps 1e-12 every element whose |g| is well above it moves by lr (Phi's |g| spans ~1e-15 to ~1e-9 here)
    assert steps[1e-12][0] > 0.98 and steps[1e-12][2] > 0.1 and steps[None][1] < 0.01, steps


def test_bf16_encoder_keeps_float32_outputs_close_to_the_float32_network():
    torch.manual_seed(4)
    full = qnet(5, "nature", moe="softmoe", num_experts=4)
    half = qnet(5, "nature", moe="softmoe", num_experts=4, bf16=True)
    half.load_state_dict(full.state_dict())
    x = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    q_full, q_half = full({"obs": x}), half({"obs": x})
    assert q_half.dtype == torch.float32
    assert (q_half - q_full).abs().max() <= 0.02 * q_full.abs().max()
    q_half.sum().backward()  # gradients reach the encoder through the autocast region
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in half.encoder.parameters())


def test_a_resume_keeps_adams_moments_and_takes_this_runs_optimizer_settings():
    """optimizer.load_state_dict alone would bring back the saved lr and eps (and capturable, which --cuda-graph
    needs): restore keeps the checkpoint's moments and this run's flags."""
    torch.manual_seed(0)
    net = qnet(4, "nature", moe="softmoe", num_experts=4)
    saved = dqn.make_optimizer(net, dqn.fill_defaults(dqn.Args(encoder="nature", num_experts=4, learning_rate=1e-3)))
    net({"obs": torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)}).sum().backward()
    saved.step()
    rng = np.random.default_rng(0)
    ckpt = {"q_net": net.state_dict(), "target_net": net.state_dict(), "optimizer": saved.state_dict(),
            "numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "replay_state": None,
            "global_step": 7, "updates": 3, "episodes": []}  # fmt: skip
    args = dqn.fill_defaults(dqn.Args(encoder="nature", num_experts=4, learning_rate=5e-4, adam_eps=1e-8))
    optimizer = dqn.make_optimizer(net, args)
    assert dqn.restore(ckpt, net, net, optimizer, None, rng) == (7, 3, [])
    assert [(g["lr"], g["eps"], g["capturable"]) for g in optimizer.param_groups] == [(5e-4, 1e-8, False)]
    assert len(optimizer.state) == len(saved.state) > 0
    for p, state in saved.state.items():
        assert torch.equal(optimizer.state[p]["exp_avg"], state["exp_avg"])


def test_iteration_returns_average_the_episodes_that_end_in_each_complete_iteration():
    episodes = [(10, 1.0, 5), (100, 3.0, 5), (101, 10.0, 5), (250, 20.0, 5), (260, 99.0, 5)]
    out = dqn.iteration_returns(episodes, 100, global_step=300)
    assert out == [
        {"iteration": 0, "end_step": 100, "mean_return": 2.0, "episodes": 2},
        {"iteration": 1, "end_step": 200, "mean_return": 10.0, "episodes": 1},
        {"iteration": 2, "end_step": 300, "mean_return": 59.5, "episodes": 2},
    ]
    assert dqn.iteration_returns(episodes, 100, global_step=299)[-1]["iteration"] == 1  # iteration 2 is not over
    assert dqn.iteration_returns([], 100, 1000) == []


# ----------------------------------------------------------------------------------------------------------------------
# Runs on a real game
# ----------------------------------------------------------------------------------------------------------------------
def run(**kw):
    kw.setdefault("env_id", "ALE/Breakout-v5")
    kw.setdefault("buffer_size", 2000)
    kw.setdefault("log_every_seconds", 1000.0)
    kw.setdefault("snapshot_every", 0)
    kw.setdefault("batch_size", 8)  # quicker updates, the same code
    return dqn.main(dqn.Args(**kw))


SMOKE = [
    dict(moe="softmoe", encoder="nature", snapshot_every=250, save_model=True),
    dict(
        moe="top1",
        encoder="nature",
        tokenization="perfeat",
        num_experts=4,
        load_balance_coef=1.0,
        num_envs=2,
        snapshot_every=250,
    ),
    dict(moe="none", encoder="nature", width_multiplier=2, capture_video=True),
    dict(moe="softmoe", encoder="nature", random_phi=True, moe_normalize=True, expert_width=64, protocol="nature"),
    dict(moe="softmoe", encoder="impala", snapshot_every=250, learning_starts=260),
    pytest.param(dict(moe="top1", encoder="impala", learning_starts=270), marks=pytest.mark.slow),
    pytest.param(dict(moe="none", encoder="impala", learning_starts=270), marks=pytest.mark.slow),
]  # the slow two: the Impala encoder and each head are in the default suite already


@pytest.mark.parametrize("kw", SMOKE, ids=lambda kw: f"{kw['moe']}-{kw['encoder']}")
def test_smoke_run_on_breakout(tmp_path, monkeypatch, kw):
    monkeypatch.chdir(tmp_path)
    kw = {"total_timesteps": 300, "learning_starts": 200, **kw}
    summary = run(**kw)
    run_dir = tmp_path / "runs" / summary["run_name"]
    saved = json.loads((run_dir / "summary.json").read_text())
    for key in ("args", "global_step", "wall_time", "sps", "mean_return_last_100", "human_normalized_score"):
        assert key in saved, key
    assert saved["global_step"] >= 300 and saved["complete"]
    # the replay ratio is per agent step, whatever the number of environments
    expected_updates = int((saved["global_step"] - kw["learning_starts"]) * 0.25)
    assert abs(saved["updates"] - expected_updates) <= kw.get("num_envs", 1)
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    if kw.get("snapshot_every"):  # one snapshot, where 250 is first crossed while learning (moe_analysis.py reads it)
        assert len(list((run_dir / "snapshots").glob("dqn_softmoe_*.pt"))) == 1
    if kw.get("capture_video"):
        assert (run_dir / "videos" / "episode-0.mp4").exists()
    if kw.get("save_model"):
        assert (run_dir / "dqn_softmoe.pt").exists()


def test_checkpoint_resume_continues_the_step_counter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = functools.partial(globals()["run"], encoder="nature", expert_width=32)  # a small network: a quick test
    first = run(moe="top1", total_timesteps=300, learning_starts=150, save_model=True)
    path = str(tmp_path / first["checkpoint"])
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["global_step"] == 300 and ckpt["updates"] == first["updates"] > 0 and ckpt["format"] == "dqn_softmoe/2"
    resumed = run(moe="top1", total_timesteps=450, learning_starts=100, save_model=True, resume=path)
    assert resumed["start_step"] == 300 and resumed["global_step"] == 450
    assert resumed["updates"] == first["updates"] + int((450 - 400) * 0.25)  # replay refilled for 100 steps first
    again = torch.load(resumed["checkpoint"], weights_only=True)
    assert again["episodes"][: len(ckpt["episodes"])] == ckpt["episodes"]  # the episode history continues
    assert any(not torch.equal(a, b) for a, b in zip(ckpt["q_net"].values(), again["q_net"].values(), strict=True))

    # the wrong architecture, a corrupt file or a finished budget: one line, nothing written
    (tmp_path / "empty.pt").write_bytes(b"")
    os.makedirs("elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"not a checkpoint")
    flipped = flip_bytes(path, tmp_path / "flipped.pt")  # 200 bytes of a weight tensor: torch.load would accept it
    cases = [
        (dict(moe="top1", resume=flipped), "fails its CRC-32 check); restore it from a copy"),
        (dict(moe="softmoe", resume=path), "another architecture"),
        (dict(moe="top1", num_experts=4, resume=path), "num_experts: checkpoint 8 vs requested 4"),
        (dict(moe="top1", env_id="ALE/Pong-v5", resume=path), "env_id"),
        (dict(moe="top1", total_timesteps=300, resume=path), "already at step 300"),
        (dict(moe="top1", resume=str(bad)), "not a readable checkpoint"),
        (dict(moe="top1", resume=str(tmp_path / "empty.pt")), "not a readable checkpoint"),
        (dict(moe="top1", resume=str(tmp_path / "missing.pt")), "no such file"),
    ]
    for kw, message in cases:
        with pytest.raises(SystemExit) as err:
            run(**{"total_timesteps": 1000, **kw})
        assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not os.path.exists("runs")


@pytest.mark.parametrize("kw", [dict(replay_ratio=1.0), dict(num_envs=4), dict(num_envs=4, n_step=3)])
def test_learning_from_step_0_waits_for_a_whole_stack(tmp_path, monkeypatch, kw):
    monkeypatch.chdir(tmp_path)
    summary = run(moe="none", encoder="nature", total_timesteps=40, learning_starts=0, **kw)
    assert summary["complete"] and summary["updates"] > 0


def test_resume_with_the_replay_memory_learns_at_once_from_the_same_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = dict(moe="softmoe", encoder="nature", num_experts=2, expert_width=32)  # a small network: a quick test
    first = run(**small, total_timesteps=300, learning_starts=270, save_model=True, checkpoint_replay=True)
    path = first["checkpoint"]
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["replay"] == os.path.basename(dqn.replay_path(path, 300))
    saved = np.load(dqn.replay_path(path, 300))
    count = int(saved["pointers"][1])  # 300 agent steps, plus a reset step after each finished episode
    assert (
        count >= 300
        and saved["frames"].shape == (count, 1, 84, 84)
        and list(saved["pointers"]) == [count, count, 2000, 1]
    )
    memory = dqn.FrameReplay(2000, 1)
    memory.load_state_dict(dqn.load_replay(path, ckpt["replay"]))
    assert not memory.valid[count - 1].any()  # the interrupted episode's last row has no stored successor
    for name in ("frames", "actions", "rewards", "terminals", "history"):
        np.testing.assert_array_equal(getattr(memory, name)[:count], saved[name])
    rng_a, rng_b = np.random.default_rng(), np.random.default_rng()
    rng_a.bit_generator.state = rng_b.bit_generator.state = ckpt["numpy_rng"]
    a, b = memory.sample(32, rng_a), memory.sample(32, rng_b)
    assert all(np.array_equal(a[k], b[k]) for k in a if k not in ("states", "next_states"))
    assert all(np.array_equal(a[k]["obs"], b[k]["obs"]) for k in ("states", "next_states"))
    resumed = run(
        **small, total_timesteps=400, learning_starts=270, save_model=True, checkpoint_replay=True, resume=path
    )
    assert resumed["start_step"] == 300 and resumed["updates"] == first["updates"] + int(99 * 0.25)  # no refill
    assert resumed["checkpoint"] != path and os.path.exists(path)  # the resume has its own run directory
    os.remove(dqn.replay_path(path, 300))
    with pytest.raises(SystemExit, match="was saved with its replay memory, but .* is missing"):
        run(**small, total_timesteps=500, resume=path)


def test_a_kill_between_the_replay_and_the_checkpoint_write_leaves_a_consistent_pair(tmp_path, monkeypatch):
    """The replay memory is written first, under its step's name; the checkpoint names it; the older file goes last.
    A kill after the newer replay but before its checkpoint leaves the older checkpoint with its own memory."""
    monkeypatch.chdir(tmp_path)
    kw = dict(
        moe="softmoe",
        encoder="nature",
        num_experts=2,
        expert_width=32,
        learning_starts=270,
        save_model=True,
        checkpoint_replay=True,
    )
    path = run(total_timesteps=300, **kw)["checkpoint"]
    own = dict(np.load(dqn.replay_path(path, 300)))
    killed = dqn.FrameReplay(2000, 1)  # what a later write would have put down before the kill: another memory
    killed.add(frames=np.zeros((1, 84, 84), np.uint8), actions=np.zeros(1), rewards=np.zeros(1), terminals=np.zeros(1),
               valid=np.ones(1, bool), history=np.zeros(1))  # fmt: skip
    dqn.save_replay(path, killed, 350)
    ckpt = torch.load(path, weights_only=True)
    loaded = dqn.load_replay(path, ckpt["replay"])
    assert all(np.array_equal(loaded[k], own[k]) for k in own)
    assert list(loaded["pointers"]) != list(np.load(dqn.replay_path(path, 350))["pointers"])
    dqn.remove_stale_replays(path, keep=ckpt["replay"])  # what the next write does once its checkpoint is down
    assert sorted(n for n in os.listdir(os.path.dirname(path)) if "_replay" in n) == [ckpt["replay"]]
    # the resumed run writes its own pair, and its run directory keeps one replay file, the one its checkpoint names
    resumed = run(total_timesteps=400, resume=path, **kw)
    folder = os.path.dirname(resumed["checkpoint"])
    names = sorted(n for n in os.listdir(folder) if "_replay" in n)
    assert names == [torch.load(resumed["checkpoint"], weights_only=True)["replay"]] == [f"{dqn.SCRIPT}_replay_400.npz"]


def test_a_corrupt_or_truncated_replay_file_is_a_one_line_error_at_resume(tmp_path, monkeypatch):
    """The memory is restored whole or not at all: a flipped byte (the zip's CRC-32), a cut file or a file that lacks
    an array (a damaged zip index) stops the resume with one line naming the file, before a run directory is made."""
    monkeypatch.chdir(tmp_path)
    kw = dict(moe="none", encoder="nature", total_timesteps=50, learning_starts=1000, save_model=True)
    kw["checkpoint_replay"] = True
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


def test_a_checkpoint_written_before_snapshots_replaced_the_analysis_resumes(tmp_path, monkeypatch):
    """Checkpoints of runs started before --snapshot-every hold analysis_every (and save_replay) in their arguments;
    only the architecture is matched, so they resume; the old flag name still parses (suites.py, benchmark.sh)."""
    monkeypatch.chdir(tmp_path)
    path = run(moe="none", encoder="nature", total_timesteps=60, learning_starts=1000, save_model=True)["checkpoint"]
    ckpt = torch.load(path, weights_only=True)
    ckpt["args"] = {k: v for k, v in ckpt["args"].items() if k != "snapshot_every"}
    ckpt["args"] |= {"analysis_every": 250_000, "ntk_memory_mb": 512, "save_replay": None, "save_replay_rows": 10**6}
    torch.save(ckpt, path)
    resumed = run(moe="none", encoder="nature", total_timesteps=90, learning_starts=1000, resume=path)
    assert resumed["start_step"] == 60 and resumed["global_step"] == 90
    assert tyro.cli(dqn.Args, args=["--analysis-every", "0"]).snapshot_every == 0


def test_a_checkpoint_of_another_script_is_refused_with_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"format": "rainbow_softmoe/2", "architecture": {}}, tmp_path / "other.pt")
    with pytest.raises(SystemExit) as err:
        run(resume=str(tmp_path / "other.pt"))
    assert "not a dqn_softmoe checkpoint but a rainbow_softmoe one" in str(err.value)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(env_id="ALE/Pongg-v5"), "closest valid ids: ALE/Pong-v5"),
        (dict(learning_rate=float("nan")), "--learning-rate must be a finite number"),
        (dict(n_step=0), "--n-step must be at least 1"),
        (dict(checkpoint_replay=True), "add --save-model"),
        (dict(num_experts=0), "--num-experts must be at least 1"),
        (dict(moe="none", tokenization="perfeat"), "--tokenization needs an MoE"),
        (dict(moe="none", num_experts=8), "--num-experts needs an MoE"),
        (dict(moe="softmoe", width_multiplier=8), "--width-multiplier widens the --moe none baseline"),
        (dict(moe="top1", random_phi=True), "--random-phi and --moe-normalize"),
        (dict(moe="softmoe", load_balance_coef=1.0), "--load-balance-coef needs --moe top1"),
        (dict(buffer_size=10**9), "GB of replay memory"),
        (dict(num_envs=0), "--num-envs"),
    ],
)
def test_bad_input_fails_with_one_line_before_anything_is_written(tmp_path, monkeypatch, kw, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        dqn.main(dqn.Args(**kw))
    assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_command_line_error_is_one_line():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, SCRIPT, "--moe", "none", "--tokenization", "perfeat"], capture_output=True, text=True, env=env
    )
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error: --tokenization needs an MoE")


def test_the_eta_uses_the_rate_since_learning_started_and_is_a_lower_bound_before(tmp_path, monkeypatch, capsys):
    """Steps slow down once learning starts: until learning has run for a whole progress interval the faster rate so
    far gives only a lower bound ("ETA over"); from then on the rate since the first update of this segment."""
    monkeypatch.chdir(tmp_path)
    clock = [0.0]
    monkeypatch.setattr(dqn.time, "time", lambda: clock[0])
    args = dqn.fill_defaults(dqn.Args(moe="none", encoder="nature", total_timesteps=10_000, log_every_seconds=10.0))
    net = dqn.build_network(args, 4)
    run = dqn.Run(args, "breakout", net, net, None, dqn.FrameReplay(100, 1), None, "cpu", 0, 0, [])
    lines = []
    # 100 steps/s acting until step 2,000, where learning starts; 10 steps/s from then on
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
    assert dqn.eta(100, 0.0, 0.0) == "ETA ?"
    run.writer.close()


def test_every_scalar_of_the_metrics_reaches_tensorboard_and_the_summary_with_the_code_that_ran(tmp_path, monkeypatch):
    """A fork adds a term to the loss's metrics dict and nothing else: it is logged as losses/<name> and kept in
    summary.json's "losses"; tensors that are not scalars (the per-sample loss, the activations) are not logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    args = dqn.fill_defaults(dqn.Args(moe="none", encoder="nature", total_timesteps=10_000, log_every_seconds=0.0))
    net = dqn.build_network(args, 4)
    run = dqn.Run(args, "breakout", net, net, None, dqn.FrameReplay(100, 1), None, "cpu", 0, 0, [])
    metrics = {"td_loss": torch.tensor(0.5), "a_new_term": torch.tensor(2.0), "per_sample_loss": torch.ones(3)}
    run.log_step(100, [], None, 1, metrics | {"aux": {"hidden": torch.ones(2, 2)}}, {"epsilon": 1.0})
    run.write_outputs(100, 1, complete=False)
    run.writer.close()
    saved = json.loads((tmp_path / "runs" / run.run_name / "summary.json").read_text())
    assert saved["losses"] == {"td_loss": 0.5, "a_new_term": 2.0}
    events = EventAccumulator(str(tmp_path / "runs" / run.run_name))
    events.Reload()
    assert {"losses/td_loss", "losses/a_new_term"} <= set(events.Tags()["scalars"])
    assert "losses/per_sample_loss" not in events.Tags()["scalars"]
    assert re.fullmatch("[0-9a-f]{40}", saved["code"]["commit"]) and isinstance(saved["code"]["uncommitted"], list)


def test_learning_curve_tool_plots_a_run_and_refuses_a_folder_without_its_episodes_in_one_line(tmp_path, monkeypatch):
    from benchmark import learning_curve

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "episodes.csv").write_text("global_step,return,length\n100,1.0,50\n250,3.0,60\n")
    (tmp_path / "sarsa").mkdir()
    (tmp_path / "sarsa" / "episodes.csv").write_text("episode,score\n1,2\n")
    cases = [(["nowhere"], "'nowhere' holds no episodes.csv"), ([str(tmp_path / "sarsa")], "lacks global_step")]
    for argv, message in cases:
        monkeypatch.setattr("sys.argv", ["learning_curve.py", *argv])
        with pytest.raises(SystemExit, match=message):
            learning_curve.main()
    monkeypatch.setattr("sys.argv", ["learning_curve.py", str(tmp_path / "run")])
    learning_curve.main()
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 0
