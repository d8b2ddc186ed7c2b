"""The shallow network's maths written plainly, the reference the tests hold algos/td_lambda_tetris.py's fast paths to:
V(s) and its hand-derived gradient per state (eq. 7, 11, 12) and the dense trace update with a sparse W1 gradient."""

import torch
import torch.nn.functional as F

import td_lambda_tetris as td


def shallow_hidden_input(params, idx: torch.Tensor) -> torch.Tensor:
    """z_k = sum_i w_ik s_i + b_k (eq. 7) for binary s given by its active indices: idx (R, ..., 20) -> (R, ..., Hd)."""
    W1, b1 = params["W1"], params["b1"]
    R, F_, Hd = W1.shape
    lead = idx.shape[1:-1]
    offsets = (torch.arange(R) * F_).view(R, *([1] * (idx.dim() - 1)))
    z = F.embedding_bag((idx + offsets).reshape(-1, idx.shape[-1]), W1.reshape(R * F_, Hd), mode="sum")
    return z.view(R, *lead, Hd) + b1.view(R, *([1] * len(lead)), Hd)


def shallow_value(params, idx: torch.Tensor, activation: str) -> torch.Tensor:
    """V(s) = sum_k w2_k a(z_k) + b2. idx (R, ..., 20) -> (R, ...)."""
    z = shallow_hidden_input(params, idx)
    a = td.ACTIVATIONS[activation](z)
    lead = z.shape[1:-1]
    return (a * params["w2"].view(z.shape[0], *([1] * len(lead)), -1)).sum(-1) + params["b2"].view(-1, *[1] * len(lead))


def shallow_value_and_grad(params, idx: torch.Tensor, activation: str):
    """V(s) and grad_theta V(s) for one state per run, idx (R, 20): dV/dw2_k = a(z_k), dV/db2 = 1, dV/db1_k = w2_k
    a'(z_k), dV/dW1_ik = s_i w2_k a'(z_k) (eq. 11, 12); the W1 gradient as (rows, values), non-zero on 20 rows."""
    z = shallow_hidden_input(params, idx)
    a, da = td.activation_and_derivative(activation, z)
    value = (a * params["w2"]).sum(-1) + params["b2"]
    g_hidden = params["w2"] * da
    return value, {"W1": (idx, g_hidden), "b1": g_hidden, "w2": a, "b2": torch.ones_like(value)}


def update_traces_and_params(params, eligibility, grads, decay, step):
    """td.update_traces_and_params (eq. 4 then eq. 1), also taking W1's gradient as (rows (R, 20), values (R, Hd))."""
    dense = {}
    for name, g in grads.items():
        if isinstance(g, tuple):
            rows, values = g
            R, F_, Hd = eligibility[name].shape
            dense[name] = torch.zeros_like(eligibility[name])
            flat = (rows + torch.arange(R)[:, None] * F_).reshape(-1)
            dense[name].view(R * F_, Hd).index_add_(0, flat, values.repeat_interleave(rows.shape[1], 0))
        else:
            dense[name] = g
    td.update_traces_and_params(params, eligibility, dense, decay, step)


def eligibility(learner: "td.ShallowTD") -> dict[str, torch.Tensor]:
    """e as update_traces_and_params holds it, from ShallowTD's lazily scaled trace: E c."""
    E = learner.table[..., learner.Hd :] * learner.c.view(-1, 1, 1)
    return {
        "W1": E[:, : learner.F],
        "b1": E[:, learner.F],
        "w2": learner.ev[:, : learner.Hd],
        "b2": learner.ev[:, learner.Hd],
    }


def softmax_probabilities(values: torch.Tensor, tau: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Eq. 14: pi(a|s) proportional to exp(V(f(s, a)) / tau) over the valid placements. values (R, P), tau (R,)."""
    return torch.softmax((values / tau[:, None]).masked_fill(~valid, float("-inf")), -1)
