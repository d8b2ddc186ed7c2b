"""TD(lambda) with softmax afterstate selection on stochastic SZ-Tetris and 10x10 Tetris.

Elfwing, Uchibe & Doya (2018), "Sigmoid-weighted linear units for neural network function approximation in
reinforcement learning", §2.1-2.3 and §3.1-3.2, with the analyses of §4.1 (Fig. 6) and §4.2 (Table 3).

    V(s) is learned on afterstates (the board after the drop and the row clears), on-policy and online:
    delta_t = r_{t+1} + gamma V(s_{t+1}) - V(s_t)                         (eq. 2)
    e_t     = gamma lambda e_{t-1} + grad_theta V(s_t),  e_0 = 0           (eq. 4, accumulating traces)
    theta  <- theta + alpha delta_t e_t                                    (eq. 1)
    pi(a|s) = exp(V(f(s, a)) / tau) / sum_b exp(V(f(s, b)) / tau)          (eq. 14)
    tau(i)  = tau0 / (1 + tau_k i), i = episode number                    (eq. 15)
    r(s)    = exp(-holes(s) / 33) on SZ-Tetris, exp(-holes(s) / 16.5) on 10x10 (eq. 16, 17)

Networks: `shallow` = 460 (260 on 10x10) binary features -> hidden units -> linear output, hidden units SiLU (eq. 9),
dSiLU (eq. 10), ReLU or sigmoid; `deep` = raw board -> conv 15 5x5 -> max-pool 3x3/2 -> conv 50 5x5 -> max-pool 3x3/2
-> fc 250 -> linear output (§3.1).

`--num-runs N` trains N independent agents (own parameters, traces and games; run i's network is initialised from
seed + i, and one generator seeded with --seed draws every run's pieces and choices) as one batched computation: every
tensor carries a leading run dimension, so the paper's 10 runs are one command.

Reproduce Table 1's dSiLU row (10 runs x 200k episodes):
    python algos/td_lambda_tetris.py --activation dsilu --num-runs 10
and Fig. 4 (10x10 Tetris, 5 runs x 400k episodes, 250 hidden units, reward exp(-holes/16.5)):
    python algos/td_lambda_tetris.py --env-id envs/Tetris10x10-v0 --num-runs 5
"""

from __future__ import annotations

import contextlib
import copy
import csv
import functools
import json
import math
import os
import random
import signal
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
import tyro
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from envs.tetris import (  # noqa: E402
    ENV_VARIANTS,
    VARIANTS,
    AfterstateEngine,
    Afterstates,
    ColumnEngine,
    _encoding_table,
    binary_feature_length,
    columns_to_boards,
    render_board,
)

PAPER_FINAL_SCORES = {  # Table 1 (SZ-Tetris, final 1,000 episodes) and §3.2 (10x10, final 10,000 episodes)
    ("envs/SZTetris-v0", "shallow", "silu"): 214,
    ("envs/SZTetris-v0", "shallow", "relu"): 191,
    ("envs/SZTetris-v0", "shallow", "dsilu"): 263,
    ("envs/SZTetris-v0", "shallow", "sigmoid"): 232,
    ("envs/SZTetris-v0", "deep", "silu-silu"): 217,
    ("envs/SZTetris-v0", "deep", "relu-relu"): 215,
    ("envs/SZTetris-v0", "deep", "silu-dsilu"): 229,
    ("envs/Tetris10x10-v0", "shallow", "dsilu"): 4900,
}
SHALLOW_ACTIVATIONS = ("silu", "dsilu", "relu", "sigmoid")
DEEP_ACTIVATIONS = ("silu-dsilu", "silu-silu", "relu-relu")
CHECKPOINT_FORMAT = "td_lambda_tetris/1"


@dataclass
class Args:
    # --- experiment ---
    exp_name: str = "td_lambda_tetris"
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; run i initialises its network from seed + i"""
    device: str = "auto"
    """'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N'"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    track: bool = False
    """log to Weights & Biases (needs `pip install wandb`)"""
    wandb_project_name: str = "silu-dsilu-rl"
    """the wandb project"""
    wandb_entity: str | None = None
    """the wandb entity (team)"""
    save_model: bool = False
    """save the parameters and score history of every run to runs/{run_name}/td_lambda_tetris.pt (at the end and
    every --write-every-minutes)"""
    resume: Annotated[str | None, tyro.conf.arg(aliases=("--load-model",))] = None
    """checkpoint to resume (alias --load-model): training continues exactly where it stopped (traces, games in
    progress and the random generator; a checkpoint without them restarts the interrupted episodes); --total-episodes
    counts from the start of the original run, as in every script; with --total-episodes 0 it is only evaluated"""
    log_every_seconds: float = 10.0
    """how often the progress line is printed and the tensorboard scalars are written"""
    write_every_minutes: Annotated[float, tyro.conf.arg(aliases=("--checkpoint-every-minutes",))] = 10.0
    """how often summary.json, the learning curve and (with --save-model) the checkpoint are rewritten mid-run (alias
    --checkpoint-every-minutes)"""
    capture_video: bool = False
    """record the training games of the first run of each activation as mp4 in runs/{run_name}/videos/, one frame
    per placement (the board after the drop and the row clears), for that run's episodes 0, 1, 8, 27, ..., 729, 1000,
    2000, ... (gymnasium's capped cubic schedule), at most 2,000 placements per video (needs moviepy; on CUDA it
    syncs the device at every step to read the episode counters)"""

    # --- environment ---
    env_id: str = "envs/SZTetris-v0"
    """envs/SZTetris-v0 (§3.1), envs/Tetris10x10-v0 (§3.2) or envs/Tetris-v0 (10x20, seven pieces)"""

    # --- algorithm: TD(lambda), §2.1 and §3.1 ---
    total_episodes: int | None = None
    """training episodes per run, counted from the start of the original run when resuming (default: 200,000 on
    SZ-Tetris, 400,000 on the seven-piece variants)"""
    num_runs: int = 1
    """independent runs advanced together as one batched computation (the paper: 10 per shallow activation, 5 per
    deep variant and 5 on 10x10)"""
    gamma: float = 0.99
    """discount factor gamma"""
    lam: float = 0.55
    """trace-decay rate lambda"""
    alpha: float | None = None
    """learning rate alpha (default: 0.001 for the shallow net, 0.0001 for the deep net)"""
    tau0: float = 0.5
    """initial softmax temperature tau_0 (eq. 15)"""
    tau_k: float = 0.00025
    """temperature annealing rate tau_k (eq. 15)"""
    holes_scale: float | None = None
    """reward r(s) = exp(-holes / holes_scale) (default: 33 on a 20-row board (eq. 16), 16.5 on 10x10 (eq. 17))"""
    # Default chosen on evidence (results/tetris_reward_timing, 10 dSiLU runs each, same seeds): final-1,000 mean
    # 148.8 (current) vs 139.7 (next) at 5,000 episodes (z = 1.7; 'current' ahead in every 500-episode block from
    # 1,501 on), and 59.0 vs 51.0 at 3,000 (z ~ 2). 'current' is also the paper's literal r_t. Runs before this
    # change (Table 1's reduced rows, the 20k dSiLU run) used 'next': resume them with --reward-timing next.
    reward_timing: Literal["next", "current"] = "current"
    """which state's reward enters delta_t = r + gamma V(s_{t+1}) - V(s_t): 'next' = r(s_{t+1}), the afterstate moved
    into (tetris.md §0; 0 when it is terminal); 'current' = r(s_t), the paper's literal r_t with r a function of the
    state, so V(s) holds the state's own reward (see `td_reward`)"""

    # --- network ---
    network: Literal["shallow", "deep"] = "shallow"
    """shallow: binary features -> hidden -> linear; deep: raw board -> 2 conv + pool -> fc 250 -> linear"""
    activation: tuple[str, ...] | None = None
    """shallow: silu | dsilu | relu | sigmoid (default dsilu), several at once (`--activation dsilu sigmoid silu relu`:
    --num-runs runs of each in one batched process, Table 1's shallow rows); deep: one of silu-dsilu | silu-silu |
    relu-relu (conv layers - fully connected layer; default silu-dsilu)"""
    hidden: int | None = None
    """hidden units of the shallow net (default: 50 on SZ-Tetris, 250 on the seven-piece variants); the deep net's
    fully connected layer has 250"""

    compile: bool = False
    """shallow net: run the training step as two inductor graphs, the afterstates and the update, called directly
    (`compile_graph`; needs a C compiler on CPU, falls back to eager with a warning; 10-40 s of compilation at the
    start). Same maths and the same games as without it. One torch thread unless OMP_NUM_THREADS says otherwise
    (the fastest setting measured on CPU; run one process per core)"""

    # --- evaluation and analysis (§4.1, §4.2) ---
    final_window: int | None = None
    """episodes behind the final score (default: 1,000 on SZ-Tetris as Table 1, 10,000 on the seven-piece variants
    as §3.2)"""
    eval_episodes: int = 0
    """after training (or on --resume), play this many episodes per run and selection rule without learning"""
    eval_run: str = "all"
    """which runs of a batched checkpoint the evaluation plays: 'all', 'best' (highest final mean score, the paper's
    "best dSiLU network agent" of Table 3 and Fig. 6) or a run index N"""
    eval_selections: tuple[str, ...] = ("softmax", "epsilon:0", "epsilon:0.001", "epsilon:0.01", "epsilon:0.05")
    """selection rules of Table 3: 'softmax' (at the final temperature), 'softmax:TAU' or 'epsilon:EPS'"""
    value_analysis_episodes: int = 1000
    """episodes of the first selection rule used for the V(s_t) vs R_t analysis of Fig. 6 (CSV + PNG)"""


# ----------------------------------------------------------------------------------------------------------------------
# Setup helpers
# ----------------------------------------------------------------------------------------------------------------------
def fill_defaults(args: Args) -> Args:
    """The paper's per-experiment defaults for the fields left at None (§3.1, §3.2)."""
    sz = args.env_id == "envs/SZTetris-v0"
    height = VARIANTS[ENV_VARIANTS[args.env_id]][0] if args.env_id in ENV_VARIANTS else 20
    if args.activation is None:
        args.activation = ("dsilu",) if args.network == "shallow" else ("silu-dsilu",)
    elif isinstance(args.activation, str):
        args.activation = (args.activation,)
    args.activation = tuple(args.activation)
    if args.total_episodes is None:
        args.total_episodes = 200_000 if sz else 400_000
    if args.alpha is None:
        args.alpha = 0.001 if args.network == "shallow" else 0.0001
    if args.hidden is None:
        args.hidden = 50 if sz else 250
    if args.holes_scale is None:
        args.holes_scale = 33.0 * height / 20  # eq. 17 halves the scale with the board height
    if args.final_window is None:
        args.final_window = 1000 if sz else 10_000
    return args


def parse_selection(rule: str, final_tau: float) -> tuple[str, float]:
    """'softmax' | 'softmax:TAU' | 'epsilon:EPS' -> ('softmax', tau) or ('epsilon', eps)."""
    kind, _, value = rule.partition(":")
    if kind == "softmax":
        return "softmax", float(value) if value else final_tau
    if kind == "epsilon" and value:
        return "epsilon", float(value)
    raise ValueError(rule)


def validate(args: Args) -> str | None:
    """One clear line for each impossible setting, checked before anything is written."""
    if args.env_id not in ENV_VARIANTS:
        return f"unknown --env-id {args.env_id!r}; choose one of {', '.join(ENV_VARIANTS)}"
    allowed = SHALLOW_ACTIVATIONS if args.network == "shallow" else DEEP_ACTIVATIONS
    for act in args.activation:
        if act not in allowed:
            return f"--activation {act!r} is not defined for --network {args.network}; choose one of {allowed}"
    if len(set(args.activation)) != len(args.activation):
        return f"--activation lists a value twice: {' '.join(args.activation)}"
    if len(args.activation) > 1 and args.network != "shallow":
        return "several --activation values need --network shallow (the deep variants run one per process)"
    if len(args.activation) > 1 and args.eval_episodes > 0:
        return (
            "several --activation values train only: evaluate one activation at a time (--activation A with the "
            "batched checkpoint evaluates that activation's runs)"
        )
    for name in ("alpha", "gamma", "lam", "tau0", "tau_k", "holes_scale"):
        if not math.isfinite(getattr(args, name)):
            return f"--{name.replace('_', '-')} must be a finite number, got {getattr(args, name)}"
    if args.tau0 <= 0 or args.tau_k < 0 or args.holes_scale <= 0:
        return "--tau0 and --holes-scale must be positive and --tau-k non-negative"
    if args.eval_run not in ("all", "best") and not (args.eval_run.isdigit() and int(args.eval_run) < args.num_runs):
        return (
            f"--eval-run must be 'all', 'best' or a run index below --num-runs {args.num_runs}, got {args.eval_run!r}"
        )
    if args.num_runs < 1:
        return f"--num-runs must be at least 1, got {args.num_runs}"
    if args.total_episodes < 0 or args.eval_episodes < 0:
        return "--total-episodes and --eval-episodes must be >= 0"
    if args.total_episodes == 0 and args.eval_episodes == 0:
        return "nothing to do: --total-episodes 0 needs --eval-episodes > 0 (and usually --resume)"
    if args.hidden < 1 or args.alpha <= 0 or args.final_window < 1:
        return "--hidden, --alpha and --final-window must be positive"
    if not (0 <= args.gamma <= 1 and 0 <= args.lam <= 1):
        return "--gamma and --lam must lie in [0, 1]"
    for rule in args.eval_selections:
        try:
            kind, value = parse_selection(rule, 1.0)
        except ValueError:
            return f"bad --eval-selections entry {rule!r}; use 'softmax', 'softmax:TAU' or 'epsilon:EPS'"
        if (kind == "epsilon" and not 0 <= value <= 1) or (kind == "softmax" and value <= 0):
            return f"bad --eval-selections entry {rule!r}: epsilon must lie in [0, 1] and tau be positive"
    if args.device != "auto" and args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto"
    if args.capture_video:
        if args.total_episodes == 0:
            return "--capture-video records training games, and --total-episodes 0 plays none; drop one of the two"
        try:
            import moviepy  # noqa: F401
        except ImportError:
            return "--capture-video needs moviepy; `pip install moviepy` or drop --capture-video"
    return None


# ----------------------------------------------------------------------------------------------------------------------
# Activations (§2.2)
# ----------------------------------------------------------------------------------------------------------------------
def silu(z):
    """SiLU, eq. 9: a = z sigma(z)."""
    return z * torch.sigmoid(z)


def dsilu(z):
    """dSiLU, eq. 10: a = sigma(z) (1 + z (1 - sigma(z))), the derivative of the SiLU."""
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s))


def dsilu_derivative(z):
    """da/dz of the dSiLU (eq. 12 without the input s_i): sigma(z)(1-sigma(z))(2 + z(1-sigma(z)) - z sigma(z))."""
    s = torch.sigmoid(z)
    return s * (1 - s) * (2 + z * (1 - s) - z * s)


def activation_and_derivative(name: str, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a(z) and da/dz for the shallow net's hand-derived gradient (eq. 11 for the SiLU, eq. 12 for the dSiLU)."""
    if name == "silu":
        return silu(z), dsilu(z)
    if name == "dsilu":
        return dsilu(z), dsilu_derivative(z)
    if name == "relu":
        return z.clamp_min(0), (z > 0).to(z.dtype)
    s = torch.sigmoid(z)  # sigmoid
    return s, s * (1 - s)


ACTIVATIONS = {"silu": silu, "dsilu": dsilu, "relu": torch.relu, "sigmoid": torch.sigmoid}


# ----------------------------------------------------------------------------------------------------------------------
# Shallow network: binary features -> hidden -> linear, batched over runs, gradient derived by hand
# ----------------------------------------------------------------------------------------------------------------------
def init_shallow(num_runs: int, num_features: int, hidden: int, seed: int, device) -> dict[str, torch.Tensor]:
    """Parameters (leading run dimension). The paper does not give the initialisation; we use PyTorch's nn.Linear
    default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, with run i drawn from seed + i."""
    params = {"W1": [], "b1": [], "w2": [], "b2": []}
    for i in range(num_runs):
        g = torch.Generator().manual_seed(seed + i)
        k1, k2 = 1 / math.sqrt(num_features), 1 / math.sqrt(hidden)
        params["W1"].append((torch.rand(num_features, hidden, generator=g) * 2 - 1) * k1)
        params["b1"].append((torch.rand(hidden, generator=g) * 2 - 1) * k1)
        params["w2"].append((torch.rand(hidden, generator=g) * 2 - 1) * k2)
        params["b2"].append((torch.rand((), generator=g) * 2 - 1) * k2)
    return {k: torch.stack(v).to(device) for k, v in params.items()}


def shallow_hidden_input(params, idx: torch.Tensor) -> torch.Tensor:
    """z_k = sum_i w_ik s_i + b_k (eq. 7) for binary s given by its active indices.

    idx (R, ..., 20) indices of the active bits -> z (R, ..., hidden). The sum over the 20 active rows of W1 is one
    embedding_bag gather per call: no dense 460-wide input is ever built.
    """
    W1, b1 = params["W1"], params["b1"]
    R, F_, Hd = W1.shape
    lead = idx.shape[1:-1]
    offsets = (torch.arange(R, device=idx.device) * F_).view(R, *([1] * (idx.dim() - 1)))
    z = F.embedding_bag((idx + offsets).reshape(-1, idx.shape[-1]), W1.reshape(R * F_, Hd), mode="sum")
    return z.view(R, *lead, Hd) + b1.view(R, *([1] * len(lead)), Hd)


def shallow_value(params, idx: torch.Tensor, activation: str) -> torch.Tensor:
    """V(s) = sum_k w2_k a(z_k) + b2. idx (R, ..., 20) -> (R, ...)."""
    z = shallow_hidden_input(params, idx)
    a = ACTIVATIONS[activation](z)
    lead = z.shape[1:-1]
    return (a * params["w2"].view(z.shape[0], *([1] * len(lead)), -1)).sum(-1) + params["b2"].view(-1, *[1] * len(lead))


def shallow_value_and_grad(params, idx: torch.Tensor, activation: str):
    """V(s) and grad_theta V(s) for one state per run. idx (R, 20).

    dV/dw2_k = a(z_k);  dV/db2 = 1;  dV/db1_k = w2_k a'(z_k);  dV/dW1_ik = s_i w2_k a'(z_k)  (eq. 11, 12)
    so the W1 gradient is non-zero only on the 20 active rows: it is returned as (rows, values) for a sparse add.
    """
    z = shallow_hidden_input(params, idx)  # (R, Hd)
    a, da = activation_and_derivative(activation, z)
    value = (a * params["w2"]).sum(-1) + params["b2"]
    g_hidden = params["w2"] * da  # (R, Hd)
    grads = {"W1": (idx, g_hidden), "b1": g_hidden, "w2": a, "b2": torch.ones_like(value)}
    return value, grads


# ----------------------------------------------------------------------------------------------------------------------
# The shallow agent's fast path: one fused forward and lazily scaled traces (what the training loop runs)
# ----------------------------------------------------------------------------------------------------------------------
def shallow_indices(heights: torch.Tensor, n_holes: torch.Tensor, height: int, table=None) -> torch.Tensor:
    """(..., W) heights and (...) holes -> (..., 2W + 1) active rows of the binary input (`binary_feature_indices`)
    plus row F = the bias b1 as an always-active input (F = binary_feature_length). `table`: the cached
    `_bias_encoding_table(height, W, device)`, passed in by the compiled step (dynamo warns on cached functions)."""
    width = heights.shape[-1]
    lo, hi, offset = _bias_encoding_table(height, width, heights.device) if table is None else table
    bias = torch.zeros_like(n_holes)[..., None]
    feats = torch.cat([heights, heights[..., 1:] - heights[..., :-1], n_holes[..., None], bias], -1)
    return torch.maximum(torch.minimum(feats, hi), lo) + offset


@functools.lru_cache(maxsize=16)
def _bias_encoding_table(height, width, device):
    lo, hi, offset = _encoding_table(height, width, device)
    F_ = binary_feature_length(height, width)
    extra = torch.tensor([[0], [0], [F_]], device=device)
    return torch.cat([torch.stack([lo, hi, offset]), extra], -1)


class ShallowTD:
    """The shallow net and its TD(lambda) update for R runs, with the traces held lazily so a step touches only the
    21 active rows of W1 (eq. 1, 4, 7, 11, 12; the same maths as shallow_value_and_grad + update_traces_and_params,
    which tests/test_td_lambda_math.py checks step by step).

    W = [W1; b1] (F + 1 rows, the bias as an always-active input). Per run, e_W = c E and theta_W = U + A E with
    scalars c, A:
        e <- d e + g       is  c <- d c;  E[rows] += g / c;  U[rows] -= A g / c    (theta unchanged)
        theta <- theta + s e   is  A <- A + s c                                    (s = alpha delta)
    When c falls below `fold_below` (every ~11 steps at gamma lambda = 0.5445) or an episode starts (d = 0), the run
    is folded back: U <- U + A E, E <- c E, A <- 0, c <- 1 (one dense pass over that run only). U and E sit side by
    side in one table, so one embedding_bag gives z = U-sum + A E-sum for every candidate and the current state.
    [w2, b2] and their trace are small and stay dense.
    """

    def __init__(self, params: dict, groups: list[tuple[str, int, int]], fold_below: float = 1e-3):
        W1, b1, w2, b2 = params["W1"], params["b1"], params["w2"], params["b2"]
        R, F_, Hd = W1.shape
        self.R, self.F, self.Hd, self.groups, self.fold_below = R, F_, Hd, groups, fold_below
        self.table = W1.new_zeros(R, F_ + 1, 2 * Hd)  # [U | E] per run
        self.table[:, :F_, :Hd] = W1
        self.table[:, F_, :Hd] = b1
        self.v = torch.cat([w2, b2[:, None]], -1)  # (R, Hd + 1) = [w2, b2]
        self.ev = torch.zeros_like(self.v)  # its trace
        self.c = W1.new_ones(R)
        self.A = W1.new_zeros(R)
        self.row_offsets = (torch.arange(R, device=W1.device) * (F_ + 1)).view(R, 1, 1)
        self.U_run = self.table[..., :Hd].unbind(0)  # per-run views for the fold
        self.E_run = self.table[..., Hd:].unbind(0)

    def _by_group(self, fn, z):
        if len(self.groups) == 1:
            return fn(self.groups[0][0], z)
        return torch.cat([fn(name, z[a:b]) for name, a, b in self.groups])

    def values(self, idx: torch.Tensor):
        """idx (R, N, 21) -> V (R, N), z (R, N, Hd), a(z) (R, N, Hd), all with the current theta."""
        R, N, K = idx.shape
        Hd = self.Hd
        bag = F.embedding_bag((idx + self.row_offsets).view(R * N, K), self.table.view(-1, 2 * Hd), mode="sum")
        bag = bag.view(R, N, 2 * Hd)
        z = torch.addcmul(bag[..., :Hd], bag[..., Hd:], self.A.view(R, 1, 1))  # eq. 7
        a = self._by_group(lambda name, x: ACTIVATIONS[name](x), z)
        value = torch.baddbmm(self.v[:, None, Hd:], a, self.v[:, :Hd, None]).squeeze(-1)  # b2 + sum_k w2_k a_k
        return value, z, a

    def learn(self, idx_t: torch.Tensor, z_t: torch.Tensor, a_t: torch.Tensor, decay: torch.Tensor, step: torch.Tensor):
        """e <- decay e + grad V(s_t) (eq. 4), then theta <- theta + step e (eq. 1). idx_t (R, 21), z_t and a_t (R, Hd)
        of s_t under the theta that gave delta; decay, step (R,)."""
        self.decay_traces(decay)
        self.accumulate(idx_t, z_t, a_t, decay, step)

    def decay_traces(self, decay: torch.Tensor):
        """The W trace's part of e <- decay e (eq. 4): c <- decay c, then fold the runs whose c fell below
        `fold_below` (an episode start, decay = 0, always folds). Theta is unchanged, so this may run any time between
        the forward pass and `accumulate`. Data-dependent (which runs fold), so the compiled step leaves it outside."""
        if self.c.device.type == "cpu":
            self.fold_on_host(decay)
        else:
            self.fold_on_device(decay)

    def fold_on_host(self, decay: torch.Tensor):
        """`decay_traces` on CPU tensors through numpy views of c and A: no tensor op per step but the folds."""
        c, A = self.c.numpy(), self.A.numpy()
        c *= decay.numpy()
        for r in np.flatnonzero(c < self.fold_below):  # a few runs per step
            self.U_run[r].add_(self.E_run[r], alpha=float(A[r]))  # U <- U + A E
            self.E_run[r].mul_(float(c[r]))  # E <- c E
            c[r], A[r] = 1.0, 0.0

    def fold_on_device(self, decay: torch.Tensor):
        """`decay_traces` with tensor ops (a GPU): the same arithmetic, one host sync per step."""
        self.c.mul_(decay)
        fold = self.c < self.fold_below
        if bool(fold.any()):
            runs = fold.nonzero().flatten()
            for r, A_r, c_r in zip(runs.tolist(), self.A[runs].tolist(), self.c[runs].tolist(), strict=True):
                self.U_run[r].add_(self.E_run[r], alpha=A_r)
                self.E_run[r].mul_(c_r)
            self.c.masked_fill_(fold, 1.0)
            self.A.masked_fill_(fold, 0.0)

    def accumulate(self, idx_t: torch.Tensor, z_t: torch.Tensor, a_t: torch.Tensor, decay: torch.Tensor, step):
        """The rest of `learn` once `decay_traces(decay)` has run: e += grad V(s_t), theta += step e. In place and
        branch-free (the compiled step's part of the update)."""
        Hd, c = self.Hd, self.c
        da = self._by_group(lambda name, x: activation_and_derivative(name, x)[1], z_t)
        g = self.v[:, :Hd] * da / c[:, None]  # dV/dz_k = w2_k a'(z_k) (eq. 11, 12), divided by c
        values = torch.cat([g * -self.A[:, None], g], -1)  # (R, 2 Hd): U -= A g / c, E += g / c
        K = idx_t.shape[-1]
        rows = (idx_t + self.row_offsets[:, 0]).view(-1)
        self.table.view(-1, 2 * Hd).index_add_(
            0, rows, values[:, None, :].expand(self.R, K, 2 * Hd).reshape(-1, 2 * Hd)
        )
        self.ev.mul_(decay[:, None])
        self.ev[:, :Hd] += a_t
        self.ev[:, Hd] += 1.0
        self.A += step * c
        self.v.addcmul_(self.ev, step[:, None])

    def parameters(self) -> dict[str, torch.Tensor]:
        """theta as init_shallow's dict: W1 (R, F, Hd), b1 (R, Hd), w2 (R, Hd), b2 (R,)."""
        W = torch.addcmul(self.table[..., : self.Hd], self.table[..., self.Hd :], self.A.view(-1, 1, 1))
        return {"W1": W[:, : self.F], "b1": W[:, self.F], "w2": self.v[:, : self.Hd], "b2": self.v[:, self.Hd]}

    def eligibility(self) -> dict[str, torch.Tensor]:
        """e as update_traces_and_params holds it."""
        E = self.table[..., self.Hd :] * self.c.view(-1, 1, 1)
        return {"W1": E[:, : self.F], "b1": E[:, self.F], "w2": self.ev[:, : self.Hd], "b2": self.ev[:, self.Hd]}


def td_reward(holes_next, game_over, holes_current, holes_scale: float, timing: str) -> torch.Tensor:
    """The reward in delta_t = r + gamma V(s_{t+1}) - V(s_t), with r(s) = exp(-holes(s) / holes_scale) (eq. 16, 17).

    'next' (default, tetris.md §0): r(s_{t+1}), the afterstate moved into, 0 when the move ends the game (no
    afterstate). 'current': r(s_t), the paper's r_t read literally, so V(s) also holds r(s) and a terminal move still
    earns r(s_t). Selection (eq. 14) is on V(f(s, a)) either way.
    """
    if timing == "current":
        return torch.exp(-holes_current.float() / holes_scale)
    return torch.exp(-holes_next.float() / holes_scale).masked_fill(game_over, 0.0)


# ----------------------------------------------------------------------------------------------------------------------
# One training step of every run (what `main`'s loop calls; the shallow one is what --compile compiles)
# ----------------------------------------------------------------------------------------------------------------------
class StepConstants(NamedTuple):
    """What every step reads and no step changes."""

    gamma: float
    alpha: float
    gamma_lambda: float
    tau0: float
    tau_k: float
    holes_scale: float
    reward_timing: str
    empty_board: torch.Tensor  # a run whose game ends restarts from these
    empty_state: torch.Tensor
    target: torch.Tensor  # (R,) episodes each run trains for
    encoding: torch.Tensor | None = None  # the shallow net's _bias_encoding_table


def choose_and_td_error(s: dict, after, v_t, v_cand, uniform, k: StepConstants):
    """Softmax selection (eq. 14) at tau(i) (eq. 15) by Gumbel-max on the pre-drawn `uniform`, the reward (eq. 16, 17)
    and delta_t = r + gamma V(s_{t+1}) - V(s_t) (eq. 2). Afterstates where the piece does not fit are terminal: V = 0
    (tetris.md §0). Returns action, game_over, holes(s_{t+1}), delta_t and alpha delta_t (0 for finished runs)."""
    runs = torch.arange(len(v_t), device=v_t.device)
    v_cand = v_cand.masked_fill(after.game_over, 0.0)
    tau = temperature(s["episodes"].float(), k.tau0, k.tau_k)
    action, _ = select_placement(v_cand, tau, after.valid, uniform)
    game_over = after.game_over[runs, action]
    holes_next = after.holes[runs, action]
    reward = td_reward(holes_next, game_over, s["holes_now"], k.holes_scale, k.reward_timing)
    td_error = reward + k.gamma * v_cand[runs, action] - v_t  # eq. 2 (V(s_{t+1}) = 0 when terminal)
    return action, game_over, holes_next, td_error, k.alpha * td_error * s["active"]


def advance_games(s: dict, after, cand_states, action, game_over, holes_next, td_error, next_pieces, k: StepConstants):
    """Move every run to s_{t+1} = f(s_t, a_t); a finished game is recorded (runs still learning only) and restarts
    from the empty board with e = 0 (decay 0 on its first step). Returns the new carry; `episodes`, `scores` and
    `lengths` are updated in place."""
    runs = torch.arange(len(action), device=action.device)
    active, episodes, scores, lengths = s["active"], s["episodes"], s["scores"], s["lengths"]
    score = s["score"] + after.rows_cleared[runs, action]
    length = s["length"] + 1
    placements = s["placements"] + active.sum()  # pieces placed by runs still learning (finished runs idle along)
    abs_td_sum = s["abs_td_sum"] + td_error.abs() * active
    boards = torch.where(game_over.view(-1, *[1] * (k.empty_board.dim())), k.empty_board, after.boards[runs, action])
    states = torch.where(game_over.view(-1, *[1] * (k.empty_state.dim())), k.empty_state, cand_states[runs, action])
    holes_now = holes_next.masked_fill(game_over, 0)
    # Eagerly only when some game ended; under torch.compile always (branch-free: record is False elsewhere).
    if torch.compiler.is_compiling() or bool(game_over.any()):
        slot = episodes.clamp(max=scores.shape[1] - 1)
        record = game_over & active
        scores[runs, slot] = torch.where(record, score, scores[runs, slot])
        lengths[runs, slot] = torch.where(record, length, lengths[runs, slot])
        episodes += record
        active = episodes < k.target
        score = score.masked_fill(game_over, 0)
        length = length.masked_fill(game_over, 0)
    decay = torch.where(game_over, 0.0, k.gamma_lambda)  # the next step's gamma lambda (0 on a first step: e_0 = 0)
    return {
        **s,
        **dict(boards=boards, states=states, pieces=next_pieces, holes_now=holes_now, decay=decay, score=score),
        **dict(length=length, active=active, placements=placements, abs_td_sum=abs_td_sum),
    }


def shallow_step(learner: ShallowTD, engine: ColumnEngine, s: dict, uniform, next_pieces, k: StepConstants) -> dict:
    """One placement of every run with the shallow net: afterstates of every placement, V(s_t) and every V(f(s_t, a))
    in one forward with theta_t, selection, delta_t, e += grad V(s_t) and theta += alpha delta_t e (eq. 1, 2, 4, 14),
    then the games advance. `learner.decay_traces(s["decay"])` must run first (it holds the data-dependent fold).

    s is the carry: boards (R, W) column bits, states (R, 21) input rows of s_t, pieces, holes_now, decay, score,
    length, active, placements, abs_td_sum, episodes, scores, lengths. uniform (R, P + 1) and next_pieces (R,) are drawn
    by the caller from the run's generator, so the compiled and eager steps play the same games. Branch-free and
    shape-static when compiled. --compile compiles its two halves as two graphs (see `compiled_shallow_step`)."""
    after, cand_states = shallow_afterstates(engine, s, k)
    return shallow_learn(learner, engine, s, after, cand_states, uniform, next_pieces, k)


def shallow_afterstates(engine: ColumnEngine, s: dict, k: StepConstants):
    """Every placement's afterstate f(s_t, a) and its input rows (R, P, 21): the integer half of `shallow_step`."""
    after = engine(s["boards"], s["pieces"])
    return after, shallow_indices(after.heights, after.holes, engine.height, k.encoding)


def shallow_learn(learner: ShallowTD, engine, s: dict, after, cand_states, uniform, next_pieces, k: StepConstants):
    """The floating-point half of `shallow_step`: forward, selection, TD(lambda) update, the games advance."""
    P = engine.num_placements
    v_all, z, a = learner.values(torch.cat([cand_states, s["states"][:, None]], 1))
    action, game_over, holes_next, td_error, step = choose_and_td_error(s, after, v_all[:, P], v_all[:, :P], uniform, k)
    learner.accumulate(s["states"], z[:, P], a[:, P], s["decay"], step)
    return advance_games(s, after, cand_states, action, game_over, holes_next, td_error, next_pieces, k)


LEARNER_STATE = ("table", "v", "ev", "c", "A")  # the shallow net's tensors that the fold and the update change
CARRY_NEW = ("boards", "states", "holes_now", "decay", "score", "length", "active", "placements", "abs_td_sum")
CARRY_IN_PLACE = ("episodes", "scores", "lengths")  # the record, updated in place
CARRY = CARRY_NEW + CARRY_IN_PLACE  # the carry tensors the update graph reads, in its argument order
GAME_STATE = ("boards", "states", "pieces", "holes_now", "decay", "score", "length")  # the games in progress


@contextlib.contextmanager
def branch_free_tracing():
    """The step's data-dependent branches (a row cleared, a game over) take their branch-free side when
    torch.compiler.is_compiling() is True. make_fx traces one path, so the trace raises the flag that torch.compile
    and torch.export raise while they trace."""
    before = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = before


def compile_graph(fn, example_args: list[torch.Tensor], options: dict):
    """fn(*tensors) -> tuple of tensors, traced once (make_fx on fake tensors: nothing is applied) and compiled by
    inductor into one graph that is called directly: no torch.compile frame hook, guard check or cache lookup per call,
    which at 10 runs cost more than the kernels (README "Speed"). Nothing is re-checked either: the inputs must keep
    the example's shapes, dtypes and devices (the training loop's do), and tensors read from the closure (the engine's
    tables, StepConstants) are baked in. In-place updates of inputs stay in place."""
    from torch._inductor.compile_fx import compile_fx  # inductor's entry point, the one torch.compile calls
    from torch.fx.experimental.proxy_tensor import make_fx

    with branch_free_tracing():
        graph = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*example_args)
    for node in graph.graph.nodes:  # the trace's fake values; inductor propagates its own
        node.meta.pop("val", None), node.meta.pop("tensor_meta", None)
    with torch._inductor.config.patch(options):
        return compile_fx(graph, list(example_args))


def compiled_shallow_step(fallback: bool = True):
    """`shallow_step` as two compiled graphs, built on the first call for that call's engine, constants and shapes.

    The afterstate half is bit arithmetic on (R, P, W) int64 boards, whose vectorised CPU code (inductor's 8-lane loads
    of the ragged W = 10 rows and the gathers) ran 3x slower than scalar code here, so it is compiled with
    `cpp.simdlen = 1`; the floating-point half (exp in every activation) keeps the vector code. Both use inductor's C++
    wrapper and are called through `compile_graph`, not torch.compile, which at 10 runs took the loop from 19-20k to
    27-31k placements/s (README "Speed"). fallback=False: no eager fallback (the tests)."""
    graphs = {}

    def afterstates_flat(boards, pieces):
        after, cand_states = shallow_afterstates(graphs["engine"], dict(boards=boards, pieces=pieces), graphs["k"])
        return (*after, cand_states)

    def learn_flat(*tensors):
        n_learner, n_carry = len(LEARNER_STATE), len(CARRY)
        learner_state, carry = tensors[:n_learner], tensors[n_learner : n_learner + n_carry]
        uniform, next_pieces, *after, cand_states = tensors[n_learner + n_carry :]
        learner = copy.copy(graphs["learner"])  # the same net with the traced tensors as its state
        learner.__dict__.update(zip(LEARNER_STATE, learner_state, strict=True))
        s = dict(zip(CARRY, carry, strict=True))
        engine, k = graphs["engine"], graphs["k"]
        s = shallow_learn(learner, engine, s, Afterstates(*after), cand_states, uniform, next_pieces, k)
        return tuple(s[key] for key in CARRY_NEW)

    def learn_inputs(learner, s, uniform, next_pieces, after) -> list[torch.Tensor]:
        return [*(getattr(learner, name) for name in LEARNER_STATE), *(s[key] for key in CARRY), uniform, next_pieces,
                *after]  # fmt: skip

    def compiled(learner, engine, s, uniform, next_pieces, k):
        if "learn" not in graphs:  # build both graphs for these objects and shapes
            graphs.update(learner=learner, engine=engine, k=k)
            options = {"cpp.simdlen": 1, "cpp_wrapper": True}
            graphs["afterstates"] = compile_graph(afterstates_flat, [s["boards"], s["pieces"]], options)
            example = learn_inputs(learner, s, uniform, next_pieces, graphs["afterstates"](s["boards"], s["pieces"]))
            graphs["learn"] = compile_graph(learn_flat, example, {"cpp_wrapper": True})
        elif not (learner is graphs["learner"] and engine is graphs["engine"] and k is graphs["k"]):
            raise ValueError("compiled_shallow_step: one compiled step serves one learner, engine and StepConstants")
        after = graphs["afterstates"](s["boards"], s["pieces"])
        new = graphs["learn"](*learn_inputs(learner, s, uniform, next_pieces, after))
        return {**s, **dict(zip(CARRY_NEW, new, strict=True)), "pieces": next_pieces}

    def step(learner, engine, s, uniform, next_pieces, k):
        if graphs.get("eager"):
            return shallow_step(learner, engine, s, uniform, next_pieces, k)
        try:
            return compiled(learner, engine, s, uniform, next_pieces, k)
        except Exception as err:  # noqa: BLE001  (any compiler failure: fall back to eager)
            if not fallback or "learn" in graphs:
                raise
            first_line = (str(err).strip().splitlines() or [""])[0][:200]
            print(f"warning: compiling the step failed ({type(err).__name__}: {first_line}); running eagerly")
            graphs["eager"] = True
            return shallow_step(learner, engine, s, uniform, next_pieces, k)

    return step


# ----------------------------------------------------------------------------------------------------------------------
# Deep network on the raw board (§3.1), batched over runs with torch.func
# ----------------------------------------------------------------------------------------------------------------------
def same_pad(size: int, kernel: int = 3, stride: int = 2) -> tuple[int, int]:
    """TensorFlow 'SAME': output ceil(size / stride), total padding max((out - 1) stride + kernel - size, 0), split
    floor before (top / left) and ceil after (bottom / right). 5 -> 3 pads (1, 1); 20 -> 10 and 10 -> 5 pad (0, 1)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def same_max_pool(x: torch.Tensor) -> torch.Tensor:
    """3x3 max-pooling with stride 2 and TensorFlow's 'SAME' padding (`same_pad`, -inf in the padding), output
    ceil(n/2): 20x10 -> 10x5 -> 5x3, the sizes of tetris.md §0."""
    (top, bottom), (left, right) = same_pad(x.shape[-2]), same_pad(x.shape[-1])
    return F.max_pool2d(F.pad(x, (left, right, top, bottom), value=float("-inf")), 3, 2)


class DeepValueNet(nn.Module):
    """conv 15 5x5/1 -> max-pool 3x3/2 -> conv 50 5x5/1 -> max-pool 3x3/2 -> fc 250 -> linear (§3.1).

    The paper gives no padding; we use 'same' padding (2) for the convolutions and 'same' pooling (output ceil(n/2)),
    so a 20x10 board becomes 10x5 then 5x3 and the fully connected layer sees 50*5*3 = 750 inputs (project choice,
    tetris.md §0). `activation` "silu-dsilu" = SiLU in the conv layers, dSiLU in the fully connected layer.
    """

    def __init__(self, height: int, width: int, activation: str):
        super().__init__()
        conv_act, fc_act = activation.split("-")
        self.conv_act, self.fc_act = ACTIVATIONS[conv_act], ACTIVATIONS[fc_act]
        self.conv1 = nn.Conv2d(1, 15, 5, padding=2)
        self.conv2 = nn.Conv2d(15, 50, 5, padding=2)
        h, w = (height + 3) // 4, (width + 3) // 4  # ceil(ceil(n/2)/2)
        self.fc = nn.Linear(50 * h * w, 250)
        self.out = nn.Linear(250, 1)

    def forward(self, boards: torch.Tensor) -> torch.Tensor:
        x = boards.float().unsqueeze(-3)  # (N, 1, H, W)
        x = same_max_pool(self.conv_act(self.conv1(x)))  # (N, 15, H/2, W/2)
        x = same_max_pool(self.conv_act(self.conv2(x)))  # (N, 50, H/4, W/4)
        x = self.fc_act(self.fc(x.flatten(-3)))  # (N, 250)
        return self.out(x).squeeze(-1)  # (N,)


def init_deep(num_runs, height, width, activation, seed, device):
    """Stacked parameters of num_runs DeepValueNets (run i from seed + i; PyTorch's default initialisation)."""
    nets = []
    for i in range(num_runs):
        torch.manual_seed(seed + i)
        nets.append(DeepValueNet(height, width, activation))
    params, _ = stack_module_state(nets)
    base = DeepValueNet(height, width, activation).to("meta")
    return {k: v.detach().to(device) for k, v in params.items()}, base


def deep_value(params, boards, base):
    """boards (R, P, H, W) -> V (R, P): one vmapped call over runs."""
    return vmap(lambda p, x: functional_call(base, p, (x,)))(params, boards)


def deep_value_and_grad(params, boards, base):
    """boards (R, H, W) -> V (R,), grad_theta V per run (dict of (R, ...) tensors)."""

    def single(p, x):
        v = functional_call(base, p, (x[None],))[0]
        return v, v

    grads, value = vmap(grad(single, has_aux=True))(params, boards)
    return value, grads


# ----------------------------------------------------------------------------------------------------------------------
# TD(lambda) pieces
# ----------------------------------------------------------------------------------------------------------------------
def temperature(episode: torch.Tensor, tau0: float, tau_k: float) -> torch.Tensor:
    """Hyperbolic annealing, eq. 15: tau(i) = tau0 / (1 + tau_k i)."""
    return tau0 / (1 + tau_k * episode)


def softmax_probabilities(values: torch.Tensor, tau: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Eq. 14: pi(a|s) proportional to exp(V(f(s, a)) / tau) over the valid placements. values (R, P), tau (R,)."""
    logits = (values / tau[:, None]).masked_fill(~valid, float("-inf"))
    return torch.softmax(logits, -1)


def select_placement(values, tau, valid, uniform, epsilon=None):
    """Sample a placement per run; returns (action, exploratory).

    uniform (R, P + 1) are U(0, 1) draws. Softmax (eq. 14) by the Gumbel-max trick on uniform[:, :P]; epsilon-greedy
    when `epsilon` is given: uniform[:, P] < epsilon explores, picking uniformly among the valid placements by
    uniform[:, :P]. An action is exploratory when it is not the greedy one (Table 3).
    """
    P = values.shape[-1]
    greedy = values.masked_fill(~valid, float("-inf")).argmax(-1)
    if epsilon is None:
        gumbel = -torch.log(-torch.log(uniform[:, :P].clamp(1e-20, 1 - 1e-7)))
        logits = (values / tau[:, None]).masked_fill(~valid, float("-inf"))
        action = (logits + gumbel).argmax(-1)
    else:
        random_choice = uniform[:, :P].masked_fill(~valid, -1.0).argmax(-1)
        action = torch.where(uniform[:, P] < epsilon, random_choice, greedy)
    return action, action != greedy


def update_traces_and_params(params, eligibility, grads, decay, step):
    """Eq. 4 then eq. 1 for every parameter tensor, per run r:

        e_r <- decay_r e_r + grad V(s_t)        decay_r = gamma lambda (0 on an episode's first step: e_0 = 0)
        theta_r <- theta_r + step_r e_r          step_r = alpha delta_t (0 for runs that have finished)

    A gradient given as (rows, values) is the shallow net's W1 gradient, non-zero only on the active feature rows.
    """
    for name, theta in params.items():
        e = eligibility[name]
        shape = (-1,) + (1,) * (e.dim() - 1)
        e.mul_(decay.view(shape))
        g = grads[name]
        if isinstance(g, tuple):
            rows, values = g  # rows (R, 20), values (R, Hd): add values to each active row of run r
            R, F_, Hd = e.shape
            flat_rows = (rows + torch.arange(R, device=rows.device)[:, None] * F_).reshape(-1)
            e.view(R * F_, Hd).index_add_(0, flat_rows, values.repeat_interleave(rows.shape[1], 0))
        else:
            e.add_(g)
        theta.addcmul_(e, step.view(shape))


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = sum_{k>=0} gamma^k r_{t+1+k} (§4.1), the return following state s_t."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------------------------
def architecture(args: Args) -> dict:
    height, width, _ = VARIANTS[ENV_VARIANTS[args.env_id]]
    arch = {"network": args.network, "activation": "+".join(args.activation), "height": height, "width": width}
    if args.network == "shallow":
        arch["hidden"] = args.hidden
    return arch


def save_checkpoint(path, args, params, episodes, scores, lengths, state=None):
    """Parameters, episode counters and the score history of every run, and (`state`) what resumes the run exactly:
    the traces, the games in progress and the random generator. Written atomically (tmp file + rename)."""
    n = max(int(episodes.max()), 1)
    tmp = f"{path}.tmp"
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "architecture": architecture(args),
            "num_runs": args.num_runs,
            "env_id": args.env_id,
            "params": {k: v.detach().cpu() for k, v in params.items()},
            "episodes": episodes.cpu(),
            "scores": scores[:, :n].cpu(),
            "lengths": lengths[:, :n].cpu(),
            "args": asdict(args),
            **({"state": state} if state is not None else {}),
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(path: str, args: Args) -> dict:
    """Load and check a checkpoint against the requested architecture; raises ValueError with one clear line."""
    if not os.path.isfile(path):
        raise ValueError(f"--resume {path!r}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any unpickling failure means the file is not a checkpoint)
        raise ValueError(f"--resume {path!r} is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"--resume {path!r} is not a td_lambda_tetris checkpoint")
    want, have = architecture(args), ckpt["architecture"]
    trained = have["activation"].split("+")
    if (
        want != have
        and args.total_episodes == 0
        and len(args.activation) == 1
        and args.activation[0] in trained
        and {**have, "activation": want["activation"]} == want
    ):  # evaluate one activation of a batched checkpoint (Table 1's process): keep only its runs
        n, k = ckpt["num_runs"], trained.index(args.activation[0])
        rows = slice(k * n, (k + 1) * n)
        ckpt["params"] = {name: v[rows] for name, v in ckpt["params"].items()}
        ckpt["episodes"], ckpt["scores"], ckpt["lengths"] = (ckpt[x][rows] for x in ("episodes", "scores", "lengths"))
        ckpt.pop("state", None)  # evaluation only: no training state is resumed
        have = ckpt["architecture"] = want
    if want != have:
        diff = ", ".join(
            f"{k}: checkpoint {have.get(k)} vs requested {want.get(k)}" for k in want if want[k] != have.get(k)
        )
        raise ValueError(f"--resume {path!r} holds another architecture ({diff}); pass matching flags")
    if ckpt["num_runs"] != args.num_runs:
        raise ValueError(f"--resume {path!r} holds {ckpt['num_runs']} runs; pass --num-runs {ckpt['num_runs']}")
    # V means a different thing under each reward timing; checkpoints written before the flag existed used 'next'
    timing = ckpt.get("args", {}).get("reward_timing", "next")
    if timing != args.reward_timing:
        raise ValueError(f"--resume {path!r} was trained with --reward-timing {timing}; pass --reward-timing {timing}")
    if 0 < args.total_episodes <= int(ckpt["episodes"].min()):
        raise ValueError(
            f"--resume {path!r} is already at episode {int(ckpt['episodes'].min()):,} (slowest run); raise "
            "--total-episodes above it (it counts from the start of the original run)"
        )
    return ckpt


# ----------------------------------------------------------------------------------------------------------------------
# Plots, CSVs and video
# ----------------------------------------------------------------------------------------------------------------------
VIDEO_MAX_PLACEMENTS = 2000  # frames per video at most (a late 10x10 game lasts ~10k placements)


class TetrisVideo:
    """--capture-video: the boards of the recorded runs (run index -> file name tag) as mp4, one frame per placement,
    for the episodes gymnasium's capped cubic schedule picks (0, 1, 8, 27, ..., 729, 1000, 2000, ...). Episodes are
    numbered as in the learning curve, so a resumed run goes on from its checkpoint's counter; a run that has reached
    --total-episodes records nothing more, and the games under way when training ends are written as far as they got."""

    def __init__(self, folder: str, runs: dict[int, str], episodes: torch.Tensor, height: int, columns: bool):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.runs, self.height, self.columns = folder, runs, height, columns
        self.ids = list(runs)
        self.episode = {r: int(episodes[r]) for r in self.ids}
        self.frames = {r: [] for r in self.ids}

    @staticmethod
    def wanted(episode: int) -> bool:
        return round(episode ** (1 / 3)) ** 3 == episode if episode < 1000 else episode % 1000 == 0

    def add(self, boards: torch.Tensor, episodes: torch.Tensor, active: torch.Tensor):
        """After every step: every run's board s_t ((R, W) column bits or (R, H, W)), finished-episode counters and
        whether it is still learning. A game that just ended has already been replaced by the next one's empty
        board, which becomes that game's first frame. Reading the counters syncs a CUDA device at every step; the
        boards are copied only while a recorded game is under way."""
        counts, learning = episodes[self.ids].tolist(), active[self.ids].tolist()
        recording = []
        for k, r in enumerate(self.ids):
            if counts[k] != self.episode[r]:
                self.write(r)
                self.episode[r] = counts[k]
            if learning[k] and self.wanted(self.episode[r]) and len(self.frames[r]) < VIDEO_MAX_PLACEMENTS:
                recording.append(r)
        if recording:
            now = boards[recording]
            now = (columns_to_boards(now, self.height) if self.columns else now).cpu().numpy()
            for r, board in zip(recording, now, strict=True):
                self.frames[r].append(board)

    def write(self, r: int):
        if self.frames[r]:
            from moviepy import ImageSequenceClip

            path = os.path.join(self.folder, f"{self.runs[r]}-episode-{self.episode[r]}.mp4")
            ImageSequenceClip([render_board(b) for b in self.frames[r]], fps=10).write_videofile(path, logger=None)
        self.frames[r] = []

    def close(self):
        for r in self.ids:
            self.write(r)


def block_means(scores: np.ndarray, counts: np.ndarray, block: int) -> np.ndarray:
    """Mean score of every complete block of `block` episodes per run (the paper's curves use blocks of 1,000).
    Returns (runs, blocks) with NaN where a run has not finished a block."""
    n_blocks = int(counts.max()) // block if len(counts) else 0
    out = np.full((len(counts), n_blocks), np.nan)
    for r, c in enumerate(counts):
        k = int(c) // block
        if k:
            out[r, :k] = scores[r, : k * block].reshape(k, block).mean(1)
    return out


def write_learning_curve(run_dir, scores, counts, block, title, paper_score=None):
    means = block_means(scores, counts, block)
    with open(os.path.join(run_dir, "learning_curve.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["episode"] + [f"run{r}" for r in range(means.shape[0])] + ["mean"])
        for b in range(means.shape[1]):
            col = means[:, b]
            mean = f"{col.mean():.3f}" if not np.isnan(col).any() else ""  # only blocks every run finished
            w.writerow([(b + 1) * block] + [f"{v:.3f}" for v in col] + [mean])
    if means.shape[1] == 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = (np.arange(means.shape[1]) + 1) * block
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in range(means.shape[0]):
        ax.plot(x, means[r], "--", lw=0.8, alpha=0.6)
    complete = ~np.isnan(means).any(0)  # the mean only where every run has finished the block
    ax.plot(x[complete], means[:, complete].mean(0), "k-", lw=2.5, label=f"mean of {means.shape[0]} runs")
    if paper_score is not None:
        ax.axhline(paper_score, color="r", ls=":", label=f"paper, final ({paper_score})")
    ax.set_xlabel("episode")
    ax.set_ylabel(f"mean score per {block} episodes")
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)  # long run names wrap instead of being cut
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "learning_curve.png"), dpi=110)
    plt.close(fig)


def write_combined_curve(run_dir, per_group, scores, counts, groups, args):
    """Fig. 2 with every activation: the mean over runs per 1,000 episodes (per tenth of the budget before that)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    block = 1000 if counts.min() >= 1000 else max(int(counts.min()) // 10, 1)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for act, a, b in groups:
        means = block_means(scores[a:b], counts[a:b], block)
        if means.shape[1] == 0:
            continue
        complete = ~np.isnan(means).any(0)
        x = (np.arange(means.shape[1]) + 1) * block
        info = per_group[act]
        final = info.get("final_score_mean", float("nan"))
        label = f"{act} ({b - a} runs; final {final:.0f}, paper {info['paper_final_score']})"
        (line,) = ax.plot(x[complete], means[:, complete].mean(0), lw=2, label=label)
        if info["paper_final_score"] is not None:
            ax.axhline(info["paper_final_score"], color=line.get_color(), ls=":", lw=1)
    ax.set_xlabel("episode")
    ax.set_ylabel(f"mean score per {block} episodes, mean over runs")
    ax.set_title(f"{args.env_id} {args.network}, {int(counts.min()):,} episodes per run (dotted: paper, 200k)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "learning_curves.png"), dpi=110)
    plt.close(fig)


def write_value_analysis(run_dir, episodes, gamma):
    """§4.1 / Fig. 6: V(s_t) against R_t along episodes, and (1/T) sum_t (V(s_t) - R_t) per episode."""
    rows = []
    for run, values, rewards in episodes:
        returns = discounted_returns(np.asarray(rewards), gamma)
        diff = np.asarray(values) - returns
        rows.append((run, len(values), diff.mean(), np.abs(diff).mean()))
    with open(os.path.join(run_dir, "value_analysis.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "T", "normalised_sum_diff", "normalised_sum_abs_diff"])
        w.writerows(rows)
    T = np.array([r[1] for r in rows], dtype=float)
    d = np.array([r[2] for r in rows])
    fit = np.polyfit(T, d, 1) if len(rows) > 1 and T.std() > 0 else np.array([0.0, d.mean() if len(d) else 0.0])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    order = np.argsort(T)
    for label, i in (("short", order[len(order) // 10]), ("medium", order[len(order) // 2]), ("long", order[-1])):
        run, values, rewards = episodes[i]
        t = np.arange(1, len(values) + 1)
        (line,) = left.plot(t, values, lw=1, label=f"V(s_t), {label} (T={len(values)})")
        left.plot(t, discounted_returns(np.asarray(rewards), gamma), "--", lw=1, color=line.get_color(), label="R_t")
    left.set_xlabel("t")
    left.set_ylabel("value")
    left.legend(fontsize=7)
    right.scatter(T, d, s=4, alpha=0.5)
    xs = np.linspace(T.min(), T.max(), 2)
    right.plot(xs, np.polyval(fit, xs), "r-", label=f"fit {fit[0]:.4f} T + {fit[1]:.2f}")
    right.set_xlabel("episode length T")
    right.set_ylabel("(1/T) sum (V(s_t) - R_t)")
    right.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "value_analysis.png"), dpi=110)
    plt.close(fig)
    return {
        "episodes": len(rows),
        "mean_T": float(T.mean()),
        "fit_slope": float(fit[0]),
        "fit_intercept": float(fit[1]),
        "mean_normalised_sum_diff": float(d.mean()),
        "fit_at_mean_T": float(np.polyval(fit, T.mean())),
    }


# ----------------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------------
class stop_signals:
    """`with stop_signals() as stopped:` SIGINT and SIGTERM (even when a background shell ignored SIGINT) end the loop
    at the next `stopped()` check, so that the summary and the checkpoint are written; the old handlers come back.
    A flag, not an exception: an exception raised from a handler lands in whatever code runs at that moment, and
    torch.compile's guard code swallows it (a `--compile` run under `timeout -s TERM` then never stopped)."""

    def __enter__(self):
        self.received = False

        def handler(signum, frame):
            self.received = True

        self.previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        return lambda: self.received

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False


def fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def remaining_length(lengths, total: int, recent: int = 100) -> tuple[float, float]:
    """Steps that episodes len(lengths) .. total-1 will take, from the lengths of the finished ones: (low, trend).
    low: each as long as the mean of the last `recent` (a lower bound while episodes lengthen as the agent learns).
    trend: lengths go on along the least-squares line through the last quarter of the finished episodes (at least
    `recent` of them), never below low; an estimate, too high once the learning curve bends over and too low while it
    still bends up. (inf, inf) before any episode has finished."""
    done, left = len(lengths), total - len(lengths)
    if left <= 0:
        return 0.0, 0.0
    if done == 0:
        return math.inf, math.inf
    low = left * float(np.mean(lengths[-recent:]))
    window = np.asarray(lengths[-max(recent, done // 4) :], dtype=np.float64)
    index = np.arange(done - len(window), done, dtype=np.float64)
    centred = index - index.mean()
    slope = float(centred @ (window - window.mean()) / (centred @ centred)) if len(window) > 1 else 0.0
    # the sum over j = done .. total-1 of the line mean(window) + slope (j - mean(index))
    trend = left * (window.mean() + slope * ((done + total - 1) / 2 - index.mean()))
    return low, max(low, trend)


def eta_text(low: float, trend: float) -> str:
    """The progress line's ETA: both ends of `eta_seconds`, or '?' before any episode has finished."""
    if not math.isfinite(trend):
        return "ETA ?"
    return (
        f"ETA {fmt_time(low)} to {fmt_time(trend)} (episodes as long as the last 100, or lengthening on their recent "
        "trend)"
    )


def eta_seconds(lengths: np.ndarray, done: np.ndarray, total: int, steps_per_second: float) -> tuple[float, float]:
    """Seconds left (low, trend; see `remaining_length`) for runs whose finished episodes had lengths[r, :done[r]].
    Every run places one piece per step of the batched loop (a run that has finished idles along), so the run with
    the most placements left sets the time: max_r placements_r / (loop steps per second)."""
    left = [remaining_length(lengths[r, : int(d)], total) for r, d in enumerate(done)]
    low, trend = max((a for a, _ in left), default=0.0), max((b for _, b in left), default=0.0)
    if trend == 0:
        return 0.0, 0.0
    if steps_per_second <= 0:
        return math.inf, math.inf
    return low / steps_per_second, trend / steps_per_second


def score_summary(scores: np.ndarray, counts: np.ndarray, final_window: int) -> dict:
    """Table 1's statistics over each run's final `final_window` episodes (fewer if a run has not played them).

    final_score_mean ± final_score_sd_episodes is the paper's "mean ± sd": the standard deviation of the episode
    scores of the final window, all runs' episodes pooled (for one run, e.g. the best: 235 ± 54, that run's own
    episodes). The spread of the per-run means is kept apart as final_score_std_over_runs.
    """
    window = min(final_window, int(counts.min())) if len(counts) else 0
    if window == 0:
        return {"final_window": 0}
    last = np.stack([scores[r, c - window : c] for r, c in enumerate(counts)])  # (R, window)
    per_run = last.mean(1)
    best = int(per_run.argmax())
    return {
        "final_window": window,
        "final_score_per_run": per_run.tolist(),
        "final_score_mean": float(per_run.mean()),
        "final_score_sd_episodes": float(last.std()),
        "final_score_sd_episodes_per_run": last.std(1).tolist(),
        "final_score_std_over_runs": float(per_run.std()),
        "final_score_best_run": float(per_run[best]),
        "final_score_best_run_index": best,
        "final_score_best_run_sd_episodes": float(last[best].std()),
    }


def main(args: Args) -> dict:
    args = fill_defaults(args)
    error = validate(args)
    ckpt = None
    if error is None and args.resume:
        try:
            ckpt = load_checkpoint(args.resume, args)
        except ValueError as err:
            error = str(err)
    if error:
        raise SystemExit(f"error: {error}")

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    saved = ckpt.get("state") if ckpt is not None and args.total_episodes > 0 else None
    if saved is not None and saved["device"] != device.type:  # the random generator's state is per device type
        where = saved["device"]
        raise SystemExit(f"error: --resume {args.resume!r} was written on {where}; pass --device {where}")
    if args.compile and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # the compiled step is fastest on one thread (docs/td_lambda_tetris.md, "Speed")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    env_name = args.env_id.split("/")[-1]
    act_name = "+".join(args.activation)
    run_name = base_name = f"{env_name}__{args.exp_name}__{args.network}-{act_name}__{args.seed}__{int(time.time())}"
    attempt = 1
    while os.path.exists(os.path.join("runs", run_name)):  # a run started in the same second gets its own directory
        attempt += 1
        run_name = f"{base_name}-{attempt}"
    run_dir = os.path.join("runs", run_name)
    os.makedirs(run_dir, exist_ok=True)
    if args.track:
        try:
            import wandb
        except ImportError:
            raise SystemExit("error: --track needs wandb; `pip install wandb` or drop --track") from None
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
        )
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
    )

    # --- runs: --num-runs per activation, activation i owning runs [i n, (i + 1) n) ---
    n = args.num_runs
    groups = [(act, i * n, (i + 1) * n) for i, act in enumerate(args.activation)]
    R = n * len(groups)

    def run_tag(r):
        return f"run{r}" if len(groups) == 1 else f"{args.activation[r // n]}/run{r % n}"

    # --- environment: the batched afterstate engine (the same rules as the Gymnasium env) ---
    height, width, piece_set = VARIANTS[ENV_VARIANTS[args.env_id]]
    shallow = args.network == "shallow"
    # The shallow agent needs every placement's heights and holes but only the chosen board: column bits suffice.
    engine = (ColumnEngine if shallow else AfterstateEngine)(height, width, piece_set, device=device)
    pieces_tensor = torch.tensor(piece_set, device=device)
    P = engine.num_placements
    rng = torch.Generator(device=device).manual_seed(args.seed)

    # --- network ---
    learner = None
    if shallow:
        F_ = binary_feature_length(height, width)
        init = [init_shallow(n, F_, args.hidden, args.seed, device) for _ in groups]  # run i from seed + i
        params = {k: torch.cat([p[k] for p in init]) for k in init[0]}

        def encode(after):  # Afterstates -> (R, P, 21) active input rows (20 features + the bias)
            return shallow_indices(after.heights, after.holes, height)

        empty_board = torch.zeros(width, dtype=torch.long, device=device)  # column bits
        empty_state = shallow_indices(empty_board, empty_board.sum(), height)
    else:
        params, base = init_deep(R, height, width, args.activation[0], args.seed, device)

        def encode(after):  # Afterstates -> (R, P, H, W) raw boards
            return after.boards

        def value(states):
            return deep_value(params, states, base)

        def value_and_grad(states):
            return deep_value_and_grad(params, states, base)

        empty_board = torch.zeros(height, width, dtype=torch.uint8, device=device)
        empty_state = empty_board

    episodes = torch.zeros(R, dtype=torch.long, device=device)  # i in eq. 15, per run
    if ckpt is not None:
        for k in params:
            params[k].copy_(ckpt["params"][k].to(device))
        episodes = ckpt["episodes"].to(device)
        print(f"loaded {args.resume} (episodes per run: {episodes.tolist()})")
    if shallow:
        learner = ShallowTD(params, groups)

        def value(states):
            return learner.values(states)[0]

        def current_params():
            return learner.parameters()
    else:
        eligibility = {k: torch.zeros_like(v) for k, v in params.items()}

        def current_params():
            return params

    num_params = sum(v[0].numel() for v in params.values())
    print(
        f"{run_name}: {n} run(s) each of a {args.network} {' / '.join(args.activation)} net ({num_params:,} parameters "
        f"each) on {args.env_id}, {P} placements per piece, device {device}, {torch.get_num_threads()} torch thread(s)"
    )

    def new_pieces():
        return pieces_tensor[torch.randint(len(piece_set), (R,), generator=rng, device=device)]

    # --- training: every run plays its own game; tensors carry the run dimension ---
    # Episode i of run r is stored at scores[r, i] (i counts from the first training segment, so a resumed run
    # continues its learning curve); `episodes` is both that counter and the i of eq. 15.
    start_episode = episodes.clone()
    target = torch.full_like(episodes, args.total_episodes)  # counted from the original start, as in every script
    capacity = max(args.total_episodes, int(episodes.max()), 1)
    scores = torch.zeros(R, capacity, device=device)  # score (rows cleared) of each finished episode
    lengths = torch.zeros(R, capacity, dtype=torch.long, device=device)  # placements of each finished episode
    if ckpt is not None:
        k = ckpt["scores"].shape[1]
        scores[:, :k], lengths[:, :k] = ckpt["scores"].to(device), ckpt["lengths"].to(device)
    boards = empty_board.expand(R, *empty_board.shape).clone()  # s_t: the current afterstate (empty at the start)
    states = empty_state.expand(R, *empty_state.shape).clone()  # its network input (input rows or board)
    holes_now = torch.zeros(R, dtype=torch.long, device=device)  # holes(s_t), for --reward-timing current
    pieces = new_pieces()
    score = torch.zeros(R, device=device)
    length = torch.zeros(R, dtype=torch.long, device=device)
    abs_td_sum = torch.zeros(R, device=device)
    abs_td_count = 0
    placements = 0
    t_start = time.time()
    t_log = t_checkpoint = t_start
    logged = start_episode.cpu().numpy().copy()  # finished episodes already written to tensorboard, per run
    active = episodes < target
    num_active = int(active.sum())
    interrupted = False
    summary = {"args": asdict(args), "run_name": run_name, "device": str(device), "num_parameters_per_run": num_params}
    summary["torch_threads"] = torch.get_num_threads()

    def write_outputs(complete: bool):
        """summary.json, episodes.npz, the learning curve and (with --save-model) the checkpoint, per activation: at
        the end and every --write-every-minutes, so a long run that is stopped keeps what it learned. A run whose
        parameters are no longer finite writes no checkpoint: the last good one stays."""
        elapsed = time.time() - t_start
        counts_all = episodes.cpu().numpy()
        sc_all, ln_all = scores.cpu().numpy(), lengths.cpu().numpy()
        theta = current_params()
        finite = all(bool(torch.isfinite(v).all()) for v in theta.values())
        if not finite:
            bad = sorted({int(r) for v in theta.values() for r in (~torch.isfinite(v)).reshape(R, -1).any(1).nonzero()})
            summary["diverged"] = f"non-finite parameters in run(s) {', '.join(run_tag(r) for r in bad)}"
        summary.update(
            complete=complete,
            global_step=placements,
            wall_time=elapsed,
            sps=placements / max(elapsed, 1e-9),
        )
        per_group = {}
        for act, a, b in groups:
            counts, sc, ln = counts_all[a:b], sc_all[a:b], ln_all[a:b]
            out_dir = run_dir if len(groups) == 1 else os.path.join(run_dir, act)
            os.makedirs(out_dir, exist_ok=True)
            info = {
                "activation": act,
                "episodes_per_run": counts.tolist(),
                "placements_per_run": [int(ln[r, : counts[r]].sum()) for r in range(b - a)],
                **score_summary(sc, counts, args.final_window),
                "paper_final_score": PAPER_FINAL_SCORES.get((args.env_id, args.network, act)),
            }
            per_group[act] = info
            np.savez_compressed(os.path.join(out_dir, "episodes.npz"), scores=sc, lengths=ln, episodes=counts)
            block = 1000 if counts.min() >= 1000 else max(int(counts.min()) // 10, 1)
            title = f"{args.env_id} {args.network} {act}, {b - a} run(s), {int(counts.min()):,} episodes"
            write_learning_curve(out_dir, sc, counts, block, title, info["paper_final_score"])
            if len(groups) > 1:
                with open(os.path.join(out_dir, "summary.json"), "w") as f:
                    json.dump({**summary, **info}, f, indent=2)
        if len(groups) == 1:
            summary.update(per_group[args.activation[0]])
        else:
            summary["per_activation"] = per_group
            write_combined_curve(run_dir, per_group, sc_all, counts_all, groups, args)
        if args.save_model and finite:
            path = os.path.join(run_dir, "td_lambda_tetris.pt")
            save_checkpoint(path, args, theta, episodes, scores, lengths, resume_state())
            summary["checkpoint"] = path
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)

    k = StepConstants(
        args.gamma, args.alpha, args.gamma * args.lam, args.tau0, args.tau_k, args.holes_scale, args.reward_timing,
        empty_board, empty_state, target, _bias_encoding_table(height, width, device) if shallow else None,
    )  # fmt: skip
    carry = dict(boards=boards, states=states, pieces=pieces, holes_now=holes_now, decay=torch.zeros(R, device=device))
    carry.update(score=score, length=length, active=active, placements=torch.zeros((), dtype=torch.long, device=device))
    carry.update(abs_td_sum=abs_td_sum, episodes=episodes, scores=scores, lengths=lengths)
    traces = {name: getattr(learner, name) for name in LEARNER_STATE} if shallow else eligibility
    if saved is not None:  # exactly where the run stopped: its traces, the games in progress and the generator
        for name, v in traces.items():
            v.copy_(saved["traces"][name])
        carry.update({name: v.to(device) for name, v in saved["games"].items()})
        rng.set_state(saved["rng"])

    def resume_state() -> dict:
        return {
            "traces": {name: v.detach().cpu().clone() for name, v in traces.items()},
            "games": {name: carry[name].cpu() for name in GAME_STATE},
            "rng": rng.get_state(),
            "device": device.type,
        }

    if shallow:
        step_fn = compiled_shallow_step() if args.compile else shallow_step

        def train_step(s, uniform, next_pieces):
            learner.decay_traces(s["decay"])  # the data-dependent fold, eagerly (theta unchanged)
            return step_fn(learner, engine, s, uniform, next_pieces, k)
    else:

        def train_step(s, uniform, next_pieces):
            after = engine(s["boards"], s["pieces"])  # every placement's afterstate f(s_t, a)
            v_t, grad_t = value_and_grad(s["states"])  # V(s_t), grad V(s_t) with the current theta_t
            v_cand = value(after.boards)
            action, game_over, holes_next, td_error, step = choose_and_td_error(s, after, v_t, v_cand, uniform, k)
            update_traces_and_params(params, eligibility, grad_t, s["decay"], step)
            return advance_games(s, after, after.boards, action, game_over, holes_next, td_error, next_pieces, k)

    video = None
    if args.capture_video:  # the first run of each activation
        tags = {a: run_tag(a).replace("/", "-") for _, a, _ in groups}
        video = TetrisVideo(os.path.join(run_dir, "videos"), tags, episodes, height, columns=shallow)
        video.add(carry["boards"], episodes, carry["active"])
    with stop_signals() as stopped:
        while num_active and not stopped():
            uniform = torch.rand(R, P + 1, generator=rng, device=device)
            carry = train_step(carry, uniform, new_pieces())
            if video is not None:
                video.add(carry["boards"], episodes, carry["active"])
            abs_td_count += 1
            if abs_td_count % 16 == 0:  # the loop's only host sync (a run that finished idles along until then)
                num_active = int(carry["active"].sum())
            abs_td_sum = carry["abs_td_sum"]

            now = time.time()
            if now - t_log >= args.log_every_seconds or not num_active:
                done = episodes.cpu().numpy()
                sc, ln = scores.cpu().numpy(), lengths.cpu().numpy()
                placements = int(carry["placements"])
                tau = temperature(episodes.float(), args.tau0, args.tau_k)
                sps = placements / (now - t_start)
                steps_per_second = abs_td_count / max(now - t_log, 1e-9)  # loop steps since the last line
                if not bool(torch.isfinite(abs_td_sum).all()):
                    bad = (~torch.isfinite(abs_td_sum)).nonzero().flatten().tolist()
                    summary["diverged"] = f"non-finite TD error in run(s) {', '.join(run_tag(r) for r in bad)}"
                    break
                for r in range(R):
                    tag = run_tag(r)
                    for ep in range(logged[r], done[r]):
                        writer.add_scalar(f"{tag}/episode_score", sc[r, ep], ep)
                        if (ep + 1) % 1000 == 0:
                            writer.add_scalar(f"{tag}/mean_score_1000", sc[r, ep - 999 : ep + 1].mean(), ep + 1)
                    writer.add_scalar(f"{tag}/temperature", float(tau[r]), int(done[r]))
                    writer.add_scalar(f"{tag}/abs_td_error", float(abs_td_sum[r]) / max(abs_td_count, 1), int(done[r]))
                logged = done.copy()
                abs_td_sum.zero_()
                abs_td_count = 0
                writer.add_scalar("charts/placements_per_second", sps, placements)
                recent = [
                    f"{act} {np.mean([sc[r, max(0, done[r] - 1000) : done[r]].mean() for r in range(a_, b_)]):.2f}"
                    if done[a_:b_].min() > 0
                    else f"{act} -"
                    for act, a_, b_ in groups
                ]
                progress = int(done.min())
                eta = eta_text(*eta_seconds(ln, done, args.total_episodes, steps_per_second))
                print(
                    f"episodes {int(progress):,}/{args.total_episodes:,} (slowest run) | placements {placements:,} | "
                    f"{sps:,.0f} placements/s | mean score, last 1000 ep.: {', '.join(recent)} | "
                    f"tau {float(tau.mean()):.4f} | {eta}",
                    flush=True,
                )
                t_log = now
                if now - t_checkpoint >= 60 * args.write_every_minutes:
                    write_outputs(complete=False)
                    t_checkpoint = now
                    if "diverged" in summary:
                        break
        interrupted = stopped() and bool(num_active)  # a signal after the last episode changes nothing
    if interrupted:
        print("interrupted: writing the summary, the learning curve and (with --save-model) the checkpoint")
    if video is not None:
        video.close()
    placements = int(carry["placements"])

    if args.total_episodes > 0:
        write_outputs(complete=not interrupted and "diverged" not in summary)
        if "diverged" in summary:
            writer.close()
            kept = f"; the last good checkpoint is {summary['checkpoint']}" if "checkpoint" in summary else ""
            raise SystemExit(f"error: {summary['diverged']}: training stopped (summary.json written{kept})")
        for r in range(R):
            group = summary["per_activation"][args.activation[r // n]] if len(groups) > 1 else summary
            writer.add_scalar(f"{run_tag(r)}/final_score", group["final_score_per_run"][r % n], int(episodes[r]))
        for act, info in (summary.get("per_activation") or {args.activation[0]: summary}).items():
            print(
                f"{act}: final mean score over the last {info['final_window']} episodes: "
                f"{info['final_score_mean']:.2f} ± {info['final_score_sd_episodes']:.2f} (sd of the episode scores; "
                f"sd over runs {info['final_score_std_over_runs']:.2f}; runs: "
                f"{', '.join(f'{v:.1f}' for v in info['final_score_per_run'])}); paper: {info['paper_final_score']}"
            )
        if args.save_model:
            print(f"saved {summary['checkpoint']}")
    else:
        summary.update(global_step=0, wall_time=0.0, sps=0.0)
        counts = episodes.cpu().numpy()
        summary.update(score_summary(scores.cpu().numpy(), counts, args.final_window) if counts.min() > 0 else {})
        if args.save_model:
            summary["checkpoint"] = os.path.join(run_dir, "td_lambda_tetris.pt")
            save_checkpoint(summary["checkpoint"], args, current_params(), episodes, scores, lengths)

    # --- evaluation without learning: Table 3 and the value analysis of §4.1, on --eval-run's runs ---
    if args.eval_episodes > 0:
        if args.eval_run == "all":
            ids = list(range(R))
        elif args.eval_run == "best":
            counts = episodes.cpu().numpy()
            if counts.min() == 0:
                raise SystemExit("error: --eval-run best needs trained runs (a checkpoint with finished episodes)")
            ids = [score_summary(scores.cpu().numpy(), counts, args.final_window)["final_score_best_run_index"]]
        else:
            ids = [int(args.eval_run)]
        summary["eval_runs"] = ids
        games = max(1, EVAL_GAMES // len(ids))  # parallel games per evaluated run, each on its own copy of theta
        copies = torch.tensor(ids, device=device).repeat_interleave(games)
        theta = {k: v[copies].clone() for k, v in current_params().items()}
        if shallow:
            eval_learner = ShallowTD(theta, [(args.activation[0], 0, len(copies))])

            def eval_value(states):
                return eval_learner.values(states)[0]
        else:

            def eval_value(states):
                return deep_value(theta, states, base)

        final_tau = float(temperature(episodes[ids].float(), args.tau0, args.tau_k).mean())
        summary["eval"] = {}
        value_episodes = []
        for k, rule in enumerate(args.eval_selections):
            kind, x = parse_selection(rule, final_tau)
            result = evaluate(
                args,
                engine,
                encode,
                eval_value,
                kind,
                x,
                len(ids),
                device,
                empty_board,
                empty_state,
                pieces_tensor,
                collect_values=(k == 0) * args.value_analysis_episodes,
                games=games,
            )
            values_collected = result.pop("value_episodes")
            if k == 0:
                value_episodes = values_collected
            summary["eval"][f"{kind}:{x:g}"] = result
            print(
                f"eval {kind} {x:g} (run(s) {', '.join(map(str, ids))}): mean score {result['mean_score']:.2f} over "
                f"{result['episodes']} episodes, {result['exploratory_actions_per_episode']:.2f} exploratory actions "
                "per episode"
            )
        if value_episodes:
            summary["value_analysis"] = write_value_analysis(run_dir, value_episodes, args.gamma)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    writer.close()
    if args.track:
        wandb.finish()
    return summary


EVAL_GAMES = 64  # games played at once in evaluation, split over the evaluated runs (one run alone plays 64)


@torch.no_grad()
def evaluate(
    args, engine, encode, value, kind, x, R, device, empty_board, empty_state, pieces_tensor, collect_values=0, games=1
):
    """Play args.eval_episodes episodes per run without learning, with softmax at tau = x or epsilon-greedy with
    epsilon = x. Returns mean score and exploratory actions per episode (Table 3); records V(s_t) and the reward of
    delta_t along each run's first ceil(collect_values / R) complete episodes for the value analysis (§4.1).

    Each run plays `games` games at once (`value` holds `games` copies of each run's theta, run-major), each game a
    fixed number of complete episodes, ceil(eval_episodes / games); a run's episodes are its games' episodes in
    order, cut at eval_episodes. Whole episodes by index, never the first to finish, so neither the scores nor the
    value-analysis sample favour the short episodes that finish first."""
    G = R * games  # games in parallel; game g belongs to run g // games
    per_game = -(-args.eval_episodes // games)
    rng = torch.Generator(device=device).manual_seed(args.seed + 10_000)
    slots = torch.arange(G, device=device)
    boards = empty_board.expand(G, *empty_board.shape).clone()
    states = empty_state.expand(G, *empty_state.shape).clone()
    pieces = pieces_tensor[torch.randint(len(pieces_tensor), (G,), generator=rng, device=device)]
    tau = torch.full((G,), x if kind == "softmax" else 1.0, device=device)
    score = torch.zeros(G, device=device)
    explore = torch.zeros(G, device=device)
    done = np.zeros(G, dtype=np.int64)
    game_score, game_explore = [[] for _ in range(G)], [[] for _ in range(G)]
    traj = [([], []) for _ in range(G)]
    value_episodes = []
    quota = min(-(-collect_values // R), args.eval_episodes)  # value-analysis episodes per run
    quota_per_game = -(-quota // games)
    holes_now = torch.zeros(G, dtype=torch.long, device=device)
    while done.min() < per_game:
        v_t = value(states[:, None])[:, 0] if collect_values else None
        after = engine(boards, pieces)
        cand_states = encode(after)
        v_cand = value(cand_states).masked_fill(after.game_over, 0.0)
        uniform = torch.rand(G, engine.num_placements + 1, generator=rng, device=device)
        action, exploratory = select_placement(
            v_cand, tau, after.valid, uniform, epsilon=x if kind == "epsilon" else None
        )
        game_over = after.game_over[slots, action]
        score += after.rows_cleared[slots, action]
        explore += exploratory
        holes_next = after.holes[slots, action]
        if collect_values:
            reward = td_reward(holes_next, game_over, holes_now, args.holes_scale, args.reward_timing)
            v_np, reward_np = v_t.cpu().numpy(), reward.cpu().numpy()
            for g in np.flatnonzero(done < quota_per_game):
                traj[g][0].append(float(v_np[g]))
                traj[g][1].append(float(reward_np[g]))
        go = game_over.cpu().numpy()
        for g in np.flatnonzero(go):
            if done[g] < per_game:
                game_score[g].append(float(score[g]))
                game_explore[g].append(float(explore[g]))
                if done[g] < quota_per_game:
                    value_episodes.append((g // games, g, int(done[g]), traj[g][0], traj[g][1]))
            done[g] += 1
            traj[g] = ([], [])
        over = game_over.view(-1, *[1] * (boards.dim() - 1))
        boards = torch.where(over, empty_board, after.boards[slots, action])
        states = torch.where(game_over.view(-1, *[1] * (states.dim() - 1)), empty_state, cand_states[slots, action])
        holes_now = holes_next.masked_fill(game_over, 0)
        score.masked_fill_(game_over, 0)
        explore.masked_fill_(game_over, 0)
        pieces = pieces_tensor[torch.randint(len(pieces_tensor), (G,), generator=rng, device=device)]

    def by_run(per_game_lists, r):  # run r's episodes: its games' episodes in order, cut at eval_episodes
        return [v for g in range(r * games, (r + 1) * games) for v in per_game_lists[g]][: args.eval_episodes]

    per_run = [float(np.mean(by_run(game_score, r))) for r in range(R)]
    # the value-analysis sample: each run's first `quota` episodes in the same order (game, then episode)
    kept, taken = [], np.zeros(R, dtype=np.int64)
    for run, _, _, values, rewards in sorted(value_episodes, key=lambda e: e[:3]):
        if taken[run] < quota:
            kept.append((int(run), values, rewards))
            taken[run] += 1
    return {
        "episodes": int(args.eval_episodes * R),
        "mean_score": float(np.mean(per_run)),
        "mean_score_per_run": per_run,
        "exploratory_actions_per_episode": float(np.mean([np.mean(by_run(game_explore, r)) for r in range(R)])),
        "value_episodes": kept,
    }


if __name__ == "__main__":
    main(tyro.cli(Args))
