"""Deep Sarsa(lambda) with SiLU / dSiLU units, accumulating eligibility traces and softmax action selection on Atari.

Elfwing, Uchibe & Doya (2018), "Sigmoid-weighted linear units for neural network function approximation in
reinforcement learning", §2.1-2.3 and §3.3 (Table 2, Fig. 5); Table 3 and Fig. 7 from a checkpoint:
benchmark/sarsa_analysis.py. Flags, outputs and differences from the paper: docs/sarsa_lambda_silu_atari.md.

    On-policy and online, no replay memory, no target network. At every agent step t, with the parameters theta_t:
    a_{t+1} ~ pi(.|s_{t+1}) = exp(Q_t(s_{t+1}, .) / tau) / sum_b exp(Q_t(s_{t+1}, b) / tau)     (eq. 13)
    delta_t = r_t + gamma Q_t(s_{t+1}, a_{t+1}) - Q_t(s_t, a_t),  Q(terminal, .) = 0           (eq. 3)
    e_t     = gamma lambda e_{t-1} + grad_theta Q_t(s_t, a_t),  e_0 = 0 at every episode start  (eq. 5)
    theta_{t+1} = theta_t + alpha delta_t e_t                                                    (eq. 1)
    tau(i)  = tau0 / (1 + tau_k i), i = episodes finished so far                                (eq. 15)
    r_t is the game reward clipped to [-1, 1]; the TD error is not clipped. `--num-envs N` runs N environments,
    one trace each, and adds their N updates to the one theta (N = 1 is the paper's agent).

One game of Table 2 (12 games, 200,000 episodes, 2 runs each) at the paper's setting:
    python algos/sarsa_lambda_silu_atari.py --env-id ALE/Alien-v5 --seed 1 --save-model
"""

import contextlib
import copy
import csv
import datetime
import importlib.util
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal

import ale_py
import numpy as np
import torch
import torch.nn.functional as F
import tyro
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from envs import atari, code_version, damaged_member  # noqa: E402  (ROM names; this script's protocol is its own, §3.3)

CHECKPOINT_FORMAT = "sarsa_lambda_silu_atari/1"
FRAME_SHAPE = (105, 80)  # §3.3: luminance frames downsampled to 105x80
STACK = 2  # the current and the previous agent step's frame
TABLE2_SCORES = {  # Table 2: (random, DQN (Mnih et al. 2015; envs/atari_scores.csv), paper final, paper best)
    "Alien": (227.8, 3069.0, 1370, 2246),
    "Amidar": (5.8, 739.5, 762, 904),
    "Assault": (222.4, 3359.0, 2415, 2944),
    "Asterix": (210.0, 6012.0, 70942, 100322),
    "Asteroids": (719.1, 1629.0, 6537, 10614),
    "Atlantis": (12850.0, 85641.0, 127651, 128983),
    "BankHeist": (14.2, 429.7, 5, 770),
    "BattleZone": (2360.0, 26300.0, 22930, 29115),
    "BeamRider": (363.9, 6846.0, 1829, 2176),
    "Bowling": (23.1, 42.4, 67, 75),
    "Boxing": (0.1, 71.8, 36, 92),
    "Breakout": (1.7, 401.2, 25, 55),
}


@dataclass
class Args:
    # --- experiment ---
    exp_name: str = "sarsa_lambda_silu_atari"
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the network, the action choices and the emulators (env k of a segment from episode i: seed + i + k)"""
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
    """mp4s of env 0's 105x80 frames under runs/{run_name}/videos/ (its episodes 0, 1, 8, ..., 1000, ... of this
    process: a resumed run counts from its resume)"""
    save_model: bool = False
    """save theta, the traces, the counters, the scores and the sampler to runs/{run_name}/sarsa_lambda_silu_atari.pt"""
    resume: str | None = None
    """checkpoint to go on from (theta, episode counter i, learning curve); every env starts a new episode (e_0 = 0)"""
    log_every_seconds: float = 10.0
    """how often the progress line is printed"""
    write_every_minutes: float = 10.0
    """how often summary.json, episodes.csv, the learning curve and the checkpoint are rewritten (checked at each
    progress line, so at most as often as --log-every-seconds)"""

    # --- environment (§3.3, through ale_py.AtariVectorEnv) ---
    env_id: str = "ALE/Alien-v5"
    """ALE/<Game>-v5; only the game is taken from the id (the protocol is §3.3's, e.g. no sticky actions)"""
    num_envs: int = 1
    """environments, each with its own eligibility trace, sharing theta (1 = the paper's agent)"""
    frame_skip: int = 4
    """emulator frames per action (the observation is the max of the last two frames)"""
    noop_max: int = 30
    """no-op starts: a uniform number in 0..noop_max-1 of no-op frames before an episode's first state (0 = none)"""
    max_episode_frames: int = 18_000
    """episode cap in emulator frames (18,000 = 5 minutes of play = 4,500 agent steps)"""
    fire_reset: bool = False
    """press FIRE after every reset in games that have it (the paper does not)"""
    truncation_is_terminal: bool = True
    """treat the --max-episode-frames cut as terminal (Q = 0) rather than bootstrapping"""

    # --- algorithm: Sarsa(lambda), §2.1, §2.3, §3.3 ---
    total_episodes: int = 200_000
    """training episodes over all environments, counted from the start of the run (a resumed run goes on to it)"""
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
    """learn from rewards clipped to [-1, 1] (§3.3); the logged scores are the raw game scores"""

    # --- network ---
    activations: str = "silu-dsilu"
    """activation of the conv layers - of the fc layer, each silu | dsilu | relu | sigmoid"""
    padding: Literal["same", "valid"] = "same"
    """padding of the convolutions and max-pools (the paper does not say): TensorFlow 'SAME', or none"""
    final_window: int = 100
    """episodes behind the final mean score and the best block mean (Table 2)"""


# --- Environment (§3.3) -----------------------------------------------------------------------------------------------
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
        use_fire_reset=args.fire_reset,  # no sticky actions
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
        reward_clipping=False,  # a lost life is not terminal
    )


class EpisodeTracker:
    """ale_py's NEXT_STEP autoreset: after a step that ends an episode, the env's next step is a reset step (its action
    is ignored; it returns a new episode's first state with reward 0). That is no transition: nothing is learned, no
    step counted, and the old trace ends. Known from the previous step's flags or the frame counter going back."""

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


# --- Activations (§2.2) and network (§3.3) ----------------------------------------------------------------------------
def silu(z):
    """SiLU, eq. 9: a = z sigma(z)."""
    return z * torch.sigmoid(z)


def dsilu(z):
    """dSiLU, eq. 10: a = sigma(z) (1 + z (1 - sigma(z))), the derivative of the SiLU."""
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s))


ACTIVATIONS = {"silu": silu, "dsilu": dsilu, "relu": torch.relu, "sigmoid": torch.sigmoid}


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
    Padding (the paper gives none): 'same' is TensorFlow's (zeros for the convolutions, -inf for the max-pools), 384
    inputs to the fc layer; 'valid' pads nothing, 64 inputs. PyTorch's default initialisation; pixels in [0, 1]."""

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
    With one environment plain autograd gives the same numbers about twice as fast on a CPU, so N = 1 takes it."""
    if len(obs) == 1:
        p = {name: v.detach().requires_grad_(True) for name, v in params.items()}
        q_sa = functional_call(net, p, (obs,))[0, actions[0]]
        grads = torch.autograd.grad(q_sa, list(p.values()))
        return q_sa.detach()[None], torch.cat([g.flatten() for g in grads])[None]

    def q_taken(p, s, a):
        q_sa = functional_call(net, p, (s[None],))[0].gather(0, a[None])[0]
        return q_sa, q_sa

    grads, q_sa = vmap(grad(q_taken, has_aux=True), in_dims=(None, 0, 0))(params, obs, actions)
    return q_sa, torch.cat([g.flatten(1) for g in grads.values()], 1)  # same order as theta


# --- Sarsa(lambda) (§2.1) and softmax selection (§2.3) ----------------------------------------------------------------
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
    """One online Sarsa(lambda) step for N environments in the paper's order, everything computed with theta_t:
    delta_t (eq. 3), e_t (eq. 5), theta_{t+1} (eq. 1). grad_q (N, P) and q_taken (N,) are grad_theta Q_t(s_t, a_t)
    and Q_t(s_t, a_t); q_next (N,) is Q_t(s_{t+1}, a_{t+1}); terminal: s_{t+1} is terminal; first_step: s_t starts
    its episode (e_{t-1} = 0); learn: a real transition (not an ale_py reset step, whose trace is cleared and delta
    is 0). Returns delta_t (N,)."""
    delta = td_error(reward, q_next, q_taken, terminal, gamma) * learn
    decay = gamma * lam * (learn & ~first_step).to(theta.dtype)
    accumulate_traces(eligibility, grad_q * learn[:, None], decay)
    update_parameters(theta, eligibility, delta, alpha)
    return delta


# --- Bookkeeping: Table 2's scores, checks, checkpoints, outputs, progress --------------------------------------------
def dqn_normalized(score: float | None, game: str) -> float | None:
    """(score - random) / (DQN - random) (§3.3), or None outside Table 2's games."""
    ref = TABLE2_SCORES.get(game)
    return (score - ref[0]) / (ref[1] - ref[0]) if ref and score is not None and math.isfinite(score) else None


def best_window_mean(scores: np.ndarray, window: int) -> float:
    """Table 2's "highest mean scores (over every 100 episodes)": the best mean over the non-overlapping blocks of
    `window` episodes (an unfinished last block does not count); with fewer episodes, the mean of all of them."""
    if len(scores) < window:
        return float(np.mean(scores)) if len(scores) else float("nan")
    n_blocks = len(scores) // window
    return float(np.asarray(scores[: n_blocks * window], dtype=np.float64).reshape(n_blocks, window).mean(1).max())


def validate(args: Args) -> str | None:
    """One clear line for each impossible setting, checked before anything is written."""
    if atari.game_from_env_id(args.env_id) is None:
        return atari.unknown_env_message(args.env_id)
    if any(act not in ACTIVATIONS for act in args.activations.partition("-")[::2]):
        return f"unknown --activations {args.activations!r}; use CONV-FC, each of {' | '.join(ACTIVATIONS)}"
    if args.num_envs < 1:
        return f"--num-envs must be at least 1, got {args.num_envs}"
    traces_bytes = args.num_envs * num_parameters(18, args.padding) * 4
    if traces_bytes + 2**30 > os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"):
        return f"--num-envs {args.num_envs} needs {traces_bytes / 1e9:.1f} GB of eligibility traces; lower it"
    if args.total_episodes < 1:
        return "--total-episodes must be at least 1 (evaluate a checkpoint with benchmark/sarsa_analysis.py)"
    for name in ("alpha", "gamma", "lam", "tau0", "tau_k"):
        if not math.isfinite(getattr(args, name)):
            return f"--{name.replace('_', '-')} must be a finite number, got {getattr(args, name)}"
    if args.alpha <= 0 or args.tau0 <= 0 or args.tau_k < 0 or args.final_window < 1:
        return "--alpha, --tau0 and --final-window must be positive and --tau-k non-negative"
    if not (0 <= args.gamma <= 1 and 0 <= args.lam <= 1):
        return "--gamma and --lam must lie in [0, 1]"
    if args.frame_skip < 1 or args.noop_max < 0 or args.max_episode_frames < 1:
        return "--frame-skip and --max-episode-frames must be positive and --noop-max non-negative"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto"
    for flag, module in (("track", "wandb"), ("capture_video", "moviepy")):
        if getattr(args, flag) and importlib.util.find_spec(module) is None:
            return f"--{flag.replace('_', '-')} needs {module}; `pip install {module}` or drop the flag"


def load_checkpoint(path: str, arch: dict | None = None, total_episodes: int = 0, flag: str = "--resume") -> dict:
    """Load a checkpoint and check it against the requested architecture; raises ValueError with one clear line."""
    where = f"{flag} {path!r}"
    if not os.path.isfile(path):
        raise ValueError(f"{where}: no such file")
    if member := damaged_member(path):  # torch.load does not check the zip's CRC-32 records
        raise ValueError(f"{where} is damaged ({member} fails its CRC-32 check); restore it from a copy or start again")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any unpickling failure means the file is not a checkpoint)
        raise ValueError(f"{where} is not a readable checkpoint ({type(err).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{where} is not a sarsa_lambda_silu_atari checkpoint")
    have = ckpt["architecture"]
    if diff := [f"{k}: checkpoint {have.get(k)} vs requested {v}" for k, v in (arch or {}).items() if have.get(k) != v]:
        raise ValueError(f"{where} holds another architecture ({', '.join(diff)}); pass matching flags")
    if ckpt["theta"].shape != (have["num_parameters"],):
        raise ValueError(f"{where} is damaged: theta has shape {tuple(ckpt['theta'].shape)}")
    if ckpt["episodes"] >= total_episodes > 0:
        raise ValueError(
            f"{where} is already at episode {ckpt['episodes']:,}; raise --total-episodes above it (it "
            "counts from the run's start) or evaluate it with benchmark/sarsa_analysis.py"
        )
    return ckpt


def eta(lengths: list, total_episodes: int, steps_per_second: float) -> str:
    """Time left if every remaining episode is as long as the mean of the last 100, at the run's step rate (too short
    while episodes lengthen as the agent learns); '?' before the first episode has ended."""
    steps = max(total_episodes - len(lengths), 0) * float(np.mean(lengths[-100:] or [math.inf]))
    known = math.isfinite(steps) and steps_per_second > 0
    return str(datetime.timedelta(seconds=round(steps / steps_per_second))) if known else "?"


def write_video(path: str, frames: list[np.ndarray], fps: int = 15):
    from moviepy import ImageSequenceClip

    rgb = [np.repeat(np.kron(f, np.ones((2, 2), dtype=np.uint8))[..., None], 3, -1) for f in frames]  # 210x160
    ImageSequenceClip(rgb, fps=fps).write_videofile(path, logger=None)


class Run:
    """runs/{run_name}/: tensorboard, wandb, summary.json, episodes.csv, learning curve, videos; printed lines."""

    def __init__(self, args: Args, summary: dict, ckpt: dict | None, obs: np.ndarray):
        self.args, self.summary, game, episodes = args, summary, summary["game"], summary["start_episode"]
        name = base = f"{game}__{args.exp_name}__{args.activations}__{args.seed}__{int(time.time())}"
        attempt = 1
        while os.path.exists(os.path.join("runs", name)):  # a run started in the same second gets its own directory
            attempt += 1
            name = f"{base}-{attempt}"
        if args.track:
            import wandb

            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config=vars(args),
                name=name,
                save_code=True,
            )
        summary["run_name"], self.dir = name, os.path.join("runs", name)
        self.writer = SummaryWriter(self.dir)
        table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
        self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        self.capture_video, self.video_episode = args.capture_video, 0
        self.frames = [obs[0, -1]] if args.capture_video else None
        P, loaded = summary["num_parameters"], f"; loaded {args.resume} at episode {episodes:,}" if ckpt else ""
        if ckpt and (trained := (ckpt["args"].get("tau0"), ckpt["args"].get("tau_k"))) != (args.tau0, args.tau_k):
            loaded += f" (note: trained with --tau0 {trained[0]} --tau-k {trained[1]}; tau(i) now follows this run's)"
        print(
            f"{name}: {P:,} parameters, {summary['num_actions']} actions, {args.num_envs} env(s) (traces "
            f"{args.num_envs * P * 4 / 1e6:.1f} MB), device {summary['device']}{loaded}"
        )

    def video(self, obs: np.ndarray, episode_ended: bool):
        """Env 0's frames; mp4s of its episodes 0, 1, 8, 27, ..., 729, 1000, 2000, ... (Gymnasium's capped cubic)."""
        if self.frames is not None:
            self.frames.append(obs[0, -1].copy())
            if episode_ended:
                os.makedirs(os.path.join(self.dir, "videos"), exist_ok=True)
                write_video(os.path.join(self.dir, "videos", f"episode-{self.video_episode}.mp4"), self.frames)
        if episode_ended:
            n = self.video_episode = self.video_episode + 1
            cubic = round(n ** (1 / 3)) ** 3 == n if n < 1000 else n % 1000 == 0
            self.frames = [] if self.capture_video and cubic else None

    def progress(self, history: dict, episodes, global_step, sps, tau, abs_td, q_sum, td_count):
        """tensorboard: rate, temperature, mean |delta| and Q(s_t, a_t) since the last line; the progress line."""
        args, writer, recent = self.args, self.writer, history["score"][-self.args.final_window :]
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("charts/temperature", tau, global_step)
        if td_count:
            writer.add_scalar("losses/abs_td_error", abs_td / td_count, global_step)
            writer.add_scalar("losses/q_taken", q_sum / td_count, global_step)
        print(
            f"episodes {episodes:,}/{args.total_episodes:,} | steps {global_step:,} | {sps:,.0f} steps/s | mean "
            f"score (last {args.final_window}) {np.mean(recent) if recent else math.nan:.1f} | tau {tau:.4f} | "
            f"|delta| {abs_td / max(td_count, 1):.4f} | ETA {eta(history['length'], args.total_episodes, sps)} "
            "(episodes as long as the last 100)",
            flush=True,
        )

    def write(self, history: dict) -> None:
        """summary.json with Table 2's scores, episodes.csv, and the learning curve (Fig. 5) as CSV and PNG."""
        args, game, scores = self.args, self.summary["game"], np.asarray(history["score"], dtype=np.float64)
        final = float(scores[-args.final_window :].mean()) if len(scores) else None
        best = best_window_mean(scores, args.final_window) if len(scores) else None
        ref = TABLE2_SCORES.get(game, (None,) * 4)
        self.summary.update(
            final_window=min(args.final_window, len(scores)),
            final_mean_score=final,
            best_mean_score=best,
            final_dqn_normalized=dqn_normalized(final, game),
            best_dqn_normalized=dqn_normalized(best, game),
            random_score=ref[0],
            dqn_score=ref[1],
            paper_final_score=ref[2],
            paper_best_score=ref[3],
        )
        with open(os.path.join(self.dir, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=2)
        with open(os.path.join(self.dir, "episodes.csv"), "w", newline="") as f:
            csv.writer(f).writerows(
                [
                    ("episode", "global_step", "score", "length"),
                    *zip(range(1, len(scores) + 1), history["global_step"], scores, history["length"], strict=True),
                ]
            )
        block = 100 if len(scores) >= 1000 else max(len(scores) // 10, 1)
        means = scores[: len(scores) // block * block].reshape(-1, block).mean(1)  # mean score per block of episodes
        with open(os.path.join(self.dir, "learning_curve.csv"), "w", newline="") as f:
            csv.writer(f).writerows(
                [("episode", f"mean_score_{block}"), *(((b + 1) * block, f"{m:.3f}") for b, m in enumerate(means))]
            )
        if len(means):
            from matplotlib.figure import Figure

            fig = Figure(figsize=(7, 4.5), layout="tight")
            ax = fig.subplots()
            ax.plot((np.arange(len(means)) + 1) * block, means, "k-", lw=1.5, label="Sarsa(lambda), this run")
            for value, label, color in zip(ref[:3], ("DQN", "random", "paper, final"), "rkb", strict=True):
                if value is not None:
                    ax.axhline(value, color=color, ls=":", lw=0.8, label=f"{label} ({value:g})")
            ax.set(xlabel="episode", ylabel=f"mean score per {block} episodes")
            ax.set_title(f"{game} Sarsa(lambda) {args.activations}, {self.summary['episodes']:,} episodes", fontsize=9)
            ax.legend(fontsize=8)
            fig.savefig(os.path.join(self.dir, "learning_curve.png"), dpi=110)

    def done(self) -> None:
        """The done line, or the one-line error of a diverged run."""
        s = self.summary
        self.writer.close()
        if "diverged" in s:
            kept = f"; the last good checkpoint is {s['checkpoint']}" if "checkpoint" in s else ""
            raise SystemExit(f"error: {s['diverged']}: stopped (summary.json written{kept})")
        final, best = (math.nan if s[k] is None else s[k] for k in ("final_mean_score", "best_mean_score"))
        print(
            f"done: {s['episodes']:,} episodes, {s['global_step']:,} steps, {s['sps']:,.0f} steps/s; final mean "
            f"score (last {s['final_window']}) {final:,.1f}, best mean {best:,.1f} (paper: {s['paper_final_score']} "
            f"/ {s['paper_best_score']}); DQN-normalised and more in {self.dir}/summary.json"
        )
        if self.args.save_model:
            print(f"saved {s['checkpoint']}")


@contextlib.contextmanager
def stop_signals():
    """`with stop_signals() as stopped:` SIGINT and SIGTERM set a flag that the loop reads, so that the outputs are
    still written (an exception raised from a handler would land in whatever code runs at that moment)."""
    received = []
    previous = {sig: signal.signal(sig, lambda *_: received.append(1)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield lambda: bool(received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- Main: act -> step (the emulators run while we learn) -> learn -> log ---------------------------------------------
def main(args: Args) -> dict:
    if error := validate(args):
        raise SystemExit(f"error: {error}")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    rom = atari.game_from_env_id(args.env_id)
    envs = make_env(args, rom)
    num_actions = int(envs.single_action_space.n)
    arch = {
        "game": rom,
        "num_actions": num_actions,
        "activations": args.activations,
        "padding": args.padding,
        "num_parameters": num_parameters(num_actions, args.padding),
    }
    try:
        ckpt = load_checkpoint(args.resume, arch, args.total_episodes) if args.resume else None
        # the generator's state is per device type (older checkpoints: a CPU state is 5,056 bytes, a CUDA one 16)
        where = ckpt and ckpt.get("device", "cpu" if ckpt["rng_state"].numel() > 16 else "cuda")
        if where and where != device.type:
            raise ValueError(f"--resume {args.resume!r} was written on {where}; pass --device {where}")
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
    if ckpt is not None:  # every env starts a new episode, whose first step restarts its trace at e_0 = 0
        theta.copy_(ckpt["theta"].to(device))
        episodes, global_step = int(ckpt["episodes"]), int(ckpt["global_step"])
        history = {k: v.tolist() for k, v in ckpt["history"].items()}
        rng.set_state(ckpt["rng_state"])
    summary = {
        "args": asdict(args),
        "code": code_version(),
        "device": str(device),
        "game": atari.camel_name(rom),
        "num_actions": num_actions,
        "num_parameters": P,
        "start_episode": episodes,
    }
    start_step, t_start = global_step, time.time()

    def write(complete: bool):  # summary.json, episodes.csv, the learning curve and (with --save-model) the checkpoint
        elapsed = time.time() - t_start
        summary.update(
            complete=complete,
            global_step=global_step,
            episodes=episodes,
            wall_time=elapsed,
            sps=(global_step - start_step) / max(elapsed, 1e-9),
            final_temperature=temperature(episodes, args.tau0, args.tau_k),
        )
        if args.save_model and "diverged" not in summary:  # a diverged run keeps its last good checkpoint
            summary["checkpoint"] = path = os.path.join(run.dir, "sarsa_lambda_silu_atari.pt")
            torch.save(
                {
                    "format": CHECKPOINT_FORMAT,
                    "architecture": arch,
                    "num_envs": N,
                    "theta": theta.cpu(),
                    "eligibility": eligibility.cpu(),
                    "episodes": episodes,
                    "global_step": global_step,
                    "history": {k: torch.tensor(v) for k, v in history.items()},
                    "rng_state": rng.get_state().cpu(),
                    "device": device.type,
                    "args": asdict(args),
                },
                f"{path}.tmp",
            )
            os.replace(f"{path}.tmp", path)  # atomic: a stop while writing keeps the previous checkpoint
        run.write(history)

    obs_np, info = envs.reset(seed=args.seed + episodes)
    run = Run(args, summary, ckpt, obs_np)
    tracker = EpisodeTracker(N, info)
    obs = torch.from_numpy(obs_np).to(device)
    actions, _ = select_actions(q_values(base, params, obs), rng, tau=temperature(episodes, args.tau0, args.tau_k))
    envs.send(actions.cpu().numpy().astype(np.int32))
    first_step = torch.ones(N, dtype=torch.bool, device=device)  # obs is the first state of its episode
    abs_td, q_sum, td_count, t_log, t_write = 0.0, 0.0, 0, t_start, t_start
    with stop_signals() as stopped:
        while episodes < args.total_episodes and not stopped():
            # act: Q_t(s_t, a_t) and grad_theta Q_t(s_t, a_t) per env (one vmapped call) while the emulators play a_t
            q_taken, grad_q = q_and_grad(base, params, obs, actions)
            next_obs_np, rewards, terminated, truncated, info = envs.recv()
            learn_np, _, finished = tracker.step(rewards, terminated, truncated, info)
            next_obs = torch.from_numpy(next_obs_np).to(device)
            q_next_all = q_values(base, params, next_obs)  # Q_t(s_{t+1}, .), to choose a_{t+1}
            tau = temperature(episodes, args.tau0, args.tau_k)
            next_actions, _ = select_actions(q_next_all, rng, tau=tau)
            envs.send(next_actions.cpu().numpy().astype(np.int32))  # a reset step ignores its action

            # learn: delta_t (eq. 3), e_t (eq. 5), theta_{t+1} (eq. 1), all from theta_t
            learn = torch.from_numpy(learn_np).to(device)
            ended = torch.from_numpy(terminated | (truncated & args.truncation_is_terminal)).to(device)
            reward = torch.as_tensor(rewards, dtype=torch.float32, device=device)
            reward = reward.clamp(-1.0, 1.0) if args.clip_rewards else reward
            q_next = q_next_all.gather(1, next_actions[:, None])[:, 0]
            delta = sarsa_lambda_update(
                theta,
                eligibility,
                grad_q,
                q_taken,
                reward,
                q_next,
                ended & learn,
                first_step,
                learn,
                args.alpha,
                args.gamma,
                args.lam,
            )
            first_step = ~learn  # after a reset step, next_obs is a new episode's first state
            obs, actions = next_obs, next_actions

            # log
            steps = int(learn_np.sum())
            global_step, td_count = global_step + steps, td_count + steps
            abs_td += float(delta.abs().sum())
            q_sum += float((q_taken * learn).sum())
            if not math.isfinite(abs_td):  # theta (or a TD error) is no longer finite: nothing more to learn
                summary["diverged"] = f"the TD error became non-finite at step {global_step:,} (episode {episodes:,})"
                break
            finished = finished[: args.total_episodes - episodes]  # a last step may end more episodes than needed
            for _, score, length in finished:
                episodes += 1
                for key, value in zip(history, (score, length, global_step), strict=True):
                    history[key].append(value)
                run.writer.add_scalar("charts/episodic_return", score, global_step)
                run.writer.add_scalar("charts/episodic_length", length, global_step)
                if episodes % args.final_window == 0:
                    recent = np.mean(history["score"][-args.final_window :])
                    run.writer.add_scalar(f"charts/mean_score_{args.final_window}_by_episode", recent, episodes)
            run.video(next_obs_np, episode_ended=any(env == 0 for env, _, _ in finished))
            if (now := time.time()) - t_log >= args.log_every_seconds or episodes >= args.total_episodes:
                sps = (global_step - start_step) / (now - t_start)
                run.progress(history, episodes, global_step, sps, tau, abs_td, q_sum, td_count)
                abs_td, q_sum, td_count, t_log = 0.0, 0.0, 0, now
                if now - t_write >= 60 * args.write_every_minutes:
                    write(complete=False)
                    t_write = now
        interrupted = stopped() and episodes < args.total_episodes  # a signal after the end changes nothing
    envs.close()
    if interrupted:
        print("interrupted: writing the summary, the learning curve and (with --save-model) the checkpoint")
    write(complete=not interrupted and "diverged" not in summary)
    run.done()
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
