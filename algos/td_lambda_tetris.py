"""TD(lambda) with softmax afterstate selection on stochastic SZ-Tetris and 10x10 Tetris.

Elfwing, Uchibe & Doya (2018), "Sigmoid-weighted linear units for neural network function approximation in
reinforcement learning", §2.1-2.3 and §3.1-3.2. V(s) is learned on afterstates (the board after the drop and the row
clears), on-policy and online:

    delta_t = r_t + gamma V(s_{t+1}) - V(s_t)                             (eq. 2)
    e_t     = gamma lambda e_{t-1} + grad_theta V(s_t),  e_0 = 0           (eq. 4, accumulating traces)
    theta  <- theta + alpha delta_t e_t                                    (eq. 1)
    pi(a|s) = exp(V(f(s, a)) / tau) / sum_b exp(V(f(s, b)) / tau)          (eq. 14)
    tau(i)  = tau0 / (1 + tau_k i), i = episode number                    (eq. 15)
    r(s)    = exp(-holes(s) / 33) on SZ-Tetris, exp(-holes(s) / 16.5) on 10x10 (eq. 16, 17)

`shallow`: 460 (260 on 10x10) binary features -> hidden units (SiLU, dSiLU, ReLU or sigmoid) -> linear output;
`deep`: raw board -> conv 15 5x5 -> max-pool -> conv 50 5x5 -> max-pool -> fc 250 -> linear output (§3.1).
`--num-runs N` trains N independent agents per activation as one batched computation (a leading run dimension).
Where the paper is silent (binary encoding, game over, padding, initialisation, reward timing) the code marks our
choice; the docs page lists them. Table 3 and Fig. 6 (no learning) are benchmark/tetris_eval.py, which imports this.

    python algos/td_lambda_tetris.py --activation dsilu sigmoid silu relu --num-runs 10 --compile   # Table 1
    python algos/td_lambda_tetris.py --env-id envs/Tetris10x10-v0 --num-runs 5 --compile            # Fig. 4
"""

import contextlib
import copy
import functools
import importlib.util
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
import tyro
from torch import nn
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from envs import code_version, damaged_member, tetris  # noqa: E402

PAPER_FINAL_SCORES = {  # Table 1 (SZ-Tetris, final 1,000 episodes: shallow, then deep) and §3.2 (10x10, final 10,000)
    **{("envs/SZTetris-v0", a): v for a, v in dict(silu=214, relu=191, dsilu=263, sigmoid=232).items()},
    **{("envs/SZTetris-v0", a): v for a, v in {"silu-silu": 217, "relu-relu": 215, "silu-dsilu": 229}.items()},
    ("envs/Tetris10x10-v0", "dsilu"): 4900,
}
SHALLOW_ACTIVATIONS = ("silu", "dsilu", "relu", "sigmoid")
DEEP_ACTIVATIONS = ("silu-dsilu", "silu-silu", "relu-relu")
CHECKPOINT_FORMAT = "td_lambda_tetris/1"
GAME_STATE = ("boards", "states", "pieces", "holes_now", "decay", "score", "length")  # the checkpoint's games


@dataclass
class Args:
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
    """save runs/{run_name}/td_lambda_tetris.pt (all --resume needs) at the end and every --write-every-minutes"""
    resume: str | None = None
    """checkpoint to continue exactly where it stopped; --total-episodes counts from the original start"""
    log_every_seconds: float = 10.0
    """how often the progress line is printed and the tensorboard scalars are written"""
    write_every_minutes: float = 10.0
    """how often summary.json, the learning curves and (with --save-model) the checkpoint are rewritten (checked at
    each progress line, after its finiteness check, so at most as often as --log-every-seconds)"""
    capture_video: bool = False
    """mp4s of each activation's first run in runs/{run_name}/videos/, one frame per placement, for its episodes 0, 1,
    8, 27, ..., 729, 1000, 2000, ... (at most 2,000 placements each; needs moviepy)"""

    env_id: str = "envs/SZTetris-v0"
    """envs/SZTetris-v0 (§3.1), envs/Tetris10x10-v0 (§3.2) or envs/Tetris-v0 (10x20, seven pieces)"""
    total_episodes: int | None = None
    """training episodes per run (default: 200,000 on SZ-Tetris, 400,000 on the seven-piece variants)"""
    num_runs: int = 1
    """independent runs per activation, batched (the paper: 10 per shallow activation, 5 per deep one and on 10x10)"""
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
    reward_timing: Literal["next", "current"] = "current"
    """the reward in delta_t: 'current' = r(s_t), the paper's r_t (results/tetris_reward_timing); 'next' = r(s_{t+1})"""
    network: Literal["shallow", "deep"] = "shallow"
    """shallow: binary features -> hidden -> linear; deep: raw board -> 2 conv + pool -> fc 250 -> linear"""
    activation: tuple[str, ...] | None = None
    """shallow: silu | dsilu | relu | sigmoid (default dsilu), several at once for Table 1's rows in one process;
    deep: one of silu-dsilu | silu-silu | relu-relu (conv - fully connected; default silu-dsilu)"""
    hidden: int | None = None
    """hidden units of the shallow net (default: 50 on SZ-Tetris, 250 on the seven-piece variants)"""
    compile: bool = False
    """shallow net: the step as two compiled inductor graphs (needs a C compiler; 10-40 s at the start; falls back
    to eager with a warning). One torch thread unless OMP_NUM_THREADS says otherwise (the fastest on CPU)"""
    final_window: int | None = None
    """episodes behind the final score (default: 1,000 on SZ-Tetris as Table 1, 10,000 on the seven-piece variants)"""


def fill_defaults(args: Args) -> Args:
    """The paper's defaults per experiment for the fields left at None (§3.1, §3.2; eq. 17 halves holes_scale)."""
    sz, deep = args.env_id == "envs/SZTetris-v0", args.network == "deep"
    height = tetris.VARIANTS[tetris.ENV_VARIANTS[args.env_id]][0] if args.env_id in tetris.ENV_VARIANTS else 20
    defaults = dict(
        activation=("silu-dsilu",) if deep else ("dsilu",),
        total_episodes=200_000 if sz else 400_000,
        alpha=0.0001 if deep else 0.001,
        hidden=50 if sz else 250,
        final_window=1000 if sz else 10_000,
        holes_scale=33.0 * height / 20,
    )
    if deep:  # --hidden is the shallow net's width; the deep net's layers are fixed (§3.2)
        del defaults["hidden"]
    vars(args).update({name: value for name, value in defaults.items() if getattr(args, name) is None})
    args.activation = (args.activation,) if isinstance(args.activation, str) else tuple(args.activation)
    return args


def validate(args: Args) -> str | None:
    """One clear line for each impossible setting, checked before anything is written."""
    if args.env_id not in tetris.ENV_VARIANTS:
        return f"unknown --env-id {args.env_id!r}; choose one of {', '.join(tetris.ENV_VARIANTS)}"
    allowed = SHALLOW_ACTIVATIONS if args.network == "shallow" else DEEP_ACTIVATIONS
    if (act := next((a for a in args.activation if a not in allowed), None)) is not None:
        return f"--activation {act!r} is not defined for --network {args.network}; choose one of {allowed}"
    if len(set(args.activation)) != len(args.activation):
        return f"--activation lists a value twice: {' '.join(args.activation)}"
    if len(args.activation) > 1 and args.network != "shallow":
        return "several --activation values need --network shallow (the deep variants run one per process)"
    for name in ("alpha", "gamma", "lam", "tau0", "tau_k", "holes_scale"):
        if not math.isfinite(getattr(args, name)):
            return f"--{name.replace('_', '-')} must be a finite number, got {getattr(args, name)}"
    if args.tau0 <= 0 or args.tau_k < 0 or args.holes_scale <= 0:
        return "--tau0 and --holes-scale must be positive and --tau-k non-negative"
    if args.num_runs < 1 or args.total_episodes < 1:
        return "--num-runs and --total-episodes must be at least 1 (benchmark/tetris_eval.py evaluates a checkpoint)"
    if args.network == "deep" and (args.hidden is not None or args.compile):
        return "--hidden and --compile apply to --network shallow only (the deep net's layers are fixed, run eagerly)"
    if (args.hidden is not None and args.hidden < 1) or args.alpha <= 0 or args.final_window < 1:
        return "--hidden, --alpha and --final-window must be positive"
    if not (0 <= args.gamma <= 1 and 0 <= args.lam <= 1):
        return "--gamma and --lam must lie in [0, 1]"
    if args.device != "auto" and args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto"
    if args.capture_video and importlib.util.find_spec("moviepy") is None:
        return "--capture-video needs moviepy; `pip install moviepy` or drop --capture-video"
    return None


# --- Activations (§2.2) -----------------------------------------------------------------------------------------------
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


ACTIVATIONS = {"silu": silu, "dsilu": dsilu, "relu": torch.relu, "sigmoid": torch.sigmoid}
DERIVATIVES = {  # da/dz for the shallow net's hand-derived gradient (eq. 11 for the SiLU, eq. 12 for the dSiLU)
    "silu": dsilu,
    "dsilu": dsilu_derivative,
    "relu": lambda z: (z > 0).to(z.dtype),
    "sigmoid": lambda z: torch.sigmoid(z) * (1 - torch.sigmoid(z)),
}


def activation_and_derivative(name: str, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a(z) and da/dz of the activation `name`."""
    return ACTIVATIONS[name](z), DERIVATIVES[name](z)


# --- The shallow network, batched over runs: lazily scaled traces, one fused forward, a hand-derived gradient ---------
def init_shallow(num_runs: int, num_features: int, hidden: int, seed: int, device) -> dict[str, torch.Tensor]:
    """Parameters (leading run dimension). The paper gives no initialisation; our choice is PyTorch's nn.Linear
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


def shallow_indices(heights: torch.Tensor, n_holes: torch.Tensor, height: int, table=None) -> torch.Tensor:
    """(..., W) heights and (...) holes -> (..., 2W + 1) active rows of the binary input (our choice of encoding:
    `tetris.binary_feature_indices`) and row F, the bias b1 as an always-active input; `table`: the encoding's."""
    width = heights.shape[-1]
    lo, hi, offset = _bias_encoding_table(height, width, heights.device) if table is None else table
    bias = torch.zeros_like(n_holes)[..., None]
    feats = torch.cat([heights, heights[..., 1:] - heights[..., :-1], n_holes[..., None], bias], -1)
    return torch.maximum(torch.minimum(feats, hi), lo) + offset


@functools.lru_cache(maxsize=16)
def _bias_encoding_table(height, width, device):
    lo, hi, offset = tetris._encoding_table(height, width, device)
    extra = torch.tensor([[0], [0], [tetris.binary_feature_length(height, width)]], device=device)
    return torch.cat([torch.stack([lo, hi, offset]), extra], -1)


class ShallowTD:
    """The shallow net and its TD(lambda) update for R runs, with the traces held lazily so a step touches only the
    21 active rows of W1 (eq. 1, 4, 7, 11, 12; tested step by step against the dense `update_traces_and_params`).

    W = [W1; b1] (F + 1 rows, the bias as an always-active input). Per run, e_W = c E and theta_W = U + A E, c and A
    scalars:
        e <- d e + g       is  c <- d c;  E[rows] += g / c;  U[rows] -= A g / c    (theta unchanged)
        theta <- theta + s e   is  A <- A + s c                                    (s = alpha delta)
    When c falls below `fold_below` (every ~11 steps at gamma lambda = 0.5445) or an episode starts (d = 0), the run
    is folded back: U <- U + A E, E <- c E, A <- 0, c <- 1 (one dense pass over that run only). U and E sit side by
    side in one table, so one embedding_bag gives z = U-sum + A E-sum for every candidate and the current state.
    [w2, b2] and their trace are small and stay dense.
    """

    STATE = ("table", "v", "ev", "c", "A")  # what the fold and the update change: the checkpoint's "traces"

    def __init__(self, params: dict, groups: list[tuple[str, int, int]], fold_below: float = 1e-3):
        W1, b1, w2, b2 = params["W1"], params["b1"], params["w2"], params["b2"]
        R, F_, Hd = W1.shape
        self.R, self.F, self.Hd, self.groups, self.fold_below = R, F_, Hd, groups, fold_below
        self.table = W1.new_zeros(R, F_ + 1, 2 * Hd)  # [U | E] per run
        self.table[:, :F_, :Hd], self.table[:, F_, :Hd] = W1, b1
        self.v = torch.cat([w2, b2[:, None]], -1)  # (R, Hd + 1) = [w2, b2]
        self.ev = torch.zeros_like(self.v)  # its trace
        self.c, self.A = W1.new_ones(R), W1.new_zeros(R)
        self.row_offsets = (torch.arange(R, device=W1.device) * (F_ + 1)).view(R, 1, 1)
        self.U_run, self.E_run = self.table[..., :Hd].unbind(0), self.table[..., Hd:].unbind(0)  # views for the fold

    def _by_group(self, fn: dict, z):
        if len(self.groups) == 1:
            return fn[self.groups[0][0]](z)
        return torch.cat([fn[name](z[a:b]) for name, a, b in self.groups])

    def values(self, idx: torch.Tensor):
        """idx (R, N, 21) -> V (R, N), z (R, N, Hd), a(z) (R, N, Hd), all with the current theta."""
        (R, N, K), Hd = idx.shape, self.Hd
        bag = F.embedding_bag((idx + self.row_offsets).view(R * N, K), self.table.view(-1, 2 * Hd), mode="sum")
        bag = bag.view(R, N, 2 * Hd)
        z = torch.addcmul(bag[..., :Hd], bag[..., Hd:], self.A.view(R, 1, 1))  # eq. 7
        a = self._by_group(ACTIVATIONS, z)
        value = torch.baddbmm(self.v[:, None, Hd:], a, self.v[:, :Hd, None]).squeeze(-1)  # b2 + sum_k w2_k a_k
        return value, z, a

    def decay_traces(self, decay: torch.Tensor, on_host: bool | None = None):
        """The W trace's part of e <- decay e (eq. 4): c <- decay c, then fold the runs whose c fell below
        `fold_below` (an episode start, decay = 0, always folds). Theta is unchanged, so this may run any time between
        the forward pass and `accumulate`; data-dependent, so the compiled step leaves it outside. On a CPU (on_host)
        through numpy views of c and A (no tensor op but the folds), elsewhere with tensor ops: the same arithmetic."""
        on_host = self.c.device.type == "cpu" if on_host is None else on_host
        c, A = (self.c.numpy(), self.A.numpy()) if on_host else (self.c, self.A)
        c *= decay.numpy() if on_host else decay
        runs = np.flatnonzero(c < self.fold_below) if on_host else (c < self.fold_below).nonzero().flatten()
        if len(runs):  # a few runs per step
            for r, A_r, c_r in zip(runs.tolist(), A[runs].tolist(), c[runs].tolist(), strict=True):
                self.U_run[r].add_(self.E_run[r], alpha=A_r)  # U <- U + A E
                self.E_run[r].mul_(c_r)  # E <- c E
            c[runs], A[runs] = 1.0, 0.0

    def accumulate(self, idx_t: torch.Tensor, z_t: torch.Tensor, a_t: torch.Tensor, decay: torch.Tensor, step):
        """The rest of the update once `decay_traces(decay)` has run: e += grad V(s_t), theta += step e. In place and
        branch-free (the compiled step's part of the update)."""
        Hd, c = self.Hd, self.c
        g = self.v[:, :Hd] * self._by_group(DERIVATIVES, z_t) / c[:, None]  # dV/dz_k = w2_k a'(z_k) (eq. 11, 12) / c
        values = torch.cat([g * -self.A[:, None], g], -1)  # (R, 2 Hd): U -= A g / c, E += g / c
        values = values[:, None, :].expand(self.R, idx_t.shape[-1], 2 * Hd).reshape(-1, 2 * Hd)  # each active row
        self.table.view(-1, 2 * Hd).index_add_(0, (idx_t + self.row_offsets[:, 0]).view(-1), values)
        self.ev.mul_(decay[:, None])
        self.ev[:, :Hd] += a_t
        self.ev[:, Hd] += 1.0
        self.A += step * c
        self.v.addcmul_(self.ev, step[:, None])

    def parameters(self) -> dict[str, torch.Tensor]:
        """theta as init_shallow's dict: W1 (R, F, Hd), b1 (R, Hd), w2 (R, Hd), b2 (R,)."""
        W = torch.addcmul(self.table[..., : self.Hd], self.table[..., self.Hd :], self.A.view(-1, 1, 1))
        return {"W1": W[:, : self.F], "b1": W[:, self.F], "w2": self.v[:, : self.Hd], "b2": self.v[:, self.Hd]}


# --- The deep network on the raw board (§3.1), batched over runs with torch.func --------------------------------------
def same_pad(size: int, kernel: int = 3, stride: int = 2) -> tuple[int, int]:
    """TensorFlow 'SAME' padding (before, after): output ceil(size / stride), the odd pixel after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def same_max_pool(x: torch.Tensor) -> torch.Tensor:
    """3x3 max-pooling with stride 2 and TensorFlow's 'SAME' padding (`same_pad`, -inf in the padding), output
    ceil(n/2): 20x10 -> 10x5 -> 5x3."""
    (top, bottom), (left, right) = same_pad(x.shape[-2]), same_pad(x.shape[-1])
    return F.max_pool2d(F.pad(x, (left, right, top, bottom), value=float("-inf")), 3, 2)


class DeepValueNet(nn.Module):
    """conv 15 5x5 -> max-pool 3x3/2 -> conv 50 5x5 -> max-pool 3x3/2 -> fc 250 -> linear (§3.1); "silu-dsilu" = SiLU
    in the conv layers, dSiLU in fc. Padding (the paper gives none) is our choice: 'same', 20x10 -> 10x5 -> 5x3."""

    def __init__(self, height: int, width: int, activation: str):
        super().__init__()
        conv_act, fc_act = activation.split("-")
        self.conv_act, self.fc_act = ACTIVATIONS[conv_act], ACTIVATIONS[fc_act]
        self.conv1, self.conv2 = nn.Conv2d(1, 15, 5, padding=2), nn.Conv2d(15, 50, 5, padding=2)
        h, w = (height + 3) // 4, (width + 3) // 4  # ceil(ceil(n/2)/2)
        self.fc, self.out = nn.Linear(50 * h * w, 250), nn.Linear(250, 1)

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

    grads, value = vmap(grad_and_value(lambda p, x: functional_call(base, p, (x[None],))[0]))(params, boards)
    return value, grads


# --- Selection (eq. 14, 15) and the dense TD(lambda) update (eq. 1, 4; the deep network's) ----------------------------
def temperature(episode: torch.Tensor, tau0: float, tau_k: float) -> torch.Tensor:
    """Hyperbolic annealing, eq. 15: tau(i) = tau0 / (1 + tau_k i)."""
    return tau0 / (1 + tau_k * episode)


def select_placement(values, tau, valid, uniform):
    """Softmax selection (eq. 14) by the Gumbel-max trick: argmax_a V(f(s, a)) / tau - log(-log u_a) over the valid
    placements. values (R, P), tau (R,), uniform (R, P + 1) pre-drawn U(0, 1) (the last column: Table 3's epsilon)."""
    P = values.shape[-1]
    gumbel = -torch.log(-torch.log(uniform[:, :P].clamp(1e-20, 1 - 1e-7)))
    return ((values / tau[:, None]).masked_fill(~valid, float("-inf")) + gumbel).argmax(-1)


def update_traces_and_params(params, eligibility, grads, decay, step):
    """The deep net's update, eq. 4 then eq. 1 per run r: e_r <- decay_r e_r + grad V(s_t) (decay_r = gamma lambda, 0 on
    an episode's first step), then theta_r <- theta_r + step_r e_r (step_r = alpha delta_t, 0 once the run is done)."""
    for name, theta in params.items():
        e = eligibility[name]
        shape = (-1,) + (1,) * (e.dim() - 1)
        e.mul_(decay.view(shape)).add_(grads[name])
        theta.addcmul_(e, step.view(shape))


# --- One training step of every run (eq. 1, 2, 4, 14-17), and --compile's graphs of the shallow one -------------------
class StepConstants(NamedTuple):  # what every step reads and no step changes
    gamma: float
    alpha: float
    gamma_lambda: float
    tau0: float
    tau_k: float
    holes_scale: float
    reward_timing: str
    empty_board: torch.Tensor  # a run whose game ends restarts from these (choice: the episode's first state)
    empty_state: torch.Tensor
    target: torch.Tensor  # (R,) episodes each run trains for
    encoding: torch.Tensor | None = None  # the shallow net's _bias_encoding_table


def td_reward(holes_next, game_over, holes_current, holes_scale: float, timing: str) -> torch.Tensor:
    """The r in delta_t = r + gamma V(s_{t+1}) - V(s_t), r(s) = exp(-holes(s) / holes_scale) (eq. 16, 17), on which
    afterstate is our choice: 'current' (default), r(s_t), the paper's r_t read literally (a terminal move still earns
    it); 'next', r(s_{t+1}), the afterstate moved into, 0 when the move ends the game."""
    if timing == "current":
        return torch.exp(-holes_current.float() / holes_scale)
    return torch.exp(-holes_next.float() / holes_scale).masked_fill(game_over, 0.0)


def choose_and_td_error(s: dict, after, v_t, v_cand, uniform, k: StepConstants):
    """Softmax selection (eq. 14) at tau(i) (eq. 15) by Gumbel-max on the pre-drawn `uniform`, the reward (eq. 16, 17)
    and delta_t (eq. 2). Placements where the piece does not fit stay in the softmax as terminal, V = 0 (our choice).
    Returns action, game_over, holes(s_{t+1}), delta_t and alpha delta_t (0 for finished runs)."""
    runs = torch.arange(len(v_t), device=v_t.device)
    v_cand = v_cand.masked_fill(after.game_over, 0.0)
    tau = temperature(s["episodes"].float(), k.tau0, k.tau_k)
    action = select_placement(v_cand, tau, after.valid, uniform)
    game_over = after.game_over[runs, action]
    holes_next = after.holes[runs, action]
    reward = td_reward(holes_next, game_over, s["holes_now"], k.holes_scale, k.reward_timing)
    td_error = reward + k.gamma * v_cand[runs, action] - v_t  # eq. 2 (V(s_{t+1}) = 0 when terminal)
    return action, game_over, holes_next, td_error, k.alpha * td_error * s["active"]


def advance_games(s: dict, after, cand_states, action, game_over, holes_next, td_error, next_pieces, k: StepConstants):
    """Every run to s_{t+1} = f(s_t, a_t); a finished game is recorded (runs still learning only) and restarts from the
    empty board with e = 0 (decay 0). Returns the new carry; `episodes`, `scores`, `lengths` are updated in place."""
    runs = torch.arange(len(action), device=action.device)
    active, episodes, scores, lengths = s["active"], s["episodes"], s["scores"], s["lengths"]
    score = s["score"] + after.rows_cleared[runs, action]
    length = s["length"] + 1
    placements = s["placements"] + active.sum()  # pieces placed by runs still learning (finished runs idle along)
    abs_td_sum = s["abs_td_sum"] + td_error.abs() * active
    boards = torch.where(game_over.view(-1, *[1] * (k.empty_board.dim())), k.empty_board, after.boards[runs, action])
    states = torch.where(game_over.view(-1, *[1] * (k.empty_state.dim())), k.empty_state, cand_states[runs, action])
    holes_now = holes_next.masked_fill(game_over, 0)
    # Eagerly only when some game ended; compiled always (branch-free: record is False elsewhere).
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
    return s | dict(
        boards=boards,
        states=states,
        pieces=next_pieces,
        holes_now=holes_now,
        decay=decay,
        score=score,
        length=length,
        active=active,
        placements=placements,
        abs_td_sum=abs_td_sum,
    )


def shallow_step(learner: ShallowTD, engine: tetris.ColumnEngine, s: dict, uniform, next_pieces, k: StepConstants):
    """One placement of every run: every afterstate, V(s_t) and every V(f(s_t, a)) in one forward with theta_t,
    selection, delta_t, e += grad V(s_t), theta += alpha delta_t e (eq. 1, 2, 4, 14), the games advance (the carry s:
    see main). `learner.decay_traces(s["decay"])` must run first."""
    after, cand_states = shallow_afterstates(engine, s, k)
    return shallow_learn(learner, engine, s, after, cand_states, uniform, next_pieces, k)


def shallow_afterstates(engine: tetris.ColumnEngine, s: dict, k: StepConstants):
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


# Why not torch.compile: its public route (fullgraph=True, dynamic=False, all guards skipped by guard_filter_fn) of
# these two halves plays bit-identical games but ran at 0.84-0.87x these placements/s at 40 runs, 0.75-0.79x at 10
# (one thread, compilation included; ~50 us per call in dynamo's entry): results/tetris_speed/compile_route.
def compile_graph(fn, example_args: list[torch.Tensor], options: dict):
    """fn(*tensors) -> tuple of tensors, traced once (make_fx on fake tensors), compiled by inductor into one graph and
    called directly: no guard or cache lookup per call, so the inputs must keep the example's shapes, dtypes and
    devices; closure tensors are baked in; in-place updates stay in place. The trace raises torch.compile's flag, so
    torch.compiler.is_compiling() selects the branch-free side of the step's data-dependent branches."""
    from torch._inductor.compile_fx import compile_fx  # inductor's entry point, the one torch.compile calls
    from torch.fx.experimental.proxy_tensor import make_fx

    before, torch.compiler._is_compiling_flag = torch.compiler._is_compiling_flag, True
    try:
        graph = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*example_args)
    finally:
        torch.compiler._is_compiling_flag = before
    for node in graph.graph.nodes:  # the trace's fake values; inductor propagates its own
        node.meta.pop("val", None), node.meta.pop("tensor_meta", None)
    with torch._inductor.config.patch(options):
        return compile_fx(graph, list(example_args))


def compiled_shallow_step(fallback: bool = True):
    """`shallow_step` as two graphs built on the first call for its learner, engine, constants and shapes: the
    afterstates as scalar C++ (`cpp.simdlen = 1`; vector code of the ragged W = 10 rows ran 3x slower) and the update
    as vector code, both with the C++ wrapper. A failed compile warns once and runs eagerly (fallback=False: raises)."""
    graphs = {}

    def learn_flat(*tensors):  # the learner's state, the carry but its pieces, uniform, next_pieces, the afterstates
        n, keys = len(ShallowTD.STATE), graphs["keys"]
        learner = copy.copy(graphs["learner"])  # the same net with the traced tensors as its state
        learner.__dict__.update(zip(ShallowTD.STATE, tensors[:n], strict=True))
        s = dict(zip(keys, tensors[n : n + len(keys)], strict=True))
        uniform, next_pieces, *after, cand_states = tensors[n + len(keys) :]
        new = shallow_learn(
            learner, graphs["engine"], s, tetris.Afterstates(*after), cand_states, uniform, next_pieces, graphs["k"]
        )
        graphs["out"] = [key for key in keys if new[key] is not s[key]]  # the rest is updated in place
        return tuple(new[key] for key in graphs["out"])

    def compiled(learner, engine, s, uniform, next_pieces, k):
        if "learn" not in graphs:  # build both graphs for these objects and shapes
            graphs.update(learner=learner, engine=engine, k=k, keys=[key for key in s if key != "pieces"])

            def afterstates_flat(boards, pieces):
                after, cand_states = shallow_afterstates(engine, dict(boards=boards, pieces=pieces), k)
                return (*after, cand_states)

            options = {"cpp.simdlen": 1, "cpp_wrapper": True}
            graphs["afterstates"] = compile_graph(afterstates_flat, [s["boards"], s["pieces"]], options)
        elif not (learner is graphs["learner"] and engine is graphs["engine"] and k is graphs["k"]):
            raise ValueError("compiled_shallow_step: one compiled step serves one learner, engine and StepConstants")
        after = graphs["afterstates"](s["boards"], s["pieces"])
        inputs = [
            *(getattr(learner, name) for name in ShallowTD.STATE),
            *(s[key] for key in graphs["keys"]),
            uniform,
            next_pieces,
            *after,
        ]
        if "learn" not in graphs:
            graphs["learn"] = compile_graph(learn_flat, inputs, {"cpp_wrapper": True})
        return {**s, **dict(zip(graphs["out"], graphs["learn"](*inputs), strict=True)), "pieces": next_pieces}

    def step(learner, engine, s, uniform, next_pieces, k):
        if not graphs.get("eager"):
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


# --- Bookkeeping: checkpoints, the run directory, the progress line and tensorboard, summary and curves, video --------
def architecture(args: Args) -> dict:
    height, width, _ = tetris.VARIANTS[tetris.ENV_VARIANTS[args.env_id]]
    arch = {"network": args.network, "activation": "+".join(args.activation), "height": height, "width": width}
    return arch | ({"hidden": args.hidden} if args.network == "shallow" else {})


def save_checkpoint(path, args, params, episodes, scores, lengths, state=None):
    """Every run's parameters, episode counters and scores, and (`state`) what resumes it exactly; tmp file + rename."""
    n = max(int(episodes.max()), 1)
    ckpt = dict(format=CHECKPOINT_FORMAT, architecture=architecture(args), num_runs=args.num_runs, env_id=args.env_id)
    ckpt.update(params={k: v.detach().cpu() for k, v in params.items()}, episodes=episodes.cpu(), args=asdict(args))
    ckpt.update(scores=scores[:, :n].cpu().clone(), lengths=lengths[:, :n].cpu().clone())
    torch.save(ckpt | ({"state": state} if state else {}), f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def load_checkpoint(path: str, args: Args) -> dict:
    """Load a checkpoint and check it against the requested run; raises ValueError with one clear line."""
    if member := damaged_member(path):  # torch.load does not check the zip's CRC-32 records
        raise ValueError(
            f"--resume {path!r} is damaged ({member} fails its CRC-32 check); restore it from a copy or start again"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"--resume {path!r}: no such file") from None
    except Exception as err:  # noqa: BLE001  (any unpickling failure means the file is not a checkpoint)
        raise ValueError(f"--resume {path!r} is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"--resume {path!r} is not a td_lambda_tetris checkpoint")
    want, have, timing = architecture(args), ckpt["architecture"], ckpt["args"].get("reward_timing", "next")
    if want != have:
        diff = ", ".join(f"{k}: checkpoint {have.get(k)} vs requested {v}" for k, v in want.items() if v != have.get(k))
        raise ValueError(f"--resume {path!r} holds another architecture ({diff}); pass matching flags")
    if ckpt.get("env_id", args.env_id) != args.env_id:  # SZ-Tetris and Tetris-v0 share the architecture
        raise ValueError(f"--resume {path!r} was trained on {ckpt['env_id']}; pass --env-id {ckpt['env_id']}")
    if ckpt["num_runs"] != args.num_runs:
        raise ValueError(f"--resume {path!r} holds {ckpt['num_runs']} runs; pass --num-runs {ckpt['num_runs']}")
    if timing != args.reward_timing:  # V means another thing under each timing; checkpoints before the flag: 'next'
        raise ValueError(f"--resume {path!r} was trained with --reward-timing {timing}; pass --reward-timing {timing}")
    if args.total_episodes <= (done := int(ckpt["episodes"].min())):
        raise ValueError(
            f"--resume {path!r} is already at episode {done:,} (slowest run); raise --total-episodes "
            "above it (it counts from the start of the original run)"
        )
    return ckpt


def setup(args: Args) -> tuple[Args, dict | None, torch.device]:
    """Defaults; one line per impossible setting or bad checkpoint, before anything is written; device; seeds."""
    args = fill_defaults(args)
    error, ckpt = validate(args), None
    try:
        ckpt = load_checkpoint(args.resume, args) if args.resume and error is None else None
    except ValueError as err:
        error = str(err)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    where = ckpt.get("state", {}).get("device", device.type) if ckpt else device.type
    if error is None and where != device.type:  # the random generator's state is per device type
        error = f"--resume {args.resume!r} was written on {where}; pass --device {where}"
    if error:
        raise SystemExit(f"error: {error}")
    if args.compile and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # the compiled step is fastest on one thread (the docs page, "Speed")
    for seed in (random.seed, np.random.seed, torch.manual_seed):
        seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    return args, ckpt, device


class Progress:
    """runs/{run_name}: the progress line and tensorboard (`log`), summary, curves and checkpoint (`write`, `close`)."""

    def __init__(self, args: Args, groups, episodes: torch.Tensor):
        base = f"{args.env_id.split('/')[-1]}__{args.exp_name}__{args.network}-{'+'.join(args.activation)}__{args.seed}"
        base = f"{base}__{int(time.time())}"  # a run started in the same second gets its own directory:
        name = next(n for n in [base, *(f"{base}-{i}" for i in range(2, 1000))] if not os.path.exists(f"runs/{n}"))
        if args.track:
            __import__("wandb").init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                name=name,
                sync_tensorboard=True,
                config=vars(args),
                save_code=True,
            )
        self.run_dir, self.args, self.groups, self.episodes = os.path.join("runs", name), args, groups, episodes
        self.writer = SummaryWriter(self.run_dir)
        table = "".join(f"|{k}|{v}|\n" for k, v in vars(args).items())
        self.writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
        self.summary = {"args": asdict(args), "run_name": name, "code": code_version()}  # this process's code
        self.t_start = self.t_log = self.t_write = time.time()
        self.logged = episodes.cpu().numpy().copy()  # finished episodes already in tensorboard, per run
        self.num_active, self.steps = int((episodes < args.total_episodes).sum()), 0
        n, one = args.num_runs, len(groups) == 1  # each run's tensorboard tag
        self.tag = [f"run{r}" if one else f"{args.activation[r // n]}/run{r % n}" for r in range(len(episodes))]

    def log(self, carry: dict, scores, lengths) -> bool:
        """After every loop step (a host sync every 16th); True when it printed the progress line."""
        self.steps += 1
        if self.steps % 16 == 0:  # a run that has finished its episodes idles along until then
            self.num_active = int(carry["active"].sum())
        now, abs_td, w = time.time(), carry["abs_td_sum"], self.writer
        if now - self.t_log < self.args.log_every_seconds and self.num_active:
            return False
        if not bool(torch.isfinite(abs_td).all()):
            bad = ", ".join(self.tag[r] for r in (~torch.isfinite(abs_td)).nonzero().flatten())
            self.summary["diverged"] = f"non-finite TD error in run(s) {bad}"
            return True
        done, sc, ln = self.episodes.cpu().numpy(), scores.cpu().numpy(), lengths.cpu().numpy()
        tau, placements = temperature(self.episodes.float(), self.args.tau0, self.args.tau_k), int(carry["placements"])
        sps, steps_per_second = placements / (now - self.t_start), self.steps / max(now - self.t_log, 1e-9)
        per_run = {"temperature": tau.tolist(), "abs_td_error": [x / self.steps for x in abs_td.tolist()]}
        for r in range(len(done)):  # every episode's score, then each per-run scalar at the run's episode count
            for ep in range(self.logged[r], done[r]):
                w.add_scalar(f"{self.tag[r]}/episode_score", sc[r, ep], ep)
                if (ep + 1) % 1000 == 0:
                    w.add_scalar(f"{self.tag[r]}/mean_score_1000", sc[r, ep - 999 : ep + 1].mean(), ep + 1)
            for key, values in per_run.items():
                w.add_scalar(f"{self.tag[r]}/{key}", values[r], int(done[r]))
        w.add_scalar("charts/placements_per_second", sps, placements)
        self.logged, self.t_log, self.steps = done.copy(), now, 0
        abs_td.zero_()
        recent = [
            f"{a} {np.mean([sc[r, max(0, done[r] - 1000) : done[r]].mean() for r in range(i, j)]):.2f}"
            if done[i:j].min() > 0
            else f"{a} -"
            for a, i, j in self.groups
        ]
        total = self.args.total_episodes
        print(
            f"episodes {int(done.min()):,}/{total:,} (slowest run) | placements {placements:,} | {sps:,.0f} "
            f"placements/s | mean score, last 1000 ep.: {', '.join(recent)} | tau {float(tau.mean()):.4f} | "
            f"{eta(ln, done, total, steps_per_second)}",
            flush=True,
        )
        self.summary.update(global_step=placements, wall_time=now - self.t_start, sps=sps)
        return True

    def write(self, theta: dict, state: dict, scores, lengths, complete: bool):
        """Non-finite parameters stop the run and write no checkpoint: the last good one stays."""
        args, summary, groups, counts_all = self.args, self.summary, self.groups, self.episodes.cpu().numpy()
        sc_all, ln_all = scores.cpu().numpy(), lengths.cpu().numpy()
        bad = sorted({int(r) for v in theta.values() for r in (~v.isfinite()).reshape(len(v), -1).any(1).nonzero()})
        if bad:
            summary["diverged"] = f"non-finite parameters in run(s) {', '.join(self.tag[r] for r in bad)}"
        summary["complete"] = complete
        for act, a, b in groups:
            counts, sc = counts_all[a:b], sc_all[a:b]
            info = dict(activation=act, episodes_per_run=counts.tolist()) | score_summary(sc, counts, args.final_window)
            info["placements_per_run"] = [int(ln_all[a + r, : counts[r]].sum()) for r in range(b - a)]
            info["paper_final_score"] = PAPER_FINAL_SCORES.get((args.env_id, act))
            out_dir = os.path.join(self.run_dir, act if len(groups) > 1 else "")
            os.makedirs(out_dir, exist_ok=True)
            if len(groups) == 1:
                summary.update(info)
            else:  # and a summary.json of the activation's own
                summary.setdefault("per_activation", {})[act] = info
                with open(os.path.join(out_dir, "summary.json"), "w") as f:
                    json.dump({**summary, **info, "per_activation": None}, f, indent=2)
            np.savez_compressed(os.path.join(out_dir, "episodes.npz"), scores=sc, lengths=ln_all[a:b], episodes=counts)
            for r in range(b - a) if complete and info["final_window"] else []:
                self.writer.add_scalar(f"{self.tag[a + r]}/final_score", info["final_score_per_run"][r], counts[r])
        write_curves(self.run_dir, groups, sc_all, counts_all, args)
        if args.save_model and not bad:
            summary["checkpoint"] = os.path.join(self.run_dir, "td_lambda_tetris.pt")
            save_checkpoint(summary["checkpoint"], args, theta, self.episodes, scores, lengths, state)
        with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        self.t_write = time.time()

    def close(self) -> dict:
        """The end of the run: one line and an error if it diverged, else each activation's final score."""
        self.writer.close()
        if "diverged" in self.summary:
            kept = f"; the last good checkpoint is {self.summary['checkpoint']}" if "checkpoint" in self.summary else ""
            raise SystemExit(f"error: {self.summary['diverged']}: training stopped (summary.json written{kept})")
        for act, info in (self.summary.get("per_activation") or {self.args.activation[0]: self.summary}).items():
            if not info["final_window"]:
                print(f"{act}: no final score yet (some run has not finished an episode)")
                continue
            runs = ", ".join(f"{v:.1f}" for v in info["final_score_per_run"])
            sd, spread = info["final_score_sd_episodes"], info["final_score_std_over_runs"]
            print(
                f"{act}: final mean score over the last {info['final_window']} episodes: "
                f"{info['final_score_mean']:.2f} ± {sd:.2f} (sd of the episode scores; sd over runs {spread:.2f}; "
                f"runs: {runs}); paper: {info['paper_final_score']}"
            )
        if self.args.save_model:
            print(f"saved {self.summary['checkpoint']}")
        if self.args.track:
            __import__("wandb").finish()
        return self.summary


def score_summary(scores: np.ndarray, counts: np.ndarray, final_window: int) -> dict:
    """Table 1's statistics over each run's last `final_window` episodes (fewer if some run has not played them): the
    paper's "mean ± sd" is final_score_mean ± the sd of all runs' pooled episode scores; the run means' sd is apart."""
    window = min(final_window, int(counts.min())) if len(counts) else 0
    if window == 0:
        return {"final_window": 0}
    last = np.stack([scores[r, c - window : c] for r, c in enumerate(counts)])  # (R, window)
    per_run, best = last.mean(1), int(last.mean(1).argmax())
    return dict(
        final_window=window,
        final_score_per_run=per_run.tolist(),
        final_score_mean=float(per_run.mean()),
        final_score_sd_episodes=float(last.std()),
        final_score_sd_episodes_per_run=last.std(1).tolist(),
        final_score_std_over_runs=float(per_run.std()),
        final_score_best_run=float(per_run[best]),
        final_score_best_run_index=best,
        final_score_best_run_sd_episodes=float(last[best].std()),
    )


def write_curves(run_dir, groups, scores, counts, args):
    """learning_curve.csv and .png: each run's mean score per block of 1,000 episodes (a tenth of the shortest run
    before that) and each activation's mean over its runs where every run has finished the block (Fig. 2)."""
    from matplotlib.figure import Figure  # no pyplot: no backend to choose, no figure to close

    block = 1000 if counts.min() >= 1000 else max(int(counts.min()) // 10, 1)
    x = np.arange(1, int(counts.max()) // block + 1) * block
    means = np.full((len(counts), len(x)), np.nan)
    for r, c in enumerate(counts):
        means[r, : c // block] = scores[r, : c // block * block].reshape(-1, block).mean(1)
    columns, ax = {"episode": x}, (fig := Figure(figsize=(7, 4.5))).subplots()
    for act, a, b in groups:
        tag = f"{act}/" if len(groups) > 1 else ""
        columns |= {f"{tag}run{r}": means[a + r] for r in range(b - a)} | {f"{tag}mean": means[a:b].mean(0)}
        if len(groups) == 1:
            ax.plot(x, means.T, "--", lw=0.8, alpha=0.6)
        (line,) = ax.plot(x, means[a:b].mean(0), lw=2.5, label=f"{act}, mean of {b - a} runs")
        if (paper := PAPER_FINAL_SCORES.get((args.env_id, act))) is not None:
            ax.axhline(paper, color=line.get_color(), ls=":", lw=1, label=f"{act}, the paper's final score ({paper})")
    np.savetxt(
        os.path.join(run_dir, "learning_curve.csv"),
        np.column_stack(list(columns.values())),
        fmt="%g",
        delimiter=",",
        newline="\r\n",
        header=",".join(columns),
        comments="",
    )
    ax.set(xlabel="episode", ylabel=f"mean score per {block} episodes")
    ax.set_title(f"{args.env_id} {args.network}, {int(counts.min()):,} episodes per run (slowest)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "learning_curve.png"), dpi=110)


def eta(lengths: np.ndarray, done: np.ndarray, total: int, steps_per_second: float) -> str:
    """The time left if each run's episodes left are as long as its last 100 (a lower bound while they lengthen): every
    run places one piece per loop step, so the run with the most placements left sets it ("?" before its first game)."""
    left = max(
        [
            (total - d) * lengths[r, max(0, d - 100) : d].mean() if d else math.inf
            for r, d in enumerate(done)
            if d < total
        ],
        default=0.0,
    )
    seconds = 0.0 if left == 0 else left / steps_per_second if steps_per_second > 0 else math.inf
    if not math.isfinite(seconds):
        return "ETA ?"
    s = int(max(seconds, 0))
    return f"ETA ≥ {s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s (if episodes stay as long as the last 100)"


@contextlib.contextmanager
def stop_signals():
    """SIGINT and SIGTERM end the loop at the next `stopped()` (a flag: an exception lands in whatever code runs)."""
    received = []
    previous = {s: signal.signal(s, lambda *_: received.append(True)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- Training ---------------------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    args, ckpt, device = setup(args)
    n = args.num_runs  # per activation; activation i owns runs [i n, (i + 1) n)
    groups = [(act, i * n, (i + 1) * n) for i, act in enumerate(args.activation)]
    R = n * len(groups)
    height, width, piece_set = tetris.VARIANTS[tetris.ENV_VARIANTS[args.env_id]]
    shallow = args.network == "shallow"
    # the shallow agent needs every placement's heights and holes but only the chosen board: column bits suffice
    engine = (tetris.ColumnEngine if shallow else tetris.AfterstateEngine)(height, width, piece_set, device=device)
    pieces_tensor, rng = torch.tensor(piece_set, device=device), torch.Generator(device=device).manual_seed(args.seed)
    draw = functools.partial(torch.randint, len(piece_set), (R,), generator=rng, device=device)  # each run's next piece
    if shallow:  # every activation's runs start from the same seeds
        init = init_shallow(n, tetris.binary_feature_length(height, width), args.hidden, args.seed, device)
        params = {k: torch.cat([v] * len(groups)) for k, v in init.items()}
        empty_board = torch.zeros(width, dtype=torch.long, device=device)  # column bits
        empty_state = shallow_indices(empty_board, empty_board.sum(), height)  # 20 feature rows + the bias row
    else:
        params, base = init_deep(R, height, width, args.activation[0], args.seed, device)
        empty_board = empty_state = torch.zeros(height, width, dtype=torch.uint8, device=device)
    episodes = torch.zeros(R, dtype=torch.long, device=device)  # i in eq. 15, per run
    capacity = max(args.total_episodes, int(ckpt["episodes"].max()) if ckpt else 0)
    scores = torch.zeros(R, capacity, device=device)  # score (rows cleared) of episode i of run r, at [r, i]
    lengths = torch.zeros(R, capacity, dtype=torch.long, device=device)  # its placements
    if ckpt is not None:
        for k in params:
            params[k].copy_(ckpt["params"][k])
        episodes.copy_(ckpt["episodes"])
        scores[:, : ckpt["scores"].shape[1]], lengths[:, : ckpt["lengths"].shape[1]] = ckpt["scores"], ckpt["lengths"]
        print(f"loaded {args.resume} (episodes per run: {episodes.tolist()})")
    learner = ShallowTD(params, groups) if shallow else None
    traces = (
        {k: getattr(learner, k) for k in ShallowTD.STATE}
        if shallow  # the deep net's: e per parameter tensor
        else {k: torch.zeros_like(v) for k, v in params.items()}
    )
    num_params, threads = sum(v[0].numel() for v in params.values()), torch.get_num_threads()
    log = Progress(args, groups, episodes)
    print(
        f"{log.summary['run_name']}: {n} run(s) each of a {args.network} {' / '.join(args.activation)} net "
        f"({num_params:,} parameters each) on {args.env_id}, {engine.num_placements} placements per piece, device "
        f"{device}, {threads} torch thread(s)"
    )
    log.summary.update(device=str(device), num_parameters_per_run=num_params, torch_threads=threads)
    target = torch.full_like(episodes, args.total_episodes)  # counted from the original start, as in every script
    zeros = functools.partial(torch.zeros, R, device=device)
    # the carry: s_t (boards: (R, W) column bits, or (R, H, W) cells for the deep net; states: its input rows (R, 21),
    # or the board) and its piece, the games in progress, the learning statistics, the record (updated in place)
    carry = dict(
        boards=empty_board.expand(R, *empty_board.shape).clone(),
        pieces=pieces_tensor[draw()],
        states=empty_state.expand(R, *empty_state.shape).clone(),
        holes_now=torch.zeros_like(episodes),
        decay=zeros(),
        score=zeros(),
        length=episodes * 0,
        active=episodes < target,
        placements=torch.zeros((), dtype=torch.long, device=device),
        abs_td_sum=zeros(),
        episodes=episodes,
        scores=scores,
        lengths=lengths,
    )
    if ckpt is not None and "state" in ckpt:  # exactly where the run stopped: traces, games in progress, generator
        for k, v in traces.items():
            v.copy_(ckpt["state"]["traces"][k])
        carry.update({k: v.to(device) for k, v in ckpt["state"]["games"].items()})
        rng.set_state(ckpt["state"]["rng"])
    k = StepConstants(
        args.gamma,
        args.alpha,
        args.gamma * args.lam,
        args.tau0,
        args.tau_k,
        args.holes_scale,
        args.reward_timing,
        empty_board,
        empty_state,
        target,
        _bias_encoding_table(height, width, device) if shallow else None,
    )
    shallow_step_fn = compiled_shallow_step() if args.compile else shallow_step

    def train_step(s, uniform, next_pieces):
        """act (eq. 14) -> step the games -> learn (eq. 2, 4, 1), for every run at once."""
        if shallow:
            learner.decay_traces(s["decay"])  # the data-dependent fold, eagerly (theta unchanged)
            return shallow_step_fn(learner, engine, s, uniform, next_pieces, k)
        after = engine(s["boards"], s["pieces"])  # every placement's afterstate f(s_t, a)
        v_t, grad_t = deep_value_and_grad(params, s["states"], base)  # V(s_t) and grad V(s_t) with theta_t
        v_cand = deep_value(params, after.boards, base)
        action, game_over, holes_next, td_error, step = choose_and_td_error(s, after, v_t, v_cand, uniform, k)
        update_traces_and_params(params, traces, grad_t, s["decay"], step)  # eq. 4, then eq. 1
        return advance_games(s, after, after.boards, action, game_over, holes_next, td_error, next_pieces, k)

    def write(complete: bool):
        state = dict(traces={k: v.detach().cpu().clone() for k, v in traces.items()}, rng=rng.get_state())
        state.update(games={k: carry[k].cpu() for k in GAME_STATE}, device=device.type)
        log.write(learner.parameters() if shallow else params, state, scores, lengths, complete)

    tags = {a: log.tag[a].replace("/", "-") for _, a, _ in groups} if args.capture_video else {}  # first runs
    video = tetris.TetrisVideo(os.path.join(log.run_dir, "videos"), tags, episodes, height, columns=shallow)
    video.add(carry["boards"], episodes, carry["active"])
    with stop_signals() as stopped:
        while log.num_active and not stopped() and "diverged" not in log.summary:
            uniform = torch.rand(R, engine.num_placements + 1, generator=rng, device=device)
            carry = train_step(carry, uniform, pieces_tensor[draw()])
            video.add(carry["boards"], episodes, carry["active"])
            if log.log(carry, scores, lengths) and time.time() - log.t_write >= 60 * args.write_every_minutes:
                write(complete=False)
        interrupted = stopped() and bool(log.num_active)  # a signal after the last episode changes nothing
    if interrupted:
        print("interrupted: writing the summary, the learning curves and (with --save-model) the checkpoint")
    video.close()
    write(complete=not interrupted and "diverged" not in log.summary)
    return log.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
