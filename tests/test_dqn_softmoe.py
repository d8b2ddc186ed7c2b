"""algos/dqn_softmoe.py: Soft MoE / Top1-MoE against their equations, encoders and parameter counts against the
reference table, the frame-once replay against the stacks ale_py returns, the DQN pieces, and short runs on a real
game (smoke runs, checkpoint resume, errors)."""

import csv
import json
import math
import os
import subprocess
import sys

import dqn_softmoe as dqn
import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "algos", "dqn_softmoe.py")
SCORES_CSV = "/work/shared/reference/atari_scores.csv"


# ----------------------------------------------------------------------------------------------------------------------
# Soft MoE
# ----------------------------------------------------------------------------------------------------------------------
def test_dispatch_sums_to_one_over_tokens_and_combine_over_all_slots():
    torch.manual_seed(0)
    layer = dqn.SoftMoE(dim=16, num_tokens=121, num_experts=8, width=32)
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
    experts = dqn.Experts(n, d, width).double()
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
    experts = dqn.Experts(2, 4, 8)
    tokens, phi, scale = torch.randn(1, 6, 4), torch.randn(4, 2, 3), torch.tensor([2.5])
    _, dispatch, _, _ = dqn.soft_moe(tokens, phi, experts, scale)
    x_hat = tokens / tokens.norm(dim=-1, keepdim=True)
    phi_hat = 2.5 * phi / phi.norm(dim=0, keepdim=True)
    expected = torch.softmax(torch.einsum("bmd,dnp->bmnp", x_hat, phi_hat), dim=1)
    torch.testing.assert_close(dispatch, expected, atol=1e-5, rtol=1e-5)


def test_perconv_output_permutes_with_its_input_tokens():
    torch.manual_seed(3)
    net = dqn.QNetwork(6, encoder="nature", moe="softmoe", num_experts=4, tokenization="perconv")
    tokens = dqn.tokenize(net.encoder(torch.rand(2, 4, 84, 84)), "perconv").detach()  # (2, 121, 64)
    perm = torch.randperm(tokens.shape[1])
    with torch.no_grad():
        out, _ = net.moe(tokens)
        out_perm, _ = net.moe(tokens[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-4)


def test_random_phi_is_redrawn_at_every_call_and_is_not_a_parameter():
    torch.manual_seed(4)
    layer = dqn.SoftMoE(dim=8, num_tokens=10, num_experts=2, width=4, random_phi=True)
    assert layer.phi is None and dqn.count_parameters(layer) == 1 + 2 * (8 * 4 + 4 + 4 * 8 + 8)
    tokens = torch.randn(2, 10, 8)
    first, second = layer(tokens)[1]["dispatch"], layer(tokens)[1]["dispatch"]
    assert not torch.allclose(first, second)
    assert not torch.allclose(first[0], first[1])  # one Phi per sample, as the reference's per-sample keys


# ----------------------------------------------------------------------------------------------------------------------
# Parameter counts (softmoe_dopamine.md §1.2, §1.4)
# ----------------------------------------------------------------------------------------------------------------------
def parts(net):
    return {name: dqn.count_parameters(child) for name, child in net.named_children()}


def test_parameter_counts_match_the_reference_table():
    assert dqn.count_parameters(dqn.Experts(1, 64, 512)) == 66_112
    assert dqn.count_parameters(dqn.Experts(8, 64, 512)) == 528_896
    assert dqn.count_parameters(dqn.Experts(1, 32, 512)) == 33_312
    assert dqn.count_parameters(dqn.Experts(8, 32, 512)) == 266_496

    nature_moe = parts(dqn.QNetwork(18, "nature", "softmoe", 8, "perconv"))
    assert nature_moe["moe"] == 528_896 + 64 * 8 * 16 + 1  # experts + Phi + the scalar
    assert nature_moe["head"] == 139_410
    impala_moe = parts(dqn.QNetwork(18, "impala", "softmoe", 8, "perconv"))
    assert impala_moe["moe"] == 266_496 + 32 * 8 * 16 + 1
    assert impala_moe["encoder"] == 4 * 16 * 9 + 16 + 4 * (16 * 16 * 9 + 16) + 16 * 32 * 9 + 32 + 9 * (32 * 32 * 9 + 32)
    nature_base = parts(dqn.QNetwork(18, "nature", "none"))
    assert nature_base["dense"] == 3_965_440 and nature_base["head"] == 9_234
    assert (
        nature_base["encoder"] == nature_moe["encoder"] == (4 * 64 * 32 + 32) + (32 * 16 * 64 + 64) + (64 * 9 * 64 + 64)
    )
    assert parts(dqn.QNetwork(18, "impala", "none"))["dense"] == 1_982_976

    # Fig. 1: Soft MoE with 8 experts against the baseline widened 8-fold
    wide = parts(dqn.QNetwork(18, "nature", "none", width_multiplier=8))
    assert wide["dense"] == 7744 * 4096 + 4096 and wide["head"] == 4096 * 18 + 18
    assert sum(nature_moe.values()) < sum(wide.values()) / 10
    # Fig. 5: experts of width 512 / 8
    assert dqn.count_parameters(dqn.Experts(8, 64, 64)) == 8 * (64 * 64 + 64 + 64 * 64 + 64)
    top1 = parts(dqn.QNetwork(18, "nature", "top1", 8, "perconv"))
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
        assert dqn.QNetwork(4, encoder, "softmoe", n, tokenization, expert_width=8).moe.slots == p


# ----------------------------------------------------------------------------------------------------------------------
# Top1-MoE and the load-balancing losses (softmoe_dopamine.md §2)
# ----------------------------------------------------------------------------------------------------------------------
def test_top1_capacity_token_order_dropping_and_gate_scaling():
    torch.manual_seed(5)
    layer = dqn.Top1MoE(dim=2, num_tokens=6, num_experts=2, width=4)
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
            net = dqn.QNetwork(5, encoder, moe, 2, tokenization, expert_width=16)
            q, aux = net(x, return_aux=True)
            assert q.shape == (3, 5) and torch.isfinite(q).all() and "hidden" in aux


# ----------------------------------------------------------------------------------------------------------------------
# Replay memory
# ----------------------------------------------------------------------------------------------------------------------
def collect(protocol, steps, capacity, num_envs=2, seed=3):
    """Random play on Breakout through the same tracker the training loop uses; returns the replay memory and
    every observation the environments returned (steps, num_envs, 4, 84, 84)."""
    args = dqn.Args(env_id="ALE/Breakout-v5", protocol=protocol, num_envs=num_envs)
    envs = dqn.make_env(args, "breakout")
    replay = dqn.FrameReplay(capacity, num_envs)
    obs, info = envs.reset(seed=seed)
    tracker = dqn.EpisodeTracker(num_envs, protocol == "nature", True, info)
    rng = np.random.default_rng(seed)
    observations, rewards, finished = [], [], []
    for _ in range(steps):
        actions = rng.integers(0, envs.single_action_space.n, size=num_envs).astype(np.int32)
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        finished += tracker.step(replay, obs, actions, reward, terminated, truncated, info)[1]
        observations.append(obs)
        rewards.append(reward)
        obs = next_obs
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
    if protocol == "nature":  # a lost life is terminal but the game (and the stack) goes on
        lost_life = replay.terminals[: steps - 1] & replay.valid[1:steps]
        assert lost_life.any() and (replay.history[1:steps][lost_life] == 3).any()

    batch = replay.sample(256, np.random.default_rng(0))
    age = (batch["rows"] - (replay.cursor - replay.count)) % replay.rows
    np.testing.assert_array_equal(batch["states"], observations[age, batch["envs"]])
    np.testing.assert_array_equal(batch["next_states"], observations[age + 1, batch["envs"]])
    assert replay.valid[batch["rows"], batch["envs"]].all()  # never the reset step that follows an episode end


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
    np.testing.assert_array_equal(batch["states"], observations[first + age, batch["envs"]])
    np.testing.assert_array_equal(batch["next_states"], observations[first + age + 1, batch["envs"]])


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
    tracker = dqn.EpisodeTracker(2, False, True, env.info())
    obs = env.stack.copy()
    for _ in range(300):
        next_obs, reward, terminated, truncated, info = env.step()
        tracker.step(replay, obs, np.zeros(2, dtype=np.int32), reward, terminated, truncated, info)
        obs = next_obs
    batch = replay.sample(512, np.random.default_rng(2))
    for key in ("states", "next_states"):
        stacks = batch[key]  # (B, 4, 84, 84)
        episode, step = stacks[:, :, 0, 0].astype(int), stacks[:, :, 0, 1].astype(int)
        present = episode > 0
        assert present[:, -1].all()  # the newest frame is always real
        assert (np.diff(present.astype(int), axis=1) >= 0).all()  # zeros only before the episode's first frame
        assert ((episode == episode[:, -1:]) | ~present).all()  # one episode per stack
        gaps = np.diff(step, axis=1)[present[:, :-1]]
        assert (gaps == 1).all()  # consecutive steps of that episode
    assert (batch["next_states"][:, -1, 0, 0] == batch["states"][:, -1, 0, 0]).all()
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
    assert (args.num_experts, args.tokenization, args.expert_width, args.encoder) == (8, "perconv", 512, "nature")
    assert args.protocol == "dopamine" and args.max_episode_frames == 108_000


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


def test_train_step_moves_q_towards_the_td_target_and_leaves_the_target_network_alone():
    torch.manual_seed(7)
    q_net, target_net = dqn.QNetwork(3, moe="none"), dqn.QNetwork(3, moe="none")
    target_before = [p.clone() for p in target_net.parameters()]
    optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3, eps=1.5e-4)
    batch = {
        "states": torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8),
        "next_states": torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8),
        "actions": torch.randint(0, 3, (8,)),
        "rewards": torch.ones(8),
        "terminals": torch.ones(8),  # target = r = 1
    }
    first = dqn.train_step(q_net, target_net, optimizer, batch, 0.99, 0.0, 1)["td_loss"]
    for _ in range(10):
        last = dqn.train_step(q_net, target_net, optimizer, batch, 0.99, 0.0, 1)["td_loss"]
    assert last < first
    assert all(torch.equal(a, b) for a, b in zip(target_before, target_net.parameters(), strict=True))


def random_batch(size: int = 8, num_actions: int = 3) -> dict:
    return {
        "states": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8),
        "next_states": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8),
        "actions": torch.randint(0, num_actions, (size,)),
        "rewards": torch.randn(size),
        "terminals": (torch.rand(size) < 0.3).float(),
    }


def test_fused_adam_and_channels_last_give_the_same_update_as_the_plain_step():
    torch.manual_seed(3)
    plain, target = dqn.QNetwork(3, moe="none"), dqn.QNetwork(3, moe="none")
    fast = dqn.QNetwork(3, moe="none")
    fast.load_state_dict(plain.state_dict())
    fast = fast.to(memory_format=torch.channels_last)
    opt_plain = torch.optim.Adam(plain.parameters(), lr=1e-3, eps=1.5e-4)
    opt_fast = torch.optim.Adam(fast.parameters(), lr=1e-3, eps=1.5e-4, fused=True)
    for _ in range(3):
        batch = random_batch()
        dqn.train_step(plain, target, opt_plain, batch, 0.99, 0.0, 1)
        dqn.train_step(fast, target, opt_fast, batch, 0.99, 0.0, 1)
    for a, b in zip(plain.parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bf16_encoder_keeps_float32_outputs_close_to_the_float32_network():
    torch.manual_seed(4)
    full, half = dqn.QNetwork(5, moe="softmoe", num_experts=4), dqn.QNetwork(5, moe="softmoe", num_experts=4, bf16=True)
    half.load_state_dict(full.state_dict())
    x = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    q_full, q_half = full(x), half(x)
    assert q_half.dtype == torch.float32
    assert (q_half - q_full).abs().max() <= 0.02 * q_full.abs().max()
    q_half.sum().backward()  # gradients reach the encoder through the autocast region
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in half.encoder.parameters())


def test_analysis_metrics_on_hand_made_inputs():
    hidden = torch.tensor([[1.0, 0.0, 2.0, 0.0], [3.0, 0.0, 1.0, 0.0]])  # units 1 and 3 never fire
    assert dqn.dormant_fraction(hidden) == 0.5
    moe_hidden = torch.zeros(2, 3, 4, 5)
    moe_hidden[:, 1, :, 2] = 1.0  # unit 2 fires in one expert: alive once averaged over experts and slots
    assert dqn.dormant_fraction(moe_hidden) == pytest.approx(0.8)
    assert dqn.srank(torch.eye(6), 0.01) == 6
    assert dqn.srank(torch.diag(torch.tensor([100.0, 0.5, 0.1])), 0.01) == 1  # 100 / 100.6 >= 0.99
    assert dqn.srank(torch.diag(torch.tensor([100.0, 2.0, 0.1])), 0.01) == 2  # 100 / 102.1 < 0.99 <= 102 / 102.1
    assert dqn.threshold_rank(torch.diag(torch.tensor([100.0, 2.0, 0.5])), 0.01) == 2
    features = torch.tensor([[1.0, 0.0], [3.0, 2.0]])  # variances (1, 1)
    assert dqn.feature_norm(features) == pytest.approx(math.sqrt(2))


def test_empirical_ntk_is_the_gram_matrix_of_per_sample_gradients_in_any_number_of_passes():
    torch.manual_seed(8)
    net = dqn.QNetwork(3, moe="softmoe", num_experts=2, tokenization="perfeat", expert_width=8)
    batch = {"states": torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8), "actions": torch.tensor([0, 1, 2, 0])}
    targets = torch.randn(4)
    one_pass = dqn.empirical_ntk(net, batch, targets)
    many_passes = dqn.empirical_ntk(net, batch, targets, memory_bytes=4 * 4 * 30_000)
    torch.testing.assert_close(one_pass, many_passes, rtol=1e-5, atol=1e-6 * float(one_pass.abs().max()))
    q = net(batch["states"][1:2])[0, 1]
    grads = torch.autograd.grad((targets[1] - q) ** 2, list(net.parameters()), allow_unused=True)
    norm2 = sum(float((g**2).sum()) for g in grads if g is not None)
    assert one_pass[1, 1].item() == pytest.approx(norm2, rel=1e-4)
    assert torch.allclose(one_pass, one_pass.T) and torch.linalg.eigvalsh(one_pass).min() > -1e-6 * one_pass.max()


# ----------------------------------------------------------------------------------------------------------------------
# Game names and scores
# ----------------------------------------------------------------------------------------------------------------------
def test_env_ids_map_to_roms_and_unknown_ones_suggest_close_names():
    assert dqn.game_from_env_id("ALE/MsPacman-v5") == "ms_pacman"
    assert dqn.game_from_env_id("ALE/Pong-v5") == "pong" and dqn.game_from_env_id("ALE/TicTacToe3D-v5")
    assert dqn.game_from_env_id("PongNoFrameskip-v4") is None and dqn.game_from_env_id("ALE/Pongg-v5") is None
    assert "ALE/Pong-v5" in dqn.unknown_env_message("ALE/Pongg-v5")
    assert "ALE/SpaceInvaders-v5" in dqn.unknown_env_message("SpaceInvader")


def test_human_normalised_score_and_the_embedded_table():
    assert dqn.human_normalized(14.6, "pong") == pytest.approx(1.0)
    assert dqn.human_normalized(-20.7, "pong") == pytest.approx(0.0)
    assert dqn.human_normalized(10.0, "air_raid") is None  # no reference score exists
    if not os.path.exists(SCORES_CSV):
        pytest.skip("shared/reference/atari_scores.csv is not on this machine")
    with open(SCORES_CSV) as f:
        table = {r["game"]: (float(r["random"]), float(r["human"])) for r in csv.DictReader(f) if r["human"]}
    assert table == dqn.RANDOM_HUMAN_SCORES


# ----------------------------------------------------------------------------------------------------------------------
# Runs on a real game
# ----------------------------------------------------------------------------------------------------------------------
def run(**kw):
    kw.setdefault("env_id", "ALE/Breakout-v5")
    kw.setdefault("buffer_size", 2000)
    kw.setdefault("log_every_seconds", 1000.0)
    kw.setdefault("analysis_every", 0)
    return dqn.main(dqn.Args(**kw))


SMOKE = [
    dict(moe="softmoe", encoder="nature", analysis_every=250, save_model=True),
    dict(
        moe="top1",
        encoder="nature",
        tokenization="perfeat",
        num_experts=4,
        load_balance_coef=1.0,
        num_envs=2,
        analysis_every=250,
    ),
    dict(moe="none", encoder="nature", width_multiplier=2, capture_video=True),
    dict(moe="softmoe", encoder="nature", random_phi=True, moe_normalize=True, expert_width=64, protocol="nature"),
    dict(moe="softmoe", encoder="impala", analysis_every=250, learning_starts=260),
    dict(moe="top1", encoder="impala", learning_starts=270),
    dict(moe="none", encoder="impala", learning_starts=270),
]


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
    if kw.get("analysis_every"):
        analysis = saved["analysis"]
        for key in ("dormant_percentage", "feature_norm", "srank", "entk_srank_0.01", "expert_load_max"):
            assert key in analysis and math.isfinite(analysis[key]), key
        if kw["moe"] == "top1":
            assert 0.0 <= analysis["dropped_token_fraction"] <= 1.0
    if kw.get("capture_video"):
        assert (run_dir / "videos" / "episode-0.mp4").exists()
    if kw.get("save_model"):
        assert (run_dir / "dqn_softmoe.pt").exists()


def test_checkpoint_resume_continues_the_step_counter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = run(moe="top1", total_timesteps=300, learning_starts=150, save_model=True)
    path = str(tmp_path / first["checkpoint"])
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["global_step"] == 300 and ckpt["updates"] == first["updates"] > 0
    resumed = run(moe="top1", total_timesteps=450, learning_starts=100, save_model=True, load_model=path)
    assert resumed["start_step"] == 300 and resumed["global_step"] == 450
    assert resumed["updates"] == first["updates"] + int((450 - 400) * 0.25)  # replay refilled for 100 steps first
    again = torch.load(resumed["checkpoint"], weights_only=True)
    assert again["episodes"][: len(ckpt["episodes"])] == ckpt["episodes"]  # the episode history continues
    assert any(not torch.equal(a, b) for a, b in zip(ckpt["q_net"].values(), again["q_net"].values(), strict=True))

    # the wrong architecture, a corrupt file or a finished budget: one line, nothing written
    os.makedirs("elsewhere")
    monkeypatch.chdir(tmp_path / "elsewhere")
    bad = tmp_path / "corrupt.pt"
    bad.write_bytes(b"not a checkpoint")
    cases = [
        (dict(moe="softmoe", load_model=path), "another architecture"),
        (dict(moe="top1", num_experts=4, load_model=path), "num_experts: checkpoint 8 vs requested 4"),
        (dict(moe="top1", env_id="ALE/Pong-v5", load_model=path), "env_id"),
        (dict(moe="top1", total_timesteps=300, load_model=path), "already at step 300"),
        (dict(moe="top1", load_model=str(bad)), "not a readable checkpoint"),
        (dict(moe="top1", load_model=str(tmp_path / "missing.pt")), "no such file"),
    ]
    for kw, message in cases:
        with pytest.raises(SystemExit) as err:
            run(**{"total_timesteps": 1000, **kw})
        assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not os.path.exists("runs")


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(env_id="ALE/Pongg-v5"), "closest valid ids: ALE/Pong-v5"),
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
