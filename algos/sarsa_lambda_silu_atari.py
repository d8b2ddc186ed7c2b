"""Deep Sarsa(lambda) with SiLU / dSiLU units, accumulating eligibility traces and softmax action selection on Atari.

Elfwing, Uchibe & Doya (2018), "Sigmoid-weighted linear units for neural network function approximation in
reinforcement learning", §2.1-2.3 and §3.3 (Table 2, Fig. 5), with the analyses of §4.1 (Fig. 7) and §4.2 (Table 3).

    On-policy and online, no replay memory, no target network. At every agent step t, with the parameters theta_t:
    a_{t+1} ~ pi(.|s_{t+1}) = exp(Q_t(s_{t+1}, .) / tau) / sum_b exp(Q_t(s_{t+1}, b) / tau)     (eq. 13)
    delta_t = r_t + gamma Q_t(s_{t+1}, a_{t+1}) - Q_t(s_t, a_t),  Q(terminal, .) = 0           (eq. 3)
    e_t     = gamma lambda e_{t-1} + grad_theta Q_t(s_t, a_t),  e_0 = 0 at every episode start  (eq. 5)
    theta_{t+1} = theta_t + alpha delta_t e_t                                                    (eq. 1)
    tau(i)  = tau0 / (1 + tau_k i), i = episodes finished so far                                (eq. 15)
    r_t is the game reward clipped to [-1, 1]; the TD error is not clipped.

Network (§3.3): 2x105x80 input -> conv 16 8x8/4 -> max-pool 3x3/2 -> conv 32 4x4/2 -> max-pool 3x3/2 -> fc 512 -> one
linear output per valid action. `--activations silu-dsilu` (the paper's: SiLU (eq. 9) in the conv layers, dSiLU
(eq. 10) in the fc layer), or any other `conv-fc` pair of silu | dsilu | relu | sigmoid.

Environment (§3.3) through ale_py's native vector env: luminance (ALE grayscale) frames, the pixel-wise maximum of the
last two frames of every 4-frame skip, downsampled to 105x80; the network sees the current and the previous agent
step's frame (the "fourth previous" frame); up to 30 no-op frames at the start; episodes end at game over or after
18,000 frames; no sticky actions; the minimal action set; a lost life is not terminal.

`--num-envs N` steps N environments with ONE shared theta and N eligibility traces (one per environment, so the trace
tensor is (N, #parameters): N copies of the parameters in memory, 0.9 MB each for 18 actions). The N per-environment
gradients grad_theta Q(s_t,k, a_t,k) come from one vmapped torch.func call and the update adds the N contributions:
    theta_{t+1} = theta_t + alpha sum_k delta_t,k e_t,k
N = 1 is exactly the paper's agent. For N > 1 this differs from the paper: (i) each wall-clock step applies N TD
updates at once, all computed with the same theta_t, so the step per environment step is the paper's but the step per
update is N times larger (consider --alpha / N for large N); (ii) the temperature follows the total number of finished
episodes over all environments, so tau(i) over the training budget is the paper's curve but each environment sees it
fall N times faster per own episode; (iii) the N trajectories are correlated only through theta.

The paper's Atari setting (Table 2: 12 games, 200,000 episodes, 2 runs each; the default game is ALE/Alien-v5, the
first of Table 2 and one of the three games of the paper's meta-parameter search):
    python algos/sarsa_lambda_silu_atari.py --env-id ALE/Alien-v5 --seed 1      # and --seed 2
    for g in Alien Amidar Assault Asterix Asteroids Atlantis BankHeist BattleZone BeamRider Bowling Boxing Breakout; do
        python algos/sarsa_lambda_silu_atari.py --env-id ALE/$g-v5 --save-model; done
Table 3 and Fig. 7 on a trained agent (softmax at the final tau and epsilon-greedy; Q(s_t, a_t) against R_t):
    python algos/sarsa_lambda_silu_atari.py --env-id ALE/Asterix-v5 --resume runs/<run>/sarsa_lambda_silu_atari.pt \
        --total-episodes 0 --eval-episodes 100
"""

from __future__ import annotations

import copy
import csv
import difflib
import json
import math
import os
import random
import re
import signal
import textwrap
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import ale_py
import numpy as np
import torch
import torch.nn.functional as F
import tyro
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils.tensorboard import SummaryWriter

CHECKPOINT_FORMAT = "sarsa_lambda_silu_atari/1"
FRAME_SHAPE = (105, 80)  # §3.3: luminance frames downsampled to 105x80
STACK = 2  # the current and the previous agent step's frame
# The 12 games of Table 2 (the DQN games starting with A or B), the default suite.
TABLE2_GAMES = (
    "ALE/Alien-v5", "ALE/Amidar-v5", "ALE/Assault-v5", "ALE/Asterix-v5", "ALE/Asteroids-v5", "ALE/Atlantis-v5",
    "ALE/BankHeist-v5", "ALE/BattleZone-v5", "ALE/BeamRider-v5", "ALE/Bowling-v5", "ALE/Boxing-v5", "ALE/Breakout-v5",
)  # fmt: skip
# Per game: random-agent and DQN scores of Mnih et al. (2015) (shared/reference/atari_scores.csv, columns
# random_nature and dqn_nature), for the DQN-normalised score (agent - random) / (DQN - random), and the SiLU-dSiLU
# agent's final and best mean scores from Table 2. Table 2 prints the DQN column rounded (and Atlantis as 85,950);
# with these values the table's summary rows (mean 218 % / 332 %, median 78 % / 125 %) are reproduced.
TABLE2_SCORES = {  # game: (random, dqn, paper final, paper best)
    "Alien": (227.8, 3069.0, 1370, 2246), "Amidar": (5.8, 739.5, 762, 904),
    "Assault": (222.4, 3359.0, 2415, 2944), "Asterix": (210.0, 6012.0, 70942, 100322),
    "Asteroids": (719.1, 1629.0, 6537, 10614), "Atlantis": (12850.0, 85641.0, 127651, 128983),
    "BankHeist": (14.2, 429.7, 5, 770), "BattleZone": (2360.0, 26300.0, 22930, 29115),
    "BeamRider": (363.9, 6846.0, 1829, 2176), "Bowling": (23.1, 42.4, 67, 75),
    "Boxing": (0.1, 71.8, 36, 92), "Breakout": (1.7, 401.2, 25, 55),
}  # fmt: skip


@dataclass
class Args:
    # --- experiment ---
    exp_name: str = "sarsa_lambda_silu_atari"
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the network initialisation, the action choices and the emulators (env k of a segment starting at
    episode i is seeded with seed + i + k)"""
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
    capture_video: bool = False
    """write what the agent sees (the 105x80 frames of env 0, shown at 210x160) as mp4 under runs/{run_name}/videos/:
    training episodes 0, 1, 8, 27, ..., 1000, 2000, ... of env 0, and the first evaluation episode of each rule"""
    save_model: bool = False
    """save theta, the eligibility traces, the episode counter, the score history and the action-sampling generator to
    runs/{run_name}/sarsa_lambda_silu_atari.pt (at the end and every --write-every-minutes)"""
    resume: Annotated[str | None, tyro.conf.arg(aliases=("--load-model",))] = None
    """checkpoint to resume (alias --load-model): theta, the traces, the episode counter i (so tau(i) goes on) and
    the learning curve. The emulator state is not saved (ale_py's vector env cannot clone it), so every environment
    starts a new episode, whose trace restarts at e_0 = 0 (eq. 5); the saved traces are therefore not needed to go on,
    and --num-envs may differ from the checkpoint's. --total-episodes counts from the start of the original run; with
    --total-episodes 0 the checkpoint is only evaluated"""
    log_every_seconds: float = 10.0
    """how often the progress line is printed"""
    write_every_minutes: Annotated[float, tyro.conf.arg(aliases=("--checkpoint-every-minutes",))] = 10.0
    """how often summary.json, episodes.csv, the learning curve and (with --save-model) the checkpoint are rewritten
    (alias --checkpoint-every-minutes)"""

    # --- environment (§3.3, through ale_py.AtariVectorEnv) ---
    env_id: str = "ALE/Alien-v5"
    """ALE/<Game>-v5; only the game is taken from the id (the protocol below replaces the v5 registration's, e.g. no
    sticky actions). Table 2's suite: TABLE2_GAMES"""
    num_envs: int = 1
    """environments, each with its own eligibility trace, sharing theta (1 = the paper's agent; see the docstring)"""
    frame_skip: int = 4
    """emulator frames per action (the action is repeated; the observation is the max of the last two frames)"""
    noop_max: int = 30
    """no-op starts: ale_py plays a uniform number in 0..noop_max-1 of no-op frames before an episode's first state
    (0 = none)"""
    max_episode_frames: int = 18_000
    """episode cap in emulator frames (18,000 = 5 minutes of play = 4,500 agent steps)"""
    fire_reset: bool = False
    """press FIRE after every reset in games that have it (the paper does not; the agent must learn to)"""
    truncation_is_terminal: bool = True
    """treat the --max-episode-frames cut as terminal (Q = 0) rather than bootstrapping from Q(s_{t+1}, a_{t+1})"""

    # --- algorithm: Sarsa(lambda), §2.1, §2.3, §3.3 ---
    total_episodes: int = 200_000
    """training episodes, summed over the environments, counted from the start of the run (a resumed run goes on
    to this count)"""
    alpha: float = 0.001
    """learning rate alpha (eq. 1)"""
    gamma: float = 0.99
    """discount factor gamma"""
    lam: float = 0.8
    """trace-decay rate lambda (eq. 5)"""
    tau0: float = 0.5
    """initial softmax temperature tau_0 (eq. 15)"""
    tau_k: float = 0.0005
    """temperature annealing rate tau_k (eq. 15); tau(200,000) = 0.00495, Table 3's value"""
    clip_rewards: bool = True
    """learn from rewards clipped to [-1, 1] (§3.3); the logged scores are always the raw game scores"""

    # --- network ---
    activations: str = "silu-dsilu"
    """activation of the conv layers - of the fc layer, each silu | dsilu | relu | sigmoid"""
    padding: Literal["same", "valid"] = "same"
    """padding of the convolutions and max-pools (the paper does not say): same = TensorFlow 'SAME' (105x80 -> 27x20
    -> 14x10 -> 7x5 -> 4x3, 384 inputs to the fc layer), valid = none (-> 25x19 -> 12x9 -> 5x3 -> 2x1, 64 inputs)"""

    # --- evaluation and analysis (Table 2, §4.1, §4.2) ---
    final_window: int = 100
    """episodes behind the final mean score and the best mean score (any window of this many consecutive episodes)"""
    eval_episodes: int = 0
    """after training (or on --resume), play this many episodes per selection rule without learning, shared
    evenly by the environments"""
    eval_selections: tuple[str, ...] = ("softmax", "epsilon:0", "epsilon:0.001", "epsilon:0.01", "epsilon:0.05")
    """selection rules of Table 3: 'softmax' (at the final temperature), 'softmax:TAU' or 'epsilon:EPS'; the first
    rule's episodes also feed the value-estimation analysis of Fig. 7 (CSV + PNG)"""


# ----------------------------------------------------------------------------------------------------------------------
# Setup: the game, validation
# ----------------------------------------------------------------------------------------------------------------------
def camel_name(rom: str) -> str:
    """'bank_heist' -> 'BankHeist' (Gymnasium's spelling of ROM names)."""
    return "".join(part.capitalize() for part in rom.split("_"))


def game_from_env_id(env_id: str) -> str | None:
    """'ALE/BankHeist-v5' -> the ROM name 'bank_heist', or None when no ROM has that name."""
    match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5", env_id)
    if match is None:
        return None
    roms = {rom.replace("_", ""): rom for rom in ale_py.roms.get_all_rom_ids()}
    return roms.get(match.group(1).lower())


def unknown_env_message(env_id: str) -> str:
    names = {camel_name(rom).lower(): camel_name(rom) for rom in ale_py.roms.get_all_rom_ids()}
    asked = re.sub(r"^(ALE/)?|(NoFrameskip)?(-v\d+)?$", "", env_id).lower()
    close = difflib.get_close_matches(asked, list(names), n=3, cutoff=0.5)
    hint = ", ".join(f"ALE/{names[c]}-v5" for c in close) if close else "ALE/<Game>-v5 such as ALE/Alien-v5"
    return f"unknown --env-id {env_id!r}; closest valid ids: {hint}"


def dqn_normalized(score: float, game: str) -> float | None:
    """(score - random) / (DQN - random) (§3.3), or None outside Table 2's games."""
    ref = TABLE2_SCORES.get(game)
    if ref is None or not math.isfinite(score):
        return None
    return (score - ref[0]) / (ref[1] - ref[0])


def parse_selection(rule: str, final_tau: float) -> tuple[str, float]:
    """'softmax' | 'softmax:TAU' | 'epsilon:EPS' -> ('softmax', tau) or ('epsilon', eps)."""
    kind, _, value = rule.partition(":")
    if kind == "softmax":
        return "softmax", float(value) if value else final_tau
    if kind == "epsilon" and value:
        return "epsilon", float(value)
    raise ValueError(rule)


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def validate(args: Args) -> str | None:
    """One clear line for each impossible setting, checked before anything is written."""
    if game_from_env_id(args.env_id) is None:
        return unknown_env_message(args.env_id)
    conv_act, _, fc_act = args.activations.partition("-")
    if conv_act not in ACTIVATIONS or fc_act not in ACTIVATIONS:
        names = " | ".join(ACTIVATIONS)
        return f"unknown --activations {args.activations!r}; use CONV-FC with each of {names}, e.g. silu-dsilu"
    if args.num_envs < 1:
        return f"--num-envs must be at least 1, got {args.num_envs}"
    traces_bytes = args.num_envs * num_parameters(18, args.padding) * 4
    if traces_bytes + 2**30 > physical_memory_bytes():
        return f"--num-envs {args.num_envs} needs {traces_bytes / 1e9:.1f} GB of eligibility traces; lower it"
    if args.total_episodes < 0 or args.eval_episodes < 0:
        return "--total-episodes and --eval-episodes must be >= 0"
    if args.total_episodes == 0 and args.eval_episodes == 0:
        return "nothing to do: --total-episodes 0 needs --eval-episodes > 0 (and usually --resume)"
    for name in ("alpha", "gamma", "lam", "tau0", "tau_k"):
        if not math.isfinite(getattr(args, name)):
            return f"--{name.replace('_', '-')} must be a finite number, got {getattr(args, name)}"
    if args.alpha <= 0 or args.tau0 <= 0 or args.tau_k < 0 or args.final_window < 1:
        return "--alpha, --tau0 and --final-window must be positive and --tau-k non-negative"
    if not (0 <= args.gamma <= 1 and 0 <= args.lam <= 1):
        return "--gamma and --lam must lie in [0, 1]"
    if args.frame_skip < 1 or args.noop_max < 0 or args.max_episode_frames < 1:
        return "--frame-skip and --max-episode-frames must be positive and --noop-max non-negative"
    for rule in args.eval_selections:
        try:
            kind, value = parse_selection(rule, 1.0)
        except ValueError:
            return f"bad --eval-selections entry {rule!r}; use 'softmax', 'softmax:TAU' or 'epsilon:EPS'"
        if (kind == "epsilon" and not 0 <= value <= 1) or (kind == "softmax" and value <= 0):
            return f"bad --eval-selections entry {rule!r}: epsilon must lie in [0, 1] and tau be positive"
    if args.device != "auto" and args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto"
    return None


def make_env(args: Args, rom: str):
    """ale_py's vector env with the §3.3 protocol. Observations are (N, 2, 105, 80) uint8: the previous and the
    current agent step's frame, each the luminance (ALE grayscale) max over the last two emulator frames of the skip,
    downsampled to 105x80; at an episode's first state the previous frame is zero. Rewards come back unclipped."""
    return ale_py.AtariVectorEnv(
        rom,
        args.num_envs,
        num_threads=min(args.num_envs, os.cpu_count() or 1),
        repeat_action_probability=0.0,
        full_action_space=False,
        noop_max=args.noop_max,
        max_num_frames_per_episode=args.max_episode_frames,
        frameskip=args.frame_skip,
        maxpool=True,
        grayscale=True,
        img_height=FRAME_SHAPE[0],
        img_width=FRAME_SHAPE[1],
        stack_num=STACK,
        episodic_life=False,
        life_loss_info=False,
        reward_clipping=False,
        use_fire_reset=args.fire_reset,
    )


class EpisodeTracker:
    """Per-environment bookkeeping for ale_py's NEXT_STEP autoreset.

    After a step that ends an episode, the env's next step is a reset step: its action is ignored and it returns the
    first state of a new episode with reward 0. Such a step is no transition: nothing is learned from it, it is not
    counted as an agent step, and it ends the old episode's trace. It is recognised from the previous step's flags
    and, as a safeguard, from the episode frame counter going backwards.
    """

    def __init__(self, num_envs: int, info: dict):
        self.reset_next = np.zeros(num_envs, dtype=bool)
        self.frame_number = np.asarray(info["episode_frame_number"]).copy()
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def step(self, rewards, terminated, truncated, info):
        """Returns (learn: the step was a real transition, episode_end, [(env, raw score, length)] finished)."""
        frame_number = np.asarray(info["episode_frame_number"])
        learn = ~(self.reset_next | (frame_number < self.frame_number))
        self.returns += np.where(learn, rewards, 0)
        self.lengths += learn
        episode_end = learn & (terminated | truncated)
        finished = [(int(k), float(self.returns[k]), int(self.lengths[k])) for k in np.flatnonzero(episode_end)]
        self.returns[episode_end], self.lengths[episode_end] = 0.0, 0
        self.reset_next, self.frame_number = episode_end, frame_number.copy()
        return learn, episode_end, finished


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


ACTIVATIONS = {"silu": silu, "dsilu": dsilu, "relu": torch.relu, "sigmoid": torch.sigmoid}


# ----------------------------------------------------------------------------------------------------------------------
# Network (§3.3)
# ----------------------------------------------------------------------------------------------------------------------
def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """TensorFlow 'SAME' padding of the last two dims: output ceil(n / stride); the total padding
    max((out - 1) stride + kernel - n, 0) is split with the odd pixel after."""
    pads = []
    for n in (x.shape[-1], x.shape[-2]):  # F.pad lists the last dim first
        total = max((-(-n // stride) - 1) * stride + kernel - n, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads, value=value)


def feature_map_size(padding: str) -> tuple[int, int]:
    """Height and width after the two conv + max-pool stages: 4x3 with 'same', 2x1 with 'valid'."""
    size = []
    for n in FRAME_SHAPE:
        for kernel, stride in ((8, 4), (3, 2), (4, 2), (3, 2)):
            n = -(-n // stride) if padding == "same" else (n - kernel) // stride + 1
        size.append(n)
    return size[0], size[1]


def num_parameters(num_actions: int, padding: str) -> int:
    h, w = feature_map_size(padding)
    return (16 * STACK * 64 + 16) + (32 * 16 * 16 + 32) + (32 * h * w * 512 + 512) + (512 * num_actions + num_actions)


class SarsaQNetwork(nn.Module):
    """conv 16 8x8/4 -> max-pool 3x3/2 -> conv 32 4x4/2 -> max-pool 3x3/2 -> fc 512 -> linear, one Q per action.

    The paper gives no padding. We use TensorFlow's 'SAME' padding (zeros for the convolutions, -inf for the
    max-pools), as the project's other conv nets do: 105x80 -> 27x20 -> 14x10 -> 7x5 -> 4x3, so the fc layer sees
    32*4*3 = 384 inputs. `--padding valid` pads nothing: 105x80 -> 25x19 -> 12x9 -> 5x3 -> 2x1 (64 inputs).
    Weights use PyTorch's default initialisation (the paper does not give one); pixels are scaled to [0, 1].
    """

    def __init__(self, num_actions: int, activations: str = "silu-dsilu", padding: str = "same"):
        super().__init__()
        conv_act, fc_act = activations.split("-")
        self.conv_act, self.fc_act = ACTIVATIONS[conv_act], ACTIVATIONS[fc_act]
        self.same = padding == "same"
        self.conv1 = nn.Conv2d(STACK, 16, 8, stride=4)
        self.conv2 = nn.Conv2d(16, 32, 4, stride=2)
        h, w = feature_map_size(padding)
        self.fc = nn.Linear(32 * h * w, 512)
        self.out = nn.Linear(512, num_actions)

    def conv(self, x, layer):
        return layer(pad_same(x, layer.kernel_size[0], layer.stride[0]) if self.same else x)

    def pool(self, x):
        return F.max_pool2d(pad_same(x, 3, 2, float("-inf")) if self.same else x, 3, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0  # (B, 2, 105, 80); the shapes below are those of 'same' padding
        x = self.pool(self.conv_act(self.conv(x, self.conv1)))  # (B, 16, 27, 20) -> (B, 16, 14, 10)
        x = self.pool(self.conv_act(self.conv(x, self.conv2)))  # (B, 32, 7, 5) -> (B, 32, 4, 3)
        x = self.fc_act(self.fc(x.flatten(1)))  # (B, 512)
        return self.out(x)  # (B, actions)


def flatten_parameters(net: nn.Module, device) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """theta as one flat vector (the paper's parameter vector) and, for functional_call, a dict of views into it, so
    an in-place update of theta is an update of the network."""
    named = dict(net.named_parameters())
    theta = torch.cat([p.detach().flatten() for p in named.values()]).to(device)
    chunks = theta.split([p.numel() for p in named.values()])
    return theta, {name: chunk.view(p.shape) for (name, p), chunk in zip(named.items(), chunks, strict=True)}


def q_values(net: nn.Module, params: dict, obs: torch.Tensor) -> torch.Tensor:
    """Q(s, .) for a batch of states: (N, 2, 105, 80) -> (N, actions), no gradient."""
    with torch.no_grad():
        return functional_call(net, params, (obs,))


def q_and_grad(net: nn.Module, params: dict, obs: torch.Tensor, actions: torch.Tensor):
    """Q(s_k, a_k) and grad_theta Q(s_k, a_k) of every environment k from ONE vectorized call (vmap over the
    environments of torch.func.grad, theta shared). obs (N, ...), actions (N,) -> (N,), (N, #parameters).

    With one environment (the paper's agent) plain autograd gives the same numbers about twice as fast on a CPU
    (torch.func's transforms cost ~1.3 ms per call here), so N = 1 takes that path.
    """
    if len(obs) == 1:
        p = {name: v.detach().requires_grad_(True) for name, v in params.items()}
        q_sa = functional_call(net, p, (obs,))[0, actions[0]]
        grads = torch.autograd.grad(q_sa, list(p.values()))
        return q_sa.detach()[None], torch.cat([g.flatten() for g in grads])[None]

    def q_taken(p, s, a):
        q = functional_call(net, p, (s[None],))[0]  # (actions,)
        q_sa = q.gather(0, a[None])[0]
        return q_sa, q_sa

    grads, q_sa = vmap(grad(q_taken, has_aux=True), in_dims=(None, 0, 0))(params, obs, actions)
    return q_sa, torch.cat([g.flatten(1) for g in grads.values()], 1)  # same order as theta


# ----------------------------------------------------------------------------------------------------------------------
# Sarsa(lambda) (§2.1) and softmax selection (§2.3)
# ----------------------------------------------------------------------------------------------------------------------
def temperature(episode, tau0: float, tau_k: float):
    """Hyperbolic annealing, eq. 15: tau(i) = tau0 / (1 + tau_k i), decreased after every episode i."""
    return tau0 / (1 + tau_k * episode)


def softmax_probabilities(q: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 13: pi(a|s) = exp(Q(s, a) / tau) / sum_b exp(Q(s, b) / tau). q (N, actions)."""
    return torch.softmax(q / tau, -1)


def select_actions(q: torch.Tensor, rng: torch.Generator, tau: float | None = None, epsilon: float | None = None):
    """Softmax (eq. 13) at temperature tau, or epsilon-greedy when epsilon is given. Returns (actions, exploratory):
    an action is exploratory when it is not the greedy one (Table 3)."""
    greedy = q.argmax(-1)
    if epsilon is None:
        actions = torch.multinomial(softmax_probabilities(q, tau), 1, generator=rng)[:, 0]
    else:
        explore = torch.rand(len(q), generator=rng, device=q.device) < epsilon
        uniform = torch.randint(q.shape[-1], (len(q),), generator=rng, device=q.device)
        actions = torch.where(explore, uniform, greedy)
    return actions, actions != greedy


def td_error(reward, q_next, q_taken, terminal, gamma: float):
    """Eq. 3: delta_t = r_t + gamma Q_t(s_{t+1}, a_{t+1}) - Q_t(s_t, a_t), with Q(terminal, .) = 0. All (N,)."""
    return reward + gamma * torch.where(terminal, 0.0, q_next) - q_taken


def accumulate_traces(eligibility: torch.Tensor, grad_q: torch.Tensor, decay: torch.Tensor) -> None:
    """Eq. 5, in place, one trace per environment (rows of e, (N, #parameters)):
    e_t = decay e_{t-1} + grad_theta Q_t(s_t, a_t), decay = gamma lambda (0 at an episode's first step: e_0 = 0)."""
    eligibility.mul_(decay[:, None]).add_(grad_q)


def update_parameters(theta: torch.Tensor, eligibility: torch.Tensor, td_errors: torch.Tensor, alpha: float) -> None:
    """Eq. 1, in place, summed over the environments: theta_{t+1} = theta_t + alpha sum_k delta_t,k e_t,k."""
    theta.addmv_(eligibility.T, td_errors, alpha=alpha)


def sarsa_lambda_update(
    theta, eligibility, grad_q, q_taken, reward, q_next, terminal, first_step, learn, alpha, gamma, lam
) -> torch.Tensor:
    """One online Sarsa(lambda) step for N environments, in the paper's order: delta_t (eq. 3), e_t (eq. 5),
    theta_{t+1} (eq. 1). Everything on the right-hand side was computed with theta_t.

    grad_q (N, P) and q_taken (N,) are grad_theta Q_t(s_t, a_t) and Q_t(s_t, a_t); q_next (N,) is Q_t(s_{t+1},
    a_{t+1}); terminal: s_{t+1} is terminal; first_step: s_t is the first state of its episode (e_{t-1} = 0); learn:
    the step was a real transition (False on ale_py's reset steps, whose trace is cleared and whose delta is 0).
    Returns delta_t (N,), 0 where not learning.
    """
    delta = td_error(reward, q_next, q_taken, terminal, gamma) * learn
    decay = gamma * lam * (learn & ~first_step).to(theta.dtype)
    accumulate_traces(eligibility, grad_q * learn[:, None], decay)
    update_parameters(theta, eligibility, delta, alpha)
    return delta


# ----------------------------------------------------------------------------------------------------------------------
# Analysis: scores (Table 2) and value estimation (§4.1, Fig. 7)
# ----------------------------------------------------------------------------------------------------------------------
def best_window_mean(scores: np.ndarray, window: int) -> float:
    """Best mean score over the non-overlapping blocks of `window` episodes (1-window, window+1-2 window, ...):
    Table 2's "highest mean scores (over every 100 episodes)". An unfinished last block does not count; with fewer
    than `window` episodes, the mean of all of them."""
    if len(scores) == 0:
        return float("nan")
    n_blocks = len(scores) // window
    if n_blocks == 0:
        return float(np.mean(scores))
    return float(np.asarray(scores[: n_blocks * window], dtype=np.float64).reshape(n_blocks, window).mean(1).max())


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = sum_{k=0}^{T-t} gamma^k r_{t+k} (§4.1), r_t the (clipped) reward for a_t in s_t."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def value_estimation_errors(q_taken: np.ndarray, rewards: np.ndarray, gamma: float) -> tuple[float, float]:
    """Fig. 7's normalised sums of differences and of absolute differences: (1/T) sum_t (Q(s_t, a_t) - R_t) and
    (1/T) sum_t |Q(s_t, a_t) - R_t|."""
    diff = np.asarray(q_taken) - discounted_returns(np.asarray(rewards, dtype=np.float64), gamma)
    return float(diff.mean()), float(np.abs(diff).mean())


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------------------------
def architecture(args: Args, rom: str, num_actions: int) -> dict:
    return {
        "game": rom,
        "num_actions": num_actions,
        "activations": args.activations,
        "padding": args.padding,
        "num_parameters": num_parameters(num_actions, args.padding),
    }


def save_checkpoint(path, args, arch, theta, eligibility, episodes, global_step, history, rng):
    """theta, the traces, the counters, the score history and the sampler state; written atomically."""
    tmp = f"{path}.tmp"
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "architecture": arch,
            "num_envs": args.num_envs,
            "theta": theta.detach().cpu(),
            "eligibility": eligibility.detach().cpu(),
            "episodes": episodes,
            "global_step": global_step,
            "history": {k: torch.tensor(v) for k, v in history.items()},
            "rng_state": rng.get_state().cpu(),
            "args": asdict(args),
        },
        tmp,
    )
    os.replace(tmp, path)


def load_checkpoint(path: str, args: Args, arch: dict) -> dict:
    """Load and check a checkpoint against the requested architecture; raises ValueError with one clear line."""
    if not os.path.isfile(path):
        raise ValueError(f"--resume {path!r}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any unpickling failure means the file is not a checkpoint)
        raise ValueError(f"--resume {path!r} is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"--resume {path!r} is not a sarsa_lambda_silu_atari checkpoint")
    have = ckpt["architecture"]
    if have != arch:
        diff = ", ".join(
            f"{k}: checkpoint {have.get(k)} vs requested {arch[k]}" for k in arch if arch[k] != have.get(k)
        )
        raise ValueError(f"--resume {path!r} holds another architecture ({diff}); pass matching flags")
    if ckpt["theta"].shape != (arch["num_parameters"],):
        raise ValueError(f"--resume {path!r} is damaged: theta has shape {tuple(ckpt['theta'].shape)}")
    if args.total_episodes > 0:
        if ckpt["episodes"] >= args.total_episodes:
            raise ValueError(
                f"--resume {path!r} is already at episode {ckpt['episodes']:,}; raise --total-episodes above it "
                "(it counts from the start of the run) or pass --total-episodes 0 to evaluate"
            )
    return ckpt


# ----------------------------------------------------------------------------------------------------------------------
# Outputs: learning curve, value analysis, video
# ----------------------------------------------------------------------------------------------------------------------
def write_learning_curve(run_dir: str, scores: np.ndarray, block: int, title: str, game: str):
    """Mean score per block of episodes (Fig. 5), CSV and PNG, with the random and DQN scores of Table 2."""
    n = len(scores) // block
    means = scores[: n * block].reshape(n, block).mean(1) if n else np.zeros(0)
    with open(os.path.join(run_dir, "learning_curve.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["episode", f"mean_score_{block}"])
        w.writerows([((b + 1) * block, f"{m:.3f}") for b, m in enumerate(means)])
    if n == 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot((np.arange(n) + 1) * block, means, "k-", lw=1.5, label="Sarsa(lambda), this run")
    if game in TABLE2_SCORES:
        rnd, dqn, final, _ = TABLE2_SCORES[game]
        ax.axhline(dqn, color="r", ls=":", label=f"DQN ({dqn:g})")
        ax.axhline(rnd, color="gray", ls=":", label=f"random ({rnd:g})")
        ax.axhline(final, color="b", ls="--", lw=0.8, label=f"paper, final ({final:g})")
    ax.set_xlabel("episode")
    ax.set_ylabel(f"mean score per {block} episodes")
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)  # long run names wrap instead of being cut
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "learning_curve.png"), dpi=110)
    plt.close(fig)


def write_value_analysis(run_dir: str, episodes: list[dict], gamma: float) -> dict:
    """§4.1 / Fig. 7: per episode the normalised sums of (Q(s_t, a_t) - R_t) and |Q(s_t, a_t) - R_t|
    (value_analysis.csv), and Q(s_t, a_t) against R_t along the highest-scoring episode (value_trajectory.csv and
    value_analysis.png)."""
    rows = []
    for i, ep in enumerate(episodes):
        diff, abs_diff = value_estimation_errors(ep["q"], ep["rewards"], gamma)
        rows.append((i, len(ep["q"]), ep["score"], diff, abs_diff))
    with open(os.path.join(run_dir, "value_analysis.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["episode", "T", "score", "normalised_sum_diff", "normalised_sum_abs_diff"])
        w.writerows(rows)
    best = max(range(len(episodes)), key=lambda i: episodes[i]["score"])
    q, returns = np.asarray(episodes[best]["q"]), discounted_returns(np.asarray(episodes[best]["rewards"]), gamma)
    with open(os.path.join(run_dir, "value_trajectory.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "q_taken", "discounted_return"])
        w.writerows((t, f"{a:.5f}", f"{b:.5f}") for t, (a, b) in enumerate(zip(q, returns, strict=True)))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = np.array([r[1] for r in rows], dtype=float)
    d = np.array([r[3] for r in rows])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(q, lw=0.8, label="Q(s_t, a_t)")
    left.plot(returns, lw=0.8, label="R_t")
    left.set_xlabel("t (agent steps)")
    left.set_title(f"highest-scoring episode: score {episodes[best]['score']:g}, T = {len(q)}")
    left.legend()
    right.scatter(T, d, s=8)
    right.axhline(0, color="gray", lw=0.5)
    right.set_xlabel("episode length T")
    right.set_ylabel("(1/T) sum (Q(s_t, a_t) - R_t)")
    fig.tight_layout()
    fig.savefig(os.path.join(run_dir, "value_analysis.png"), dpi=110)
    plt.close(fig)
    return {
        "episodes": len(rows),
        "mean_normalised_sum_diff": float(d.mean()),
        "mean_normalised_sum_abs_diff": float(np.mean([r[4] for r in rows])),
        "plotted_episode": {"score": rows[best][2], "T": rows[best][1], "diff": rows[best][3], "abs": rows[best][4]},
    }


def video_trigger(episode: int) -> bool:
    """Gymnasium's capped cubic schedule: episodes 0, 1, 8, 27, ..., 729, 1000, 2000, ..."""
    return round(episode ** (1 / 3)) ** 3 == episode if episode < 1000 else episode % 1000 == 0


def write_video(path: str, frames: list[np.ndarray], fps: int = 15):
    from moviepy import ImageSequenceClip

    rgb = [np.repeat(np.kron(f, np.ones((2, 2), dtype=np.uint8))[..., None], 3, -1) for f in frames]  # 210x160
    ImageSequenceClip(rgb, fps=fps).write_videofile(path, logger=None)


# ----------------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------------
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


def eta_seconds(lengths, total_episodes: int, steps_per_second: float) -> tuple[float, float]:
    """Seconds left (low, trend; see `remaining_length`) at the current step rate."""
    low, trend = remaining_length(lengths, total_episodes)
    if trend == 0:
        return 0.0, 0.0
    if steps_per_second <= 0:
        return math.inf, math.inf
    return low / steps_per_second, trend / steps_per_second


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


def fmt_score(value: float | None, spec: str) -> str:
    """A score for the done line, or '-' where there is none (no finished episode, a game outside Table 2)."""
    return "-" if value is None else format(value, spec)


def main(args: Args) -> dict:
    error = validate(args)
    if error is None and args.track:
        try:
            import wandb
        except ImportError:
            error = "--track needs wandb; `pip install wandb` or drop --track"
    if error is None and args.capture_video:
        try:
            import moviepy  # noqa: F401
        except ImportError:
            error = "--capture-video needs moviepy; `pip install moviepy` or drop --capture-video"
    if error:
        raise SystemExit(f"error: {error}")

    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # --- environment, network and checkpoint, all before anything is written ---
    rom = game_from_env_id(args.env_id)
    game = camel_name(rom)
    envs = make_env(args, rom)
    num_actions = int(envs.single_action_space.n)
    arch = architecture(args, rom, num_actions)
    ckpt = None
    if args.resume:
        try:
            ckpt = load_checkpoint(args.resume, args, arch)
        except ValueError as err:
            envs.close()
            raise SystemExit(f"error: {err}") from None
    net = SarsaQNetwork(num_actions, args.activations, args.padding)
    theta, params = flatten_parameters(net, device)
    base = copy.deepcopy(net).to("meta")  # structure only; functional_call supplies theta's views
    N, P = args.num_envs, theta.numel()
    eligibility = torch.zeros(N, P, device=device)  # e, one row per environment
    rng = torch.Generator(device=device).manual_seed(args.seed)
    episodes, global_step = 0, 0  # episodes = i of eq. 15
    history = {"score": [], "length": [], "global_step": []}
    if ckpt is not None:
        theta.copy_(ckpt["theta"].to(device))
        if ckpt["eligibility"].shape == eligibility.shape:  # restored, then reset by the first step of each new episode
            eligibility.copy_(ckpt["eligibility"].to(device))
        episodes, global_step = int(ckpt["episodes"]), int(ckpt["global_step"])
        history = {k: v.tolist() for k, v in ckpt["history"].items()}
        rng.set_state(ckpt["rng_state"])
    start_episode, start_step = episodes, global_step

    run_name = base_name = f"{game}__{args.exp_name}__{args.activations}__{args.seed}__{int(time.time())}"
    attempt = 1
    while os.path.exists(os.path.join("runs", run_name)):  # a run started in the same second gets its own directory
        attempt += 1
        run_name = f"{base_name}-{attempt}"
    run_dir = os.path.join("runs", run_name)
    os.makedirs(run_dir, exist_ok=True)
    if args.track:
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
    video_dir = os.path.join(run_dir, "videos")
    if args.capture_video:
        os.makedirs(video_dir, exist_ok=True)
    print(
        f"{run_name}: {args.activations} net, {P:,} parameters, {num_actions} actions, {N} env(s) "
        f"(traces {N * P * 4 / 1e6:.1f} MB), device {device}"
        + (f"; loaded {args.resume} at episode {episodes:,}, step {global_step:,}" if ckpt else "")
    )
    if ckpt is not None:  # tau(i) goes on from the checkpoint's i with this run's tau0 / tau_k: say so when they differ
        trained = {k: ckpt["args"].get(k) for k in ("tau0", "tau_k")}
        if trained != {"tau0": args.tau0, "tau_k": args.tau_k}:
            tau = temperature(episodes, args.tau0, args.tau_k)
            print(
                f"note: the checkpoint was trained with --tau0 {trained['tau0']} --tau-k {trained['tau_k']}; this run "
                f"uses --tau0 {args.tau0} --tau-k {args.tau_k}, so tau(i) = {tau:.4g} at episode {episodes:,}"
            )
    summary = {
        "args": asdict(args),
        "run_name": run_name,
        "device": str(device),
        "game": game,
        "num_actions": num_actions,
        "num_parameters": P,
        "start_episode": start_episode,
    }
    t_start = time.time()

    def write_outputs(complete: bool):
        """summary.json, episodes.csv, the learning curve and (with --save-model) the checkpoint."""
        elapsed = time.time() - t_start
        scores = np.asarray(history["score"], dtype=np.float64)
        final = float(scores[-args.final_window :].mean()) if len(scores) else float("nan")
        best = best_window_mean(scores, args.final_window)
        ref = TABLE2_SCORES.get(game)
        summary.update(
            complete=complete,
            global_step=global_step,
            episodes=episodes,
            wall_time=elapsed,
            sps=(global_step - start_step) / max(elapsed, 1e-9),
            final_window=min(args.final_window, len(scores)),
            final_mean_score=final if len(scores) else None,
            best_mean_score=best if len(scores) else None,
            final_dqn_normalized=dqn_normalized(final, game),
            best_dqn_normalized=dqn_normalized(best, game),
            random_score=ref[0] if ref else None,
            dqn_score=ref[1] if ref else None,
            paper_final_score=ref[2] if ref else None,
            paper_best_score=ref[3] if ref else None,
            final_temperature=temperature(episodes, args.tau0, args.tau_k),
        )
        with open(os.path.join(run_dir, "episodes.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["episode", "global_step", "score", "length"])
            w.writerows(zip(range(1, len(scores) + 1), history["global_step"], scores, history["length"], strict=True))
        block = 100 if len(scores) >= 1000 else max(len(scores) // 10, 1)
        write_learning_curve(run_dir, scores, block, f"{game} Sarsa(lambda) {args.activations}, {episodes:,} ep.", game)
        if args.save_model and "diverged" not in summary:  # a diverged run keeps its last good checkpoint
            path = os.path.join(run_dir, "sarsa_lambda_silu_atari.pt")
            save_checkpoint(path, args, arch, theta, eligibility, episodes, global_step, history, rng)
            summary["checkpoint"] = path
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)

    # --- the loop: one vectorized gradient call, act, step (the emulators run while we learn), learn, log ---
    interrupted = False
    if args.total_episodes > 0:
        obs_np, info = envs.reset(seed=args.seed + episodes)
        tracker = EpisodeTracker(N, info)
        obs = torch.from_numpy(obs_np).to(device)
        tau = temperature(episodes, args.tau0, args.tau_k)
        actions, _ = select_actions(q_values(base, params, obs), rng, tau=tau)
        envs.send(actions.cpu().numpy().astype(np.int32))
        first_step = torch.ones(N, dtype=torch.bool, device=device)  # obs is the first state of its episode
        env0_episode = 0
        frames = [obs_np[0, -1]] if args.capture_video else None
        abs_td, q_mean, td_count = 0.0, 0.0, 0
        t_log = t_checkpoint = time.time()

        with stop_signals() as stopped:
            while episodes < args.total_episodes and not stopped():
                # Q_t(s_t, a_t) and grad_theta Q_t(s_t, a_t) per env, one vmapped call, while the emulators play a_t
                q_taken, grad_q = q_and_grad(base, params, obs, actions)
                next_obs_np, rewards, terminated, truncated, info = envs.recv()
                learn_np, _, finished = tracker.step(rewards, terminated, truncated, info)
                next_obs = torch.from_numpy(next_obs_np).to(device)
                q_next_all = q_values(base, params, next_obs)  # Q_t(s_{t+1}, .), to choose a_{t+1}
                tau = temperature(episodes, args.tau0, args.tau_k)
                next_actions, _ = select_actions(q_next_all, rng, tau=tau)
                envs.send(next_actions.cpu().numpy().astype(np.int32))  # a reset step ignores its action

                learn = torch.from_numpy(learn_np).to(device)
                ended = torch.from_numpy(terminated | (truncated & args.truncation_is_terminal)).to(device)
                reward = torch.as_tensor(rewards, dtype=torch.float32, device=device)
                if args.clip_rewards:
                    reward = reward.clamp(-1.0, 1.0)
                q_next = q_next_all.gather(1, next_actions[:, None])[:, 0]
                delta = sarsa_lambda_update(
                    theta, eligibility, grad_q, q_taken, reward, q_next, ended & learn, first_step, learn,
                    args.alpha, args.gamma, args.lam,
                )  # fmt: skip
                first_step = ~learn  # after a reset step, next_obs is a new episode's first state

                steps = int(learn_np.sum())
                global_step += steps
                abs_td += float(delta.abs().sum())
                if not math.isfinite(abs_td):  # theta (or a TD error) is no longer finite: nothing more to learn
                    summary["diverged"] = (
                        f"the TD error became non-finite at step {global_step:,} (episode {episodes:,}); theta "
                        f"{'is' if bool(torch.isfinite(theta).all()) else 'is not'} finite"
                    )
                    break
                q_mean += float((q_taken * learn).sum())
                td_count += steps
                if frames is not None:
                    frames.append(next_obs_np[0, -1].copy())
                for env, score, length in finished:
                    if episodes >= args.total_episodes:
                        break
                    episodes += 1
                    history["score"].append(score)
                    history["length"].append(length)
                    history["global_step"].append(global_step)
                    writer.add_scalar("charts/episodic_return", score, global_step)
                    writer.add_scalar("charts/episodic_length", length, global_step)
                    if episodes % args.final_window == 0:
                        recent = np.mean(history["score"][-args.final_window :])
                        writer.add_scalar(f"charts/mean_score_{args.final_window}_by_episode", recent, episodes)
                    if env == 0 and args.capture_video:
                        if frames is not None:
                            write_video(os.path.join(video_dir, f"episode-{env0_episode}.mp4"), frames)
                        env0_episode += 1
                        frames = [] if video_trigger(env0_episode) else None
                obs, actions = next_obs, next_actions

                now = time.time()
                if now - t_log >= args.log_every_seconds or episodes >= args.total_episodes:
                    sps = (global_step - start_step) / (now - t_start)
                    recent = history["score"][-args.final_window :]
                    mean_recent = f"{np.mean(recent):.1f}" if recent else "-"
                    eta = eta_text(*eta_seconds(history["length"], args.total_episodes, sps))
                    writer.add_scalar("charts/SPS", sps, global_step)
                    writer.add_scalar("charts/temperature", tau, global_step)
                    if td_count:
                        writer.add_scalar("losses/abs_td_error", abs_td / td_count, global_step)
                        writer.add_scalar("losses/q_taken", q_mean / td_count, global_step)
                    print(
                        f"episodes {episodes:,}/{args.total_episodes:,} | steps {global_step:,} | {sps:,.0f} steps/s | "
                        f"mean score (last {args.final_window}) {mean_recent} | tau {tau:.4f} | "
                        f"|delta| {abs_td / max(td_count, 1):.4f} | {eta}",
                        flush=True,
                    )
                    abs_td, q_mean, td_count = 0.0, 0.0, 0
                    t_log = now
                    if now - t_checkpoint >= 60 * args.write_every_minutes:
                        write_outputs(complete=False)
                        t_checkpoint = now
            interrupted = stopped() and episodes < args.total_episodes  # a signal after the end changes nothing
        if interrupted:
            print("interrupted: writing the summary, the learning curve and (with --save-model) the checkpoint")
    envs.close()

    write_outputs(complete=not interrupted and "diverged" not in summary)
    if "diverged" in summary:
        writer.close()
        kept = f"; the last good checkpoint is {summary['checkpoint']}" if "checkpoint" in summary else ""
        raise SystemExit(f"error: {summary['diverged']}: stopped (summary.json written{kept})")
    if args.total_episodes > 0:
        print(
            f"done: {episodes:,} episodes, {global_step:,} steps, {summary['sps']:,.0f} steps/s; "
            f"final mean score (last {summary['final_window']}) {fmt_score(summary['final_mean_score'], ',.1f')}, "
            f"best mean {fmt_score(summary['best_mean_score'], ',.1f')}, "
            f"DQN-normalised {fmt_score(summary['final_dqn_normalized'], '.3f')} / "
            f"{fmt_score(summary['best_dqn_normalized'], '.3f')}; "
            f"paper (final / best): {summary['paper_final_score']} / {summary['paper_best_score']}"
        )
        if args.save_model:
            print(f"saved {summary['checkpoint']}")

    # --- evaluation without learning: Table 3, and the value-estimation analysis of §4.1 ---
    if args.eval_episodes > 0 and not interrupted:
        final_tau = temperature(episodes, args.tau0, args.tau_k)
        summary["eval"] = {}
        for k, rule in enumerate(args.eval_selections):
            kind, x = parse_selection(rule, final_tau)
            video = os.path.join(video_dir, f"eval-{kind}-{x:g}.mp4") if args.capture_video else None
            result, value_episodes = evaluate(args, rom, base, params, kind, x, device, collect=k == 0, video=video)
            summary["eval"][f"{kind}:{x:g}"] = result
            print(
                f"eval {kind} {x:g}: mean score {result['mean_score']:.1f} over {result['episodes']} episodes, "
                f"{result['exploratory_actions_per_episode']:.2f} exploratory actions per episode"
            )
            if value_episodes:
                summary["value_analysis"] = write_value_analysis(run_dir, value_episodes, args.gamma)
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
    writer.close()
    if args.track:
        wandb.finish()
    return summary


@torch.no_grad()
def evaluate(args, rom, base, params, kind, x, device, collect=False, video=None):
    """Play --eval-episodes episodes (shared evenly by the environments) without learning, with softmax at tau = x or
    epsilon-greedy with epsilon = x. Returns Table 3's mean score and exploratory actions per episode, and with
    `collect` every episode's Q(s_t, a_t) and clipped rewards for the value analysis (§4.1)."""
    N = args.num_envs
    quota = np.array([args.eval_episodes // N + (k < args.eval_episodes % N) for k in range(N)])
    envs = make_env(args, rom)
    obs_np, info = envs.reset(seed=args.seed + 1_000_000)
    tracker = EpisodeTracker(N, info)
    rng = torch.Generator(device=device).manual_seed(args.seed + 1_000_000)
    done = np.zeros(N, dtype=np.int64)
    explore = np.zeros(N)
    trajectories = [([], []) for _ in range(N)]
    scores, explored, lengths, value_episodes = [], [], [], []
    frames = [obs_np[0, -1]] if video else None
    while (done < quota).any():
        q = q_values(base, params, torch.from_numpy(obs_np).to(device))
        sel = {"tau": x} if kind == "softmax" else {"epsilon": x}
        actions, exploratory = select_actions(q, rng, **sel)
        obs_np, rewards, terminated, truncated, info = envs.step(actions.cpu().numpy().astype(np.int32))
        learn, _, finished = tracker.step(rewards, terminated, truncated, info)
        explore += exploratory.cpu().numpy() & learn
        if collect:
            q_taken = q.gather(1, actions[:, None])[:, 0].cpu().numpy()
            clipped = np.clip(rewards, -1, 1) if args.clip_rewards else rewards
            for k in np.flatnonzero(learn):
                trajectories[k][0].append(float(q_taken[k]))
                trajectories[k][1].append(float(clipped[k]))
        if frames is not None:
            frames.append(obs_np[0, -1].copy())
        for k, score, length in finished:
            if done[k] < quota[k]:
                scores.append(score)
                explored.append(explore[k])
                lengths.append(length)
                if collect:
                    value_episodes.append({"score": score, "q": trajectories[k][0], "rewards": trajectories[k][1]})
            if k == 0 and frames is not None:
                write_video(video, frames)
                frames = None
            done[k] += 1
            explore[k] = 0
            trajectories[k] = ([], [])
    envs.close()
    result = {
        "selection": kind,
        "tau" if kind == "softmax" else "epsilon": x,
        "episodes": len(scores),
        "mean_score": float(np.mean(scores)),
        "std_score": float(np.std(scores)),
        "mean_length": float(np.mean(lengths)),
        "exploratory_actions_per_episode": float(np.mean(explored)),
        "dqn_normalized": dqn_normalized(float(np.mean(scores)), camel_name(rom)),
    }
    return result, value_episodes


if __name__ == "__main__":
    main(tyro.cli(Args))
