"""The maths of algos/td_lambda_tetris.py: activations (§2.2), gradients, traces (eq. 1, 2, 4), softmax (eq. 14, 15)."""

import math

import numpy as np
import pytest
import torch

import td_lambda_tetris as td
import td_reference as ref


def test_dsilu_is_the_derivative_of_silu_and_its_derivative_is_eq_12():
    z = torch.linspace(-8, 8, 401, dtype=torch.float64, requires_grad=True)
    (d_silu,) = torch.autograd.grad(td.silu(z).sum(), z)
    assert torch.allclose(td.dsilu(z), d_silu, atol=1e-12)  # eq. 10 / 11
    (d_dsilu,) = torch.autograd.grad(td.dsilu(z).sum(), z)
    assert torch.allclose(td.dsilu_derivative(z), d_dsilu, atol=1e-12)  # eq. 12
    for name in td.SHALLOW_ACTIVATIONS:
        a, da = td.activation_and_derivative(name, z.detach()[1::2])  # skip z = 0 where the ReLU has no derivative
        zz = z.detach()[1::2].clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(td.ACTIVATIONS[name](zz).sum(), zz)
        assert torch.allclose(a, td.ACTIVATIONS[name](zz.detach())) and torch.allclose(da, auto, atol=1e-12), name


def test_extrema_stated_in_section_2_2():
    z = torch.linspace(-6, 6, 1_200_001, dtype=torch.float64)
    silu, dsilu = td.silu(z), td.dsilu(z)
    assert abs(silu.min().item() + 0.278) < 1e-3 and abs(z[silu.argmin()].item() + 1.278) < 1e-3  # about -0.28 at -1.28
    z_max, z_min = z[dsilu.argmax()].item(), z[dsilu.argmin()].item()
    assert abs(dsilu.max().item() - 1.0998) < 1e-3 and abs(dsilu.min().item() + 0.0998) < 1e-3  # about 1.1 and -0.1
    assert abs(z_max - 2.3994) < 1e-3 and abs(z_min + 2.3994) < 1e-3  # at about +-2.4
    assert abs(z_max + math.log((z_max - 2) / (z_max + 2))) < 1e-3  # z = -log((z - 2)/(z + 2))


@pytest.mark.parametrize("activation", td.SHALLOW_ACTIVATIONS)
def test_shallow_hand_gradient_equals_autograd(activation):
    torch.manual_seed(0)
    R, F_, Hd = 3, 460, 50
    params = td.init_shallow(R, F_, Hd, seed=0, device="cpu")
    params = {k: v.double() for k, v in params.items()}
    idx = torch.stack([torch.randperm(F_)[:20] for _ in range(R)])  # one state per run
    value, grads = ref.shallow_value_and_grad(params, idx, activation)
    for r in range(R):
        leaf = {k: v[r].clone().requires_grad_(True) for k, v in params.items()}
        x = torch.zeros(F_, dtype=torch.float64)
        x[idx[r]] = 1.0
        v = td.ACTIVATIONS[activation](x @ leaf["W1"] + leaf["b1"]) @ leaf["w2"] + leaf["b2"]
        auto = torch.autograd.grad(v, list(leaf.values()))
        assert torch.allclose(value[r], v)
        rows, g_hidden = grads["W1"]
        dense_W1 = torch.zeros(F_, Hd, dtype=torch.float64).index_add_(0, rows[r], g_hidden[r].expand(20, Hd))
        assert torch.allclose(dense_W1, auto[0])
        for k, a in zip(("b1", "w2", "b2"), auto[1:], strict=True):
            assert torch.allclose(grads[k][r], a), k
    # the batched value over candidate placements agrees with the single-state value
    assert torch.allclose(ref.shallow_value(params, idx[:, None], activation)[:, 0], value)


def test_deep_network_shapes_and_vmapped_gradient_equal_per_run_autograd():
    params, base = td.init_deep(2, 20, 10, "silu-dsilu", seed=0, device="cpu")
    assert params["fc.weight"].shape == (2, 250, 750)  # 50 x 5 x 3 inputs on a 20x10 board
    boards = (torch.rand(2, 20, 10) < 0.3).to(torch.uint8)
    value, grads = td.deep_value_and_grad(params, boards, base)
    for r in range(2):
        net = td.DeepValueNet(20, 10, "silu-dsilu")
        net.load_state_dict({k: v[r] for k, v in params.items()})
        v = net(boards[r : r + 1])[0]
        auto = torch.autograd.grad(v, list(net.parameters()))
        assert torch.allclose(v, value[r], atol=1e-6)
        for (name, _), a in zip(net.named_parameters(), auto, strict=True):
            assert torch.allclose(grads[name][r], a, atol=1e-6), name
    cand = td.deep_value(params, boards[:, None].expand(2, 5, 20, 10), base)
    assert cand.shape == (2, 5) and torch.allclose(cand[:, 0], value, atol=1e-6)
    small, _ = td.init_deep(1, 10, 10, "relu-relu", seed=0, device="cpu")
    assert small["fc.weight"].shape == (1, 250, 450)  # 10x10 board: 5x5 then 3x3


def lambda_return_updates(x, rewards, w, alpha, gamma, lam):
    """Forward view, independent of the script: sum_t alpha (G^lambda_t - V(s_t)) x_t with V = w.x held fixed.

    G^lambda_t = (1 - lam) sum_{n>=1} lam^{n-1} G_t^{(n)}, the n-step returns truncated at the episode's end."""
    T = len(rewards)
    v = [float(w @ x[t]) for t in range(T)] + [0.0]  # V(terminal) = 0
    total = np.zeros_like(w)
    for t in range(T):
        g_lambda = 0.0
        for n in range(1, T - t + 1):
            g_n = sum(gamma**k * rewards[t + k] for k in range(n)) + gamma**n * v[t + n]
            weight = (1 - lam) * lam ** (n - 1) if n < T - t else lam ** (n - 1)
            g_lambda += weight * g_n
        total += alpha * (g_lambda - v[t]) * x[t]
    return total


def test_accumulating_traces_with_held_updates_equal_the_forward_view_lambda_return():
    rng = np.random.default_rng(0)
    T, d, alpha, gamma, lam = 12, 6, 0.1, 0.99, 0.55
    x = rng.random((T, d))
    rewards = rng.random(T)
    w = rng.normal(size=d)
    # backward view with the script's trace/update function, the parameter change accumulated, w held fixed
    held = {"w": torch.zeros(1, d, dtype=torch.float64)}
    eligibility = {"w": torch.zeros(1, d, dtype=torch.float64)}
    v = [float(w @ x[t]) for t in range(T)] + [0.0]
    for t in range(T):
        td_error = rewards[t] + gamma * v[t + 1] - v[t]  # eq. 2
        decay = torch.tensor([0.0 if t == 0 else gamma * lam], dtype=torch.float64)
        grads = {"w": torch.as_tensor(x[t])[None]}  # grad of the linear V
        ref.update_traces_and_params(held, eligibility, grads, decay, torch.tensor([alpha * td_error]))
    assert np.allclose(held["w"][0].numpy(), lambda_return_updates(x, rewards, w, alpha, gamma, lam), atol=1e-12)


def test_sparse_w1_trace_equals_the_dense_trace():
    torch.manual_seed(0)
    R, F_, Hd = 2, 30, 4
    dense_e, sparse_e = torch.zeros(R, F_, Hd), {"W1": torch.zeros(R, F_, Hd)}
    theta_dense, theta_sparse = torch.zeros(R, F_, Hd), {"W1": torch.zeros(R, F_, Hd)}
    for step in range(5):
        rows = torch.stack([torch.randperm(F_)[:3] for _ in range(R)])
        g = torch.randn(R, Hd)
        decay = torch.tensor([0.5, 0.0 if step == 2 else 0.5])
        size = torch.randn(R)
        ref.update_traces_and_params(theta_sparse, sparse_e, {"W1": (rows, g)}, decay, size)
        dense_g = torch.zeros(R, F_, Hd)
        for r in range(R):
            dense_g[r, rows[r]] = g[r]
        dense_e = decay[:, None, None] * dense_e + dense_g
        theta_dense += size[:, None, None] * dense_e
    assert torch.allclose(sparse_e["W1"], dense_e) and torch.allclose(theta_sparse["W1"], theta_dense)


def test_temperature_schedule_eq_15():
    episodes = torch.tensor([0.0, 4000.0, 10_000.0, 200_000.0])
    tau = td.temperature(episodes, 0.5, 0.00025)
    assert torch.allclose(tau, torch.tensor([0.5, 0.25, 0.5 / 3.5, 0.5 / 51]))
    assert abs(tau[-1].item() - 0.0098) < 1e-4  # the final temperature of Table 3


def test_softmax_selection_samples_eq_14():
    torch.manual_seed(0)
    values = torch.tensor([[1.0, 0.8, 0.2, 5.0]])
    valid = torch.tensor([[True, True, True, False]])
    tau = torch.tensor([0.25])
    probs = ref.softmax_probabilities(values, tau, valid)[0]
    expected = torch.exp(values[0, :3] / 0.25) / torch.exp(values[0, :3] / 0.25).sum()
    assert torch.allclose(probs[:3], expected) and probs[3] == 0
    n = 200_000
    action = td.select_placement(values.expand(n, 4), tau.expand(n), valid.expand(n, 4), torch.rand(n, 5))
    freq = torch.bincount(action, minlength=4).double() / n
    assert torch.allclose(freq, probs.double(), atol=0.005)


@pytest.mark.parametrize("groups", [[("dsilu", 0, 3)], [("dsilu", 0, 1), ("sigmoid", 1, 2), ("relu", 2, 3)]])
def test_lazy_shallow_td_reproduces_the_dense_update_step_by_step(groups):
    """ShallowTD (folded, lazily scaled traces, the training loop's path) against the reference pieces
    shallow_value_and_grad + update_traces_and_params over 200 steps with episode starts and folds."""
    torch.manual_seed(0)
    R, F_, Hd, gamma_lambda, alpha = 3, 460, 50, 0.99 * 0.55, 0.01
    params = td.init_shallow(R, F_, Hd, seed=0, device="cpu")
    dense = {k: v.clone().double() for k, v in params.items()}
    dense_e = {k: torch.zeros_like(v) for k, v in dense.items()}
    fast = td.ShallowTD({k: v.double() for k, v in params.items()}, groups)
    acts = [name for name, a, b in groups for _ in range(a, b)]
    gen = torch.Generator().manual_seed(1)
    folds = 0
    for _ in range(200):
        heights = torch.randint(0, 21, (R, 6, 10), generator=gen)
        holes = torch.randint(0, 70, (R, 6), generator=gen)
        idx = td.shallow_indices(heights, holes, 20)  # (R, 6, 21): last column the bias row F
        assert (idx[..., -1] == F_).all()
        value, z, a = fast.values(idx)
        for r, act in enumerate(acts):
            one = {k: v[r : r + 1] for k, v in dense.items()}
            v_ref, grads = ref.shallow_value_and_grad(one, idx[r : r + 1, -1, :20], act)
            assert torch.allclose(value[r, -1], v_ref[0], atol=1e-9)
            v_all = ref.shallow_value(one, idx[r : r + 1, :, :20], act)
            assert torch.allclose(value[r], v_all[0], atol=1e-9)
            if r == 0:
                all_grads = {k: [] for k in dense}
            for k in dense:
                all_grads[k].append(grads[k])
        grads = {k: torch.cat(v) for k, v in all_grads.items() if k != "W1"}
        grads["W1"] = (idx[:, -1, :20], torch.cat([g[1] for g in all_grads["W1"]]))
        first = torch.rand(R, generator=gen) < 0.03
        decay = torch.where(first, 0.0, gamma_lambda).double()
        step = alpha * torch.randn(R, generator=gen).double()
        folds += int(((fast.c * decay) < fast.fold_below).sum())
        fast.decay_traces(decay)
        fast.accumulate(idx[:, -1], z[:, -1], a[:, -1], decay, step)
        ref.update_traces_and_params(dense, dense_e, grads, decay, step)
    got, got_e = fast.parameters(), ref.eligibility(fast)
    for k in dense:
        assert torch.allclose(got[k], dense[k], atol=1e-9), k
        assert torch.allclose(got_e[k], dense_e[k], atol=1e-9), k
    assert folds > 20  # the folds (and the d = 0 episode starts) were exercised


def test_td_reward_timing():
    holes_next, holes_now = torch.tensor([33, 0, 66]), torch.tensor([0, 33, 33])
    over = torch.tensor([False, False, True])
    nxt = td.td_reward(holes_next, over, holes_now, 33.0, "next")
    assert torch.allclose(nxt, torch.tensor([math.exp(-1), 1.0, 0.0]))  # r(s_{t+1}), 0 on a terminal move
    cur = td.td_reward(holes_next, over, holes_now, 33.0, "current")
    assert torch.allclose(cur, torch.tensor([1.0, math.exp(-1), math.exp(-1)]))  # r(s_t), terminal or not


def test_same_max_pool_is_tensorflow_same():
    assert td.same_pad(5) == (1, 1) and td.same_pad(20) == (0, 1) and td.same_pad(10) == (0, 1)
    assert td.same_pad(3) == (1, 1) and td.same_pad(4) == (0, 1)
    x = torch.arange(25.0).view(1, 1, 5, 5)
    out = td.same_max_pool(x)
    assert out.shape == (1, 1, 3, 3)
    # windows centred on rows/cols 0, 2, 4 with one cell of padding each side: max over rows r-1..r+1, cols c-1..c+1
    expected = torch.tensor([[[6.0, 8.0, 9.0], [16.0, 18.0, 19.0], [21.0, 23.0, 24.0]]])
    assert torch.equal(out[0], expected)
    assert td.same_max_pool(torch.zeros(2, 15, 20, 10)).shape == (2, 15, 10, 5)
    assert td.same_max_pool(torch.zeros(2, 50, 10, 5)).shape == (2, 50, 5, 3)
    y = -torch.arange(50.0).view(1, 1, 10, 5)  # -inf padding never wins; last window: rows 8-9, cols 3-4
    pooled = td.same_max_pool(y)
    assert pooled[0, 0, 0, 0] == 0.0 and pooled[0, 0, 0, 1] == -1.0 and pooled[0, 0, -1, -1] == y[0, 0, 8, 3]


def test_table1_statistics_by_hand():
    """Table 1's ± is the sd of the final-window episode scores (pooled over runs); the spread of run means is apart."""
    scores = np.array([[9.0, 0.0, 2.0, 4.0, 0.0], [1.0, 1.0, 10.0, 14.0, 0.0]])  # run 0 played 4, run 1 played 4
    out = td.score_summary(scores, np.array([4, 4]), final_window=2)
    assert out["final_window"] == 2 and out["final_score_per_run"] == [3.0, 12.0]
    assert out["final_score_mean"] == 7.5 and out["final_score_std_over_runs"] == 4.5
    assert out["final_score_sd_episodes"] == pytest.approx(math.sqrt((5.5**2 + 3.5**2 + 2.5**2 + 6.5**2) / 4))
    assert out["final_score_sd_episodes_per_run"] == [1.0, 2.0]
    assert out["final_score_best_run_index"] == 1 and out["final_score_best_run_sd_episodes"] == 2.0
    assert td.score_summary(scores, np.array([1, 3]), 1000)["final_window"] == 1  # the slowest run bounds it


def test_eta_is_the_slowest_runs_remaining_placements_at_its_recent_episode_length_over_the_step_rate():
    # run 0 has 100 of 300 episodes left, its last 100 of mean 10 + 2 x 149.5 = 309 placements; run 2 has 10 left at
    # 50; run 1 has finished. Every run places one piece per loop step, so run 0 sets the time: 100 x 309 / 100 s.
    lengths = np.zeros((3, 300))
    lengths[0, :200] = 10 + 2 * np.arange(200)
    lengths[1, :] = 7
    lengths[2, :290] = 50
    later = "(if episodes stay as long as the last 100)"
    assert td.eta(lengths, np.array([200, 300, 290]), 300, 100.0) == f"ETA ≥ 0h05m09s {later}"  # 100 x 309 / 100 s
    assert td.eta(lengths[1:2], np.array([300]), 300, 0.0) == f"ETA ≥ 0h00m00s {later}"  # every run has finished
    assert td.eta(lengths, np.array([0, 300, 290]), 300, 100.0) == "ETA ?"  # run 0 has no episode yet
    assert td.eta(lengths[:1], np.array([200]), 300, 100.0 * 309 / (3 * 3600 + 61.9)).startswith("ETA ≥ 3h01m01s")
