"""DQN whose penultimate layer is a Soft MoE, a Top1-MoE or a (widened) dense layer, on ALE games.

Obando-Ceron, Sokar, Willi et al. (ICML 2024), "Mixtures of Experts Unlock Parameter Scaling for Deep RL", §2.2
(Soft MoE), §3 (the MoE replaces the penultimate dense layer; tokens are slices of the encoder output) and §4 (DQN,
Figures 1, 4-10 and 13), as the reference code `dopamine/labs/moes` builds it (shared/reference/softmoe_dopamine.md).

    tokens X (m x d) from the encoder output C (h x w x d): PerConv = h*w tokens of size d (default),
    PerFeat = d tokens of size h*w, PerSamp = 1 token of size h*w*d
    logits  L = X Phi,  Phi in R^{d x (n*p)}, p = ceil(m / n) slots per expert
    D_ij = exp(L_ij) / sum_i' exp(L_i'j)      dispatch: softmax over the m tokens, per slot
    C_ij = exp(L_ij) / sum_j' exp(L_ij')      combine: softmax over all n*p slots, per token
    X~ = D^T X,   Y~_i = f_{floor(i/p)}(X~_i),   Y = C Y~                         (§2.2)
    Q(s, .) = Dense(flatten(Y))

    Top1-MoE: router softmax(X W_r) picks one expert per token; each expert takes at most C = ceil(m / n) tokens in
    token order; an overflowing token outputs zero; a kept token outputs gate * f_e(x).

    DQN: y = sum_{k<n} gamma^k clip(r_{t+k}, -1, 1) + gamma^n (1 - terminal) max_a' Q_target(s_{t+n}, a'),
         loss = mean (y - Q(s_t, a_t))^2          (n = --n-step = 1 in the paper's DQN, Dopamine's update_horizon)

Environment: ale_py's native vector env (C++ threads, frame skip 4 with max-pool, 84x84 grayscale, 4-frame stack), by
default with Dopamine's protocol (sticky actions 0.25, no no-op starts, game over only, 108k-frame cap); rewards are
clipped in the agent so the logged returns are game scores. The transition cut by the 108k-frame cap is stored but
never sampled, as in the paper-era Dopamine (its runner ends that episode with is_terminal=False and the replay marks
the row invalid). Replay stores every frame once and rebuilds the stacks when it samples.

The paper's DQN setting (Impala encoder, Soft MoE with 8 experts, 50M agent steps = 200M frames; §2 and §4: "we mostly
use the newer Impala architecture", which Figs. 1, 4, 8, 9 and 10 use):
    python algos/dqn_softmoe.py --env-id ALE/Breakout-v5
its baselines:  --moe none  (Fig. 1 scaled baseline: --moe none --width-multiplier 8), the Nature CNN (Fig. 7's
comparison): --encoder nature, Top1-MoE (Figs. 1, 9): --moe top1 [--load-balance-coef 1.0], tokenizations (Fig. 6):
--tokenization perfeat|persamp, small experts (Fig. 5): --expert-width 64, random Phi (Fig. 8): --random-phi,
normalisation (Fig. 13): --moe-normalize, replay ratio (Fig. 4): --replay-ratio 1.0; Fig. 10's analyses are logged
every --analysis-every steps.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import json
import math
import os
import random
import re
import signal
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

import ale_py
import numpy as np
import torch
import torch.nn.functional as F
import tyro
from torch import nn
from torch.utils.tensorboard import SummaryWriter

SCRIPT = Path(__file__).stem  # names the experiment, the checkpoint file and its format
FRAME_SHAPE = (84, 84)
STACK = 4


@dataclass
class Args:
    # --- experiment ---
    exp_name: str = SCRIPT
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the network initialisation, the exploration, the replay sampling and the emulators (env i: seed + i)"""
    device: str = "auto"
    """'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N'"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    cuda_graph: bool = False
    """on a CUDA device: record one update (loss, backward, Adam step) and the acting pass as CUDA graphs at the first
    update and replay them; the same maths, without the per-kernel launch cost that bounds an eager loop on a GPU
    (the noise and augmentation draws differ from eager mode's)"""
    track: bool = False
    """log to Weights & Biases (needs `pip install wandb`)"""
    wandb_project_name: str = "softmoe-deep-rl"
    """the wandb project"""
    wandb_entity: str | None = None
    """the wandb entity (team)"""
    capture_video: bool = False
    """write what the agent sees (84x84 frames of env 0) as mp4 under runs/{run_name}/videos/, for episodes 0, 1, 8,
    27, ..., 1000, 2000, ... of env 0"""
    save_model: bool = False
    """save the networks, the optimiser, the counters, the episode history and the random generators to
    runs/{run_name}/{script}.pt, at the end and every --write-every-minutes"""
    checkpoint_replay: bool = False
    """with --save-model: also save the replay memory (and the PER priorities) beside the checkpoint as
    {script}_replay_{step}.npz (7,064 bytes per stored transition: 0.7 GB at 100k), so that --resume goes on learning
    from the same memory at once instead of refilling it for --learning-starts steps"""
    resume: Annotated[str | None, tyro.conf.arg(aliases=("--load-model",))] = None
    """checkpoint to resume (alias --load-model): networks, optimiser, counters, episode history, random generators
    and, if it was saved with --checkpoint-replay, the replay memory. --total-timesteps counts from the start of the
    original run. The emulator state is not saved (ale_py's vector env cannot clone it), so every environment starts a
    new episode"""
    log_every_seconds: float = 10.0
    """how often the progress line is printed"""
    save_replay: str | None = None
    """write every transition into this folder in the DQN Replay Dataset's format (gzipped .npy checkpoint files, as
    batch_rl logged them), with the run's episode returns, for `cql_softmoe.py --dataset-dir`"""
    save_replay_rows: int = 1_000_000
    """rows per checkpoint file of --save-replay (the dataset's 1M; smaller files for small runs)"""
    write_every_minutes: Annotated[float, tyro.conf.arg(aliases=("--checkpoint-every-minutes",))] = 30.0
    """how often summary.json, episodes.csv, the learning curve and (with --save-model) the checkpoint are rewritten
    mid-run (alias --checkpoint-every-minutes)"""

    # --- environment (ale_py.AtariVectorEnv) ---
    env_id: str = "ALE/Breakout-v5"
    """Gymnasium ALE id, ALE/<Game>-v5; the protocol is set by --protocol, not by the id"""
    protocol: Literal["dopamine", "nature", "atari100k"] = "dopamine"
    """dopamine: sticky actions 0.25, no no-op starts, episode ends at game over (the paper's setting);
    nature: no sticky actions, 0-29 no-op frames at every game start, a lost life is terminal for learning; atari100k:
    no sticky actions, 0-29 no-op agent steps at every game start, a lost life is terminal for learning (Dopamine's
    Atari-100k runner).
    A lost life that is terminal starts a new frame stack, as Dopamine's agent does; returns are whole games"""
    num_envs: int = 1
    """environments stepped together; the number of gradient updates per environment step stays --replay-ratio"""
    max_episode_frames: int = 108_000
    """episode cap in emulator frames (Dopamine's max_steps_per_episode 27,000 agent steps)"""
    truncation_is_terminal: bool = False
    """store the --max-episode-frames cut as a terminal transition (Dopamine at HEAD) instead of an invalid one that is
    never sampled (the paper-era Dopamine)"""

    # --- algorithm: DQN with the labs/moes defaults (dqn.gin) ---
    total_timesteps: int = 50_000_000
    """agent steps (actions) summed over the environments; 50M = 200 iterations x 250k (200M frames)"""
    iteration_steps: int = 250_000
    """agent steps per Dopamine iteration (training_steps): the mean return of the training episodes that end in
    each iteration is reported (summary.json `iteration_returns`, tensorboard charts/iteration_return)"""
    learning_rate: float = 6.25e-5
    """Adam learning rate"""
    adam_eps: float = 1.5e-4
    """Adam epsilon"""
    phi_adam_eps: float | None = None
    """an ablation, off by default: Adam's epsilon for Soft MoE's Phi alone (the rest keeps --adam-eps). At
    initialisation Phi's gradient is far below eps = 1.5e-4 (~1e-7 RMS for the Nature CNN with 4 experts), so Adam
    moves Phi at a small fraction of the learning rate; logged as losses/phi_grad_rms"""
    buffer_size: int = 1_000_000
    """replay capacity in transitions (Dopamine replay_capacity), shared evenly by the environments"""
    gamma: float = 0.99
    """discount factor gamma"""
    n_step: int = 1
    """n of the n-step return (update_horizon; 1 in the paper's DQN)"""
    batch_size: int = 32
    """transitions per gradient update"""
    replay_ratio: float = 0.25
    """gradient updates per agent step: 0.25 = one update every 4 steps (Dopamine update_period 4 x
    num_updates_per_train_step 1); the paper's Fig. 4 raises it"""
    target_network_frequency: int = 8000
    """agent steps between hard copies of the online network into the target network (target_update_period)"""
    learning_starts: int = 20_000
    """agent steps before the first update (min_replay_history); learning also waits until a whole stack and its
    n-step successor are in memory"""
    end_e: float = 0.01
    """final exploration rate epsilon (epsilon_train)"""
    epsilon_decay_steps: int = 250_000
    """agent steps over which epsilon falls linearly from 1 to --end-e once --learning-starts is reached
    (epsilon_decay_period)"""

    # --- network ---
    encoder: Literal["impala", "nature"] = "impala"
    """impala: 3 ResNet stacks 16/32/32 (output 11x11x32; the paper's main encoder); nature: 3 convs 32/64/64 (output
    11x11x64; Fig. 7); TF 'SAME' padding as the reference"""
    moe: Literal["softmoe", "top1", "none"] = "softmoe"
    """what replaces the penultimate dense layer: Soft MoE, Top1-MoE, or none (the dense 512-unit baseline)"""
    num_experts: int | None = None
    """experts n (default 8, as the reference's DQN configs)"""
    tokenization: Literal["perconv", "perfeat", "persamp"] | None = None
    """how the encoder output becomes tokens (default perconv, the paper's choice)"""
    expert_width: int | None = None
    """hidden units of each expert (default 512; the paper's Fig. 5 uses 512 / n)"""
    random_phi: bool = False
    """softmoe: redraw Phi from N(0, 1) at every forward call instead of learning it (Fig. 8 right)"""
    moe_normalize: bool = False
    """softmoe: l2-normalise the tokens and the columns of Phi, times a learned scalar, for the logits (Fig. 13)"""
    width_multiplier: int = 1
    """none: widen the penultimate dense layer to 512 x k units (the scaled baseline of Fig. 1)"""
    load_balance_coef: float = 0.0
    """top1: weight of the importance and load losses added to the TD loss (0 = off, the reference's default; the
    reference's weights are 1.0)"""
    bf16: bool = False
    """run the encoder in bfloat16 autocast (about 2x faster convolutions on CPUs with AVX512-BF16/AMX and on GPUs);
    the dense layer, the MoE, the head and the loss stay float32. Off by default: the reference trains in float32"""

    # --- analysis (Fig. 10) ---
    analysis_every: int = 250_000
    """agent steps between network analyses on 32 replay transitions (dormant neurons; feature norm and srank of the
    head's input and of the experts' hidden layer; empirical NTK rank of the per-sample training loss; expert load;
    Soft MoE's routing entropies and token diversity); 0 = never"""
    ntk_memory_mb: int = 512
    """memory for the per-sample gradients of the empirical NTK; larger networks take several passes"""


# ----------------------------------------------------------------------------------------------------------------------
# Setup: defaults, validation, the game
# ----------------------------------------------------------------------------------------------------------------------
def fill_defaults(args: Args) -> Args:
    """MoE settings left at None get the reference's values (only for the MoE variants, so misuse is detectable)."""
    if args.moe != "none":
        args.num_experts = 8 if args.num_experts is None else args.num_experts
        args.tokenization = args.tokenization or "perconv"
        args.expert_width = 512 if args.expert_width is None else args.expert_width
    return args


def validate(args: Args) -> str | None:
    """One clear line for each impossible setting, checked before anything is written."""
    if game_from_env_id(args.env_id) is None:
        return unknown_env_message(args.env_id)
    error = validate_network(args) or validate_common(args)
    if error:
        return error
    if not 0 <= args.end_e <= 1:
        return "--end-e must lie in [0, 1]"
    return None


def validate_network(args: Args) -> str | None:
    if args.moe == "none":
        for flag, value in (("--num-experts", args.num_experts), ("--tokenization", args.tokenization)):
            if value is not None:
                return f"{flag} needs an MoE; --moe none has a dense penultimate layer (use --moe softmoe or top1)"
        if args.expert_width is not None:
            return "--expert-width needs an MoE; widen the --moe none baseline with --width-multiplier"
    else:
        if args.num_experts < 1:
            return f"--num-experts must be at least 1, got {args.num_experts}"
        if args.expert_width < 1:
            return f"--expert-width must be at least 1, got {args.expert_width}"
        if args.width_multiplier != 1:
            return "--width-multiplier widens the --moe none baseline; scale an MoE with --num-experts"
    if args.moe != "softmoe" and (args.random_phi or args.moe_normalize):
        return "--random-phi and --moe-normalize act on Soft MoE's Phi; they need --moe softmoe"
    if args.phi_adam_eps is not None and (args.moe != "softmoe" or args.random_phi or not args.phi_adam_eps > 0):
        return (
            "--phi-adam-eps sets a positive eps for Soft MoE's learned Phi; it needs --moe softmoe without --random-phi"
        )
    if args.moe != "top1" and args.load_balance_coef != 0:
        return "--load-balance-coef needs --moe top1 (Soft MoE has no router to balance)"
    if args.width_multiplier < 1 or args.load_balance_coef < 0:
        return "--width-multiplier must be at least 1 and --load-balance-coef non-negative"
    return None


def validate_common(args) -> str | None:
    """The checks every script shares: sizes, rates, memory, device."""
    numbers = {k: v for k, v in asdict(args).items() if isinstance(v, float)}
    for name, value in numbers.items():
        if not math.isfinite(value):
            return f"--{name.replace('_', '-')} must be a finite number, got {value}"
    if args.num_envs < 1 or args.batch_size < 1 or args.n_step < 1:
        return "--num-envs, --batch-size and --n-step must be at least 1"
    if args.replay_ratio <= 0 or args.learning_rate <= 0 or args.target_network_frequency < 1:
        return "--replay-ratio, --learning-rate and --target-network-frequency must be positive"
    if args.total_timesteps < 1 or args.learning_starts < 0 or args.epsilon_decay_steps < 1 or args.analysis_every < 0:
        return (
            "--total-timesteps and --epsilon-decay-steps must be positive, --learning-starts and --analysis-every >= 0"
        )
    if args.iteration_steps < 1:
        return "--iteration-steps must be positive"
    if not 0 <= args.gamma <= 1:
        return "--gamma must lie in [0, 1]"
    if args.save_replay_rows < 2 * STACK + args.n_step:
        return f"--save-replay-rows must be at least {2 * STACK + args.n_step}"
    if args.save_replay and not args.resume and os.path.exists(os.path.join(args.save_replay, "add_count_ckpt.0.gz")):
        return f"--save-replay {args.save_replay!r} already holds a dataset; give a new folder (or --resume its run)"
    if args.checkpoint_replay and not args.save_model:
        return "--checkpoint-replay saves the replay memory with the checkpoint; add --save-model"
    rows = -(-args.buffer_size // args.num_envs)
    if rows < 2 * STACK + args.n_step:
        return f"--buffer-size {args.buffer_size} is too small: it needs {2 * STACK + args.n_step} rows per environment"
    needed = rows * args.num_envs * FrameReplay.BYTES_PER_TRANSITION
    available = physical_memory_bytes()
    if needed + 2**30 > available:
        return (
            f"--buffer-size {args.buffer_size:,} needs {needed / 1e9:.1f} GB of replay memory "
            f"({FrameReplay.BYTES_PER_TRANSITION} bytes per transition) plus 1 GB headroom, but this machine has "
            f"{available / 1e9:.1f} GB; lower --buffer-size"
        )
    if args.device != "auto" and args.device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto"
    if args.cuda_graph and (args.device == "cpu" or not torch.cuda.is_available()):
        return "--cuda-graph records CUDA graphs and needs a GPU; drop it on a CPU"
    return None


def make_env(args: Args, rom: str, num_envs: int):
    """ale_py's vector env with the chosen protocol. Rewards come back unclipped (the agent clips them) and each
    observation is a (4, 84, 84) uint8 stack whose frames before the episode start are zero, as in Dopamine.
    No-op starts: 0-29 emulator frames (ale_py) under `nature`; 0-29 agent steps under `atari100k`, as Dopamine's
    100k runner takes them (EpisodeTracker). One difference from Dopamine remains: a lost life does not cut the
    4-frame skip short (its AtariPreprocessing stops at the lost life: 1-3 frames fewer on that step)."""
    sticky = args.protocol == "dopamine"
    life_loss = args.protocol != "dopamine"
    return ale_py.AtariVectorEnv(
        rom,
        num_envs,
        num_threads=min(num_envs, os.cpu_count() or 1),
        repeat_action_probability=0.25 if sticky else 0.0,
        noop_max=30 if args.protocol == "nature" else 0,  # 0-29 emulator frames; atari100k: EpisodeTracker's steps
        life_loss_info=life_loss,  # terminated on a lost life, but the game goes on (no reset)
        episodic_life=False,
        use_fire_reset=False,
        reward_clipping=False,
        max_num_frames_per_episode=args.max_episode_frames,
        frameskip=4,
        maxpool=True,
        img_height=FRAME_SHAPE[0],
        img_width=FRAME_SHAPE[1],
        grayscale=True,
        stack_num=STACK,
        full_action_space=False,
    )


# ----------------------------------------------------------------------------------------------------------------------
# Replay memory: every frame stored once, stacks and n-step returns rebuilt at sample time
# ----------------------------------------------------------------------------------------------------------------------
class FrameReplay:
    """Circular memory of (rows, num_envs) slots; the environments write one row together at every step.

    Row t of env k holds the newest frame of the observation o_t that env k acted on, the action a_t, the clipped
    reward r_{t+1}, the terminal flag of s_{t+1}, `valid` (a_t is a transition that may be learned from: False on the
    final observation of an episode, whose next step is ale_py's reset step, and on the step cut by the time limit)
    and `history`, the number of earlier frames of the same stack in o_t (capped at 3). The stack of row t is frames
    t-3..t with the `3 - history` oldest zeroed, exactly what the agent saw, so a stack never reaches into another
    episode. A sample at row t uses rows t..t+L-1, L = n or up to the first terminal; all of them must be valid.
    """

    BYTES_PER_TRANSITION = FRAME_SHAPE[0] * FRAME_SHAPE[1] + 1 + 4 + 1 + 1 + 1  # frame, action, reward, 3 flags
    ARRAYS = ("frames", "actions", "rewards", "terminals", "valid", "history")

    def __init__(self, capacity: int, num_envs: int):
        self.rows, self.num_envs = -(-capacity // num_envs), num_envs
        shape = (self.rows, num_envs)
        self.frames = np.zeros(shape + FRAME_SHAPE, dtype=np.uint8)  # pages are only touched when written
        self.actions = np.zeros(shape, dtype=np.uint8)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.terminals = np.zeros(shape, dtype=bool)
        self.valid = np.zeros(shape, dtype=bool)
        self.history = np.zeros(shape, dtype=np.uint8)
        self.cursor = 0  # next row to write
        self.count = 0  # rows written, at most self.rows

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.ARRAYS)

    def add(self, frames, actions, rewards, terminals, valid, history):
        """One row for every environment: frames (N, 84, 84), the others (N,)."""
        t = self.cursor
        self.frames[t], self.actions[t], self.rewards[t] = frames, actions, rewards
        self.terminals[t], self.valid[t], self.history[t] = terminals, valid, history
        self.cursor = (t + 1) % self.rows
        self.count = min(self.count + 1, self.rows)

    def can_sample(self, n_step: int) -> bool:
        """A whole stack and its n-step successor are in memory."""
        return self.count >= STACK + n_step

    def _row(self, age: np.ndarray) -> np.ndarray:
        """Chronological position (0 = oldest row kept) -> row index."""
        return (self.cursor - self.count + age) % self.rows

    def stacks(self, age: np.ndarray, env: np.ndarray) -> np.ndarray:
        """The stacks ending at rows `age` of envs `env`: (B, 4, 84, 84), zero-filled before their first frame."""
        frames = self.frames[self._row(age[:, None] + np.arange(1 - STACK, 1)), env[:, None]]  # (B, 4, 84, 84)
        history = self.history[self._row(age), env]  # (B,)
        keep = (STACK - 1 - np.arange(STACK))[None, :] <= history[:, None]  # (B, 4): frame t-3+j is kept
        return frames * keep[:, :, None, None].astype(np.uint8)

    def windows(self, age: np.ndarray, env: np.ndarray, n_step: int, gamma: float):
        """For samples at `age`: whether each may be learned from, its length L, its n-step return
        sum_{k<L} gamma^k r_{t+k} and whether s_{t+L} is terminal."""
        offsets = np.arange(n_step)
        rows, env2 = self._row(age[:, None] + offsets), env[:, None]  # (B, n)
        terminal = self.terminals[rows, env2]
        length = np.where(terminal.any(1), terminal.argmax(1) + 1, n_step)  # up to and including the first terminal
        inside = offsets[None, :] < length[:, None]
        ok = (self.valid[rows, env2] | ~inside).all(1)
        ok &= age >= self.history[rows[:, 0], env]  # the stack's older frames are not overwritten yet
        ok &= age + n_step < self.count  # s_{t+n} is written
        returns = (self.rewards[rows, env2] * gamma**offsets * inside).sum(1, dtype=np.float32)
        return ok, length, returns, terminal.any(1)

    def sample(self, batch_size: int, rng: np.random.Generator, n_step: int = 1, gamma: float = 0.99):
        """Uniform over the stored transitions whose stacks are still in memory and whose n steps may be learned."""
        ages, envs = [], []
        for _ in range(1000):
            age = rng.integers(0, max(self.count - n_step, 1), size=2 * batch_size)
            env = rng.integers(0, self.num_envs, size=2 * batch_size)
            ok = self.windows(age, env, n_step, gamma)[0]
            ages.append(age[ok])
            envs.append(env[ok])
            if sum(len(a) for a in ages) >= batch_size:
                break
        else:
            raise RuntimeError("the replay memory holds no complete transition yet")
        age, env = np.concatenate(ages)[:batch_size], np.concatenate(envs)[:batch_size]
        return self.transitions(age, env, n_step, gamma)

    def transitions(self, age: np.ndarray, env: np.ndarray, n_step: int, gamma: float) -> dict[str, np.ndarray]:
        _, length, returns, terminal = self.windows(age, env, n_step, gamma)
        rows = self._row(age)
        return {
            "states": self.stacks(age, env),
            "next_states": self.stacks(age + length, env),
            "actions": self.actions[rows, env].astype(np.int64),
            "rewards": returns,
            "terminals": terminal.astype(np.float32),
            "rows": rows,
            "envs": env,
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        """The rows written so far (for --checkpoint-replay)."""
        state = {name: getattr(self, name)[: self.count] for name in self.ARRAYS}
        state["pointers"] = np.array([self.cursor, self.count, self.rows, self.num_envs])
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]):
        cursor, count, rows, num_envs = (int(v) for v in state["pointers"])
        if (rows, num_envs) != (self.rows, self.num_envs):
            raise ValueError(
                f"its replay memory has {rows:,} rows x {num_envs} envs, this run {self.rows:,} x {self.num_envs}; "
                "pass the original --buffer-size and --num-envs"
            )
        for name in self.ARRAYS:
            getattr(self, name)[:count] = state[name]
        self.cursor, self.count = cursor, count
        # the environments start new episodes: the last row of each is followed by no real successor
        self.valid[(cursor - 1) % self.rows] = False


class Step(NamedTuple):
    acted: np.ndarray  # (N,) the env took the agent's action (False on ale_py's reset step)
    terminal: np.ndarray  # (N,) s_{t+1} is terminal for learning
    valid: np.ndarray  # (N,) acted, and not cut by the time limit: a transition that may be learned from
    history: np.ndarray  # (N,) earlier frames of the same stack in o_t, capped at 3
    finished: list  # [(env, return, length)] of the episodes that ended


class EpisodeTracker:
    """Per-environment bookkeeping for ale_py's NEXT_STEP autoreset.

    After a step that ends an episode, the env's next step is a reset step: its action is ignored and it returns the
    first observation of a new episode with reward 0, so it is not a transition and is neither learned from nor
    counted as an agent step. A reset step is recognised from the previous step's flags and, as a safeguard, from
    the episode frame counter going backwards. With a life-loss protocol a lost life is terminal for learning and the
    agent starts a new stack (Dopamine's agent resets its state), while the game and its return go on.
    With `noop_steps` (Atari 100k), every episode starts with k ~ U{0, ..., noop_steps - 1} agent steps of action 0
    (`actions` substitutes them) that are neither learned from, counted nor scored, and the agent's first stack
    starts after them, as in Dopamine's DataEfficientAtariRunner._initialize_episode.
    """

    def __init__(self, num_envs, life_loss_terminal, truncation_is_terminal, info, noop_steps=0, rng=None):
        self.noop_steps, self.rng = noop_steps, rng
        self.noops = self.rng.integers(0, noop_steps, num_envs) if noop_steps else np.zeros(num_envs, dtype=np.int64)
        self.life_loss_terminal = life_loss_terminal
        self.truncation_is_terminal = truncation_is_terminal
        self.reset_next = np.zeros(num_envs, dtype=bool)
        self.stack_steps = np.zeros(num_envs, dtype=np.int64)  # agent steps since the current stack began
        self.lives = np.asarray(info["lives"]).copy()
        self.frame_number = np.asarray(info["episode_frame_number"]).copy()
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def actions(self, actions: np.ndarray) -> np.ndarray:
        """What the envs are sent: action 0 where an episode's no-op start is still under way."""
        return np.where(self.noops > 0, 0, actions).astype(actions.dtype)

    def step(self, rewards, terminated, truncated, info) -> Step:
        frame_number, lives = np.asarray(info["episode_frame_number"]), np.asarray(info["lives"])
        reset_step = self.reset_next | (frame_number < self.frame_number)
        finished = [(k, self.returns[k], self.lengths[k]) for k in np.flatnonzero(reset_step & ~self.reset_next)]
        noop = ~reset_step & (self.noops > 0)
        acted = ~reset_step & ~noop
        life_lost = (lives < self.lives) & (lives > 0)
        terminal = acted & (terminated | (truncated & self.truncation_is_terminal))
        cut = acted & truncated & ~terminated & (not self.truncation_is_terminal)  # the time limit, not the game
        episode_over = acted & (truncated | (terminated & ~(self.life_loss_terminal & life_lost)))
        history = np.minimum(self.stack_steps, STACK - 1)
        self.returns += np.where(acted, rewards, 0)
        self.lengths += acted
        finished += [(k, self.returns[k], self.lengths[k]) for k in np.flatnonzero(episode_over)]
        for k, _, _ in finished:
            self.returns[k], self.lengths[k] = 0.0, 0
        new_stack = reset_step | noop | (terminal & ~episode_over)  # a new episode, or a lost life that is terminal
        self.stack_steps = np.where(new_stack, 0, self.stack_steps + 1)
        self.reset_next = episode_over | (noop & (truncated | (terminated & ~life_lost)))
        self.noops -= noop
        if self.noop_steps and reset_step.any():
            self.noops[reset_step] = self.rng.integers(0, self.noop_steps, int(reset_step.sum()))
        self.lives, self.frame_number = lives.copy(), frame_number.copy()
        finished = [(int(k), float(r), int(n)) for k, r, n in finished]
        return Step(acted, terminal, acted & ~cut, history, finished)

    def agent_view(self, obs: np.ndarray) -> np.ndarray:
        """The stacks the agent sees: ale_py's, with the frames from before a terminal lost life zeroed."""
        if not self.life_loss_terminal or self.stack_steps.min() >= STACK - 1:
            return obs
        keep = (STACK - 1 - np.arange(STACK))[None, :] <= self.stack_steps[:, None]  # (N, 4)
        return obs * keep[:, :, None, None].astype(np.uint8)


# ----------------------------------------------------------------------------------------------------------------------
# Initialisers and padding as Flax does them
# ----------------------------------------------------------------------------------------------------------------------
def lecun_normal_(tensor: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Flax lecun_normal: truncated normal (+-2 std) scaled so that the variance is 1 / fan_in."""
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # std of a unit normal truncated to [-2, 2]
    return nn.init.trunc_normal_(tensor, 0.0, std, -2 * std, 2 * std)


def xavier_layer(layer: nn.Module) -> nn.Module:
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def same_padding(x: torch.Tensor, kernel: int, stride: int) -> list[int]:
    """TensorFlow 'SAME' padding of the last two dims, in F.pad's order [left, right, top, bottom]: output
    ceil(n / stride); the total padding max((out - 1) stride + kernel - n, 0) is split with the odd pixel after."""
    pads = []
    for n in (x.shape[-1], x.shape[-2]):  # F.pad lists the last dim first
        total = max((-(-n // stride) - 1) * stride + kernel - n, 0)
        pads += [total // 2, total - total // 2]
    return pads


def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """x padded for a 'SAME' kernel x kernel / stride window (Nature CNN: 84 -> 21 -> 11 -> 11)."""
    return F.pad(x, same_padding(x, kernel, stride), value=value)


def conv_same(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """conv(pad_same(x)). Where the padding is the same on both sides (the Nature CNN's first and last conv) the
    convolution pads by itself: no padded copy and no backward through it (~15% faster encoder forward + backward on
    a CPU, the same maths)."""
    left, right, top, bottom = same_padding(x, conv.kernel_size[0], conv.stride[0])
    if left == right and top == bottom:
        return F.conv2d(x, conv.weight, conv.bias, conv.stride, (top, left))
    return conv(F.pad(x, [left, right, top, bottom]))


# ----------------------------------------------------------------------------------------------------------------------
# Encoders
# ----------------------------------------------------------------------------------------------------------------------
class NatureEncoder(nn.Module):
    """Conv 32 8x8/4 -> Conv 64 4x4/2 -> Conv 64 3x3/1, ReLU after each, SAME padding, xavier_uniform kernels.
    (B, 4, 84, 84) -> (B, 64, 11, 11)."""

    def __init__(self):
        super().__init__()
        layers = ((4, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1))  # (in, out, kernel, stride)
        self.convs = nn.ModuleList(xavier_layer(nn.Conv2d(i, o, k, s)) for i, o, k, s in layers)

    def forward(self, x):
        for conv in self.convs:
            x = F.relu(conv_same(conv, x))
        return x


class ResidualBlock(nn.Module):
    """x + Conv(ReLU(Conv(ReLU(x)))), 3x3 convs with Flax's default lecun_normal init."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0, self.conv1 = (
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.Conv2d(channels, channels, 3, padding=1),
        )
        for conv in (self.conv0, self.conv1):
            lecun_normal_(conv.weight, channels * 9)
            nn.init.zeros_(conv.bias)

    def forward(self, x):
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaEncoder(nn.Module):
    """Three stacks (16, 32, 32 channels) of Conv 3x3 (xavier) -> max-pool 3x3/2 SAME (-inf padding) -> 2 residual
    blocks, then ReLU. (B, 4, 84, 84) -> 84 -> 42 -> 21 -> 11 -> (B, 32, 11, 11)."""

    def __init__(self, channels=(16, 32, 32)):
        super().__init__()
        self.convs, self.blocks = nn.ModuleList(), nn.ModuleList()
        in_channels = 4
        for c in channels:
            self.convs.append(xavier_layer(nn.Conv2d(in_channels, c, 3, padding=1)))
            self.blocks.append(nn.Sequential(ResidualBlock(c), ResidualBlock(c)))
            in_channels = c

    def forward(self, x):
        for conv, blocks in zip(self.convs, self.blocks, strict=True):
            x = F.max_pool2d(pad_same(conv(x), 3, 2, value=float("-inf")), 3, 2)
            x = blocks(x)
        return F.relu(x)


def tokenize(features: torch.Tensor, kind: str) -> torch.Tensor:
    """Encoder output C (B, d, h, w) -> tokens X (B, m, token dim) (§3, Fig. 3).

    perconv: m = h*w tokens of size d, row-major over the grid; perfeat: m = d tokens of size h*w (the transpose);
    persamp: one token holding the whole output (in channel-major order, a fixed permutation of Flax's HWC flatten).
    """
    if kind == "perconv":
        return features.flatten(2).transpose(1, 2)  # (B, h*w, d)
    if kind == "perfeat":
        return features.flatten(2)  # (B, d, h*w)
    if kind == "persamp":
        return features.flatten(1)[:, None]  # (B, 1, d*h*w)
    raise ValueError(kind)


# ----------------------------------------------------------------------------------------------------------------------
# Experts, Soft MoE, Top1-MoE
# ----------------------------------------------------------------------------------------------------------------------
class Experts(nn.Module):
    """n independent experts f_e(x) = Dense(ReLU(Dense(x))): d -> width -> d (the second Dense is the paper's
    projection back to token size), xavier_uniform kernels, zero biases; parameters stacked on a leading expert axis.
    Input (B, n, slots, d) -> output (B, n, slots, d) and the hidden activations (B, n, slots, width)."""

    def __init__(self, num_experts: int, dim: int, width: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, dim, width))
        self.b1 = nn.Parameter(torch.zeros(num_experts, width))
        self.w2 = nn.Parameter(torch.empty(num_experts, width, dim))
        self.b2 = nn.Parameter(torch.zeros(num_experts, dim))
        bound = math.sqrt(6.0 / (dim + width))  # xavier_uniform, the same for both layers
        nn.init.uniform_(self.w1, -bound, bound)
        nn.init.uniform_(self.w2, -bound, bound)

    def forward(self, slots: torch.Tensor):
        B, n, s, d = slots.shape
        x = slots.transpose(0, 1).reshape(n, B * s, d)  # one matmul per expert over all its slots
        hidden = torch.relu(torch.baddbmm(self.b1[:, None], x, self.w1))  # (n, B*s, width)
        out = torch.baddbmm(self.b2[:, None], hidden, self.w2)  # (n, B*s, d)
        return out.view(n, B, s, d).transpose(0, 1), hidden.view(n, B, s, -1).transpose(0, 1)


def l2_normalize(x: torch.Tensor, dim: int, eps: float = 1e-6) -> torch.Tensor:
    return x / (x.norm(dim=dim, keepdim=True) + eps)


def soft_moe(tokens: torch.Tensor, phi: torch.Tensor, experts, scale: torch.Tensor | None = None):
    """Soft MoE, §2.2. tokens X (B, m, d), phi Phi (d, n, p) (or (B, d, n, p) for a per-sample random Phi), experts
    maps slots (B, n, p, d) to (outputs, hidden). With `scale`, the logits use l2-normalised tokens and Phi columns
    times the learned scalar (Puigcerver et al.); the slots always mix the raw tokens.

    Returns Y (B, m, d), dispatch D (B, m, n, p), combine C (B, m, n, p) and the experts' hidden activations."""
    x_hat, phi_hat = tokens, phi
    if scale is not None:
        x_hat, phi_hat = l2_normalize(tokens, -1), scale * l2_normalize(phi, -3)
    pattern = "bmd,dnp->bmnp" if phi.dim() == 3 else "bmd,bdnp->bmnp"
    logits = torch.einsum(pattern, x_hat, phi_hat)  # L = X Phi (B, m, n, p)
    B, m, n, p = logits.shape
    dispatch = torch.softmax(logits, dim=1)  # D: each slot's weights over the m tokens sum to 1
    combine = torch.softmax(logits.reshape(B, m, n * p), dim=-1).view(B, m, n, p)  # C: each token's over all slots
    slots = torch.einsum("bmnp,bmd->bnpd", dispatch, tokens)  # X~ = D^T X (B, n, p, d)
    slot_outputs, hidden = experts(slots)  # Y~_i = f_{floor(i/p)}(X~_i) (B, n, p, d)
    outputs = torch.einsum("bmnp,bnpd->bmd", combine, slot_outputs)  # Y = C Y~ (B, m, d)
    return outputs, dispatch, combine, hidden


class SoftMoE(nn.Module):
    """Phi (d, n, p) with p = ceil(m / n) slots per expert, lecun_normal with fan_in n*d as Flax computes it for a 3-D
    kernel; the scalar (init 1) is always created but only used with normalisation, as in the reference."""

    def __init__(self, dim, num_tokens, num_experts, width, random_phi=False, normalize=False):
        super().__init__()
        self.slots = -(-num_tokens // num_experts)
        self.phi_shape = (dim, num_experts, self.slots)
        self.random_phi, self.normalize = random_phi, normalize
        self.phi = None if random_phi else nn.Parameter(lecun_normal_(torch.empty(self.phi_shape), num_experts * dim))
        self.scalar = nn.Parameter(torch.ones(1))
        self.experts = Experts(num_experts, dim, width)

    def forward(self, tokens):
        phi = self.phi
        if self.random_phi:  # a fresh N(0, 1) Phi for every sample of every call, as the reference's per-sample keys
            phi = torch.randn((tokens.shape[0],) + self.phi_shape, device=tokens.device)
        outputs, dispatch, combine, hidden = soft_moe(
            tokens, phi, self.experts, self.scalar if self.normalize else None
        )
        return outputs, {"dispatch": dispatch, "combine": combine, "hidden": hidden, "tokens": tokens}


def top1_route(probs: torch.Tensor, capacity: int):
    """Top-1 routing with capacity. probs (B, m, n) -> expert index, gate probability, position of the token in its
    expert's queue (token order) and whether it was kept (position < capacity), each (B, m)."""
    gate, expert = probs.max(-1)
    chosen = F.one_hot(expert, probs.shape[-1])  # (B, m, n)
    position = (chosen.cumsum(1) * chosen).sum(-1) - 1  # earlier tokens sent to the same expert
    return expert, gate, position, position < capacity


class Top1MoE(nn.Module):
    """Router Dense(n) without bias (lecun_normal), softmax, top-1; expert capacity C = ceil(m / n); the first C tokens
    routed to an expert (in token order) are kept, unused capacity slots are zeros that still pass through the expert,
    an overflowing token outputs zero; kept outputs are scaled by the gate probability."""

    def __init__(self, dim, num_tokens, num_experts, width):
        super().__init__()
        self.capacity = -(-num_tokens // num_experts)
        self.router = nn.Parameter(lecun_normal_(torch.empty(dim, num_experts), dim))
        self.experts = Experts(num_experts, dim, width)

    def forward(self, tokens):
        B, m, d = tokens.shape
        n, C = self.router.shape[1], self.capacity
        logits = tokens @ self.router  # (B, m, n)
        probs = torch.softmax(logits, -1)
        expert, gate, position, kept = top1_route(probs, C)
        slot = torch.where(kept, expert * C + position, n * C)[..., None].expand(B, m, d)  # dropped -> extra slot
        slots = tokens.new_zeros(B, n * C + 1, d).scatter(1, slot, tokens)[:, : n * C]  # (B, n*C, d)
        slot_outputs, hidden = self.experts(slots.view(B, n, C, d))  # (B, n, C, d)
        padded = torch.cat([slot_outputs.reshape(B, n * C, d), tokens.new_zeros(B, 1, d)], 1)
        outputs = padded.gather(1, slot) * gate[..., None]  # dropped tokens read the zero row
        aux = {"router_logits": logits, "router_probs": probs, "expert": expert, "kept": kept, "hidden": hidden}
        return outputs, aux


def importance_loss(probs: torch.Tensor) -> torch.Tensor:
    """Riquelme et al. (2021) A.2: per sample, importance_e = sum over tokens of the router probability of expert e;
    loss = (std_e / mean_e)^2 averaged over the batch. probs (B, m, n)."""
    importance = probs.sum(1)  # (B, n)
    return ((importance.std(-1, unbiased=False) / importance.mean(-1)) ** 2).mean()


def load_loss(logits: torch.Tensor, noisy_logits: torch.Tensor, noise_std: float) -> torch.Tensor:
    """Riquelme et al. (2021) A.2 with k = 1: threshold = the winning noisy logit of each token; P(token, e) =
    1 - Phi_N((threshold - logit_e) / sigma), the chance that expert e would win under fresh noise; p_e = mean over
    tokens; loss = (std_e p / mean_e p)^2 averaged over the batch. logits (B, m, n)."""
    threshold = noisy_logits.max(-1, keepdim=True).values
    p = 1.0 - torch.special.ndtr((threshold - logits) / noise_std)
    p_mean = p.mean(1)  # (B, n)
    return ((p_mean.std(-1, unbiased=False) / p_mean.mean(-1)) ** 2).mean()


def load_balancing_loss(aux: dict, num_experts: int) -> torch.Tensor:
    """Importance + load loss with the reference's weights (1, 1) and noise std 1 / n."""
    noise_std = 1.0 / num_experts
    logits = aux["router_logits"]
    noisy = logits + noise_std * torch.randn_like(logits)
    return importance_loss(aux["router_probs"]) + load_loss(logits, noisy, noise_std)


# ----------------------------------------------------------------------------------------------------------------------
# Q-network
# ----------------------------------------------------------------------------------------------------------------------
class QNetwork(nn.Module):
    """uint8 stacks (B, 4, 84, 84) / 255 -> encoder -> [Dense(512 k) + ReLU | tokens -> MoE -> flatten] -> Dense(A)."""

    def __init__(
        self,
        num_actions: int,
        encoder: str = "impala",
        moe: str = "softmoe",
        num_experts: int = 8,
        tokenization: str = "perconv",
        expert_width: int = 512,
        random_phi: bool = False,
        moe_normalize: bool = False,
        width_multiplier: int = 1,
        bf16: bool = False,
    ):
        super().__init__()
        self.moe_kind, self.tokenization, self.bf16 = moe, tokenization, bf16
        self.encoder = NatureEncoder() if encoder == "nature" else ImpalaEncoder()
        with torch.no_grad():
            features = self.encoder(torch.zeros(1, STACK, *FRAME_SHAPE))  # (1, d, h, w)
        if moe == "none":
            self.dense = xavier_layer(nn.Linear(features[0].numel(), 512 * width_multiplier))
            head_inputs = 512 * width_multiplier
        else:
            num_tokens, dim = tokenize(features, tokenization).shape[1:]
            if moe == "softmoe":
                self.moe = SoftMoE(dim, num_tokens, num_experts, expert_width, random_phi, moe_normalize)
            else:
                self.moe = Top1MoE(dim, num_tokens, num_experts, expert_width)
            head_inputs = num_tokens * dim  # the output tokens are flattened, no pooling
        self.head = xavier_layer(nn.Linear(head_inputs, num_actions))

    def forward(self, x: torch.Tensor, return_aux: bool = False):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.bf16):  # --bf16: the convolutions
            features = self.encoder(x.float() / 255.0).float()  # (B, d, h, w)
        if self.moe_kind == "none":
            hidden = F.relu(self.dense(features.flatten(1)))  # (B, 512 k)
            aux = {"hidden": hidden, "head_input": hidden}
        else:
            outputs, aux = self.moe(tokenize(features, self.tokenization))  # (B, m, d)
            aux["head_input"] = outputs.flatten(1)
        q = self.head(aux["head_input"])
        return (q, aux) if return_aux else q


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def build_network(args: Args, num_actions: int) -> QNetwork:
    return QNetwork(
        num_actions,
        encoder=args.encoder,
        moe=args.moe,
        num_experts=args.num_experts,
        tokenization=args.tokenization,
        expert_width=args.expert_width,
        random_phi=args.random_phi,
        moe_normalize=args.moe_normalize,
        width_multiplier=args.width_multiplier,
        bf16=args.bf16,
    )


def architecture(args: Args) -> dict:
    """What a checkpoint must match to be loaded into this run's network."""
    arch = {"env_id": args.env_id, "encoder": args.encoder, "moe": args.moe}
    if args.moe == "none":
        arch["width_multiplier"] = args.width_multiplier
    else:
        arch.update(num_experts=args.num_experts, tokenization=args.tokenization, expert_width=args.expert_width)
    if args.moe == "softmoe":
        arch.update(random_phi=args.random_phi, moe_normalize=args.moe_normalize)
    return arch


# ----------------------------------------------------------------------------------------------------------------------
# DQN
# ----------------------------------------------------------------------------------------------------------------------
def epsilon_schedule(step: int, decay_steps: int, warmup_steps: int, end_e: float) -> float:
    """Dopamine's linearly_decaying_epsilon: eps = end + clip((1 - end)(decay + warmup - step) / decay, 0, 1 - end),
    i.e. 1 for the first `warmup_steps` steps, then linear down to `end_e` over `decay_steps` steps."""
    bonus = (1.0 - end_e) * (decay_steps + warmup_steps - step) / decay_steps
    return end_e + min(max(bonus, 0.0), 1.0 - end_e)


def select_actions(q_net, obs: np.ndarray, epsilon: float, rng: np.random.Generator, num_actions: int, device,
                   policy=None):  # fmt: skip
    """epsilon-greedy per environment; the network only sees the environments that act greedily (a GraphedPolicy,
    --cuda-graph, gives every environment's greedy action in one replay)."""
    actions = rng.integers(0, num_actions, size=len(obs))
    greedy = rng.random(len(obs)) > epsilon  # Dopamine explores when u <= epsilon
    if greedy.any() and policy is not None:
        actions[greedy] = policy(obs)[greedy]
    elif greedy.any():
        with torch.inference_mode():
            q = q_net(torch.from_numpy(obs[greedy]).to(device))
        actions[greedy] = q.argmax(1).cpu().numpy()
    return actions.astype(np.int32)


def td_target(next_q: torch.Tensor, rewards: torch.Tensor, terminals: torch.Tensor, discount: float) -> torch.Tensor:
    """y = R + discount (1 - terminal) max_a' Q_target(s', a'), discount = gamma^n. next_q (B, A) -> (B,)."""
    return rewards + discount * (1.0 - terminals) * next_q.max(1).values


def dqn_loss(q_net, target_net, batch: dict, args: Args):
    """mean (y - Q(s, a))^2 (+ the weighted load-balancing losses for top1). Returns the loss and its metrics, among
    them the per-sample loss that the network analysis differentiates."""
    with torch.no_grad():
        next_q = target_net(batch["next_states"])
        target = td_target(next_q, batch["rewards"], batch["terminals"], args.gamma**args.n_step)
    q, aux = q_net(batch["states"], return_aux=True)
    q_taken = q.gather(1, batch["actions"][:, None]).squeeze(1)
    per_sample = (target - q_taken) ** 2
    td_loss = per_sample.mean()
    aux_loss = load_balancing_loss(aux, args.num_experts) if args.load_balance_coef > 0 else torch.zeros(())
    metrics = {"td_loss": td_loss.detach(), "aux_loss": aux_loss.detach(), "q_values": q_taken.detach().mean()}
    return td_loss + args.load_balance_coef * aux_loss, metrics | {"per_sample_loss": per_sample, "aux": aux}


def make_optimizer(q_net, args: Args) -> torch.optim.Adam:
    """Adam with --adam-eps; with --phi-adam-eps, Soft MoE's Phi in a parameter group of its own with that eps.
    fused=True: Adam's update in one vectorised pass over each tensor instead of ~10 elementwise ops (same maths, 4x
    faster on CPU, where the unfused step of the 4M-parameter net took a quarter of each update)."""
    params = q_net.parameters()
    if args.phi_adam_eps is not None:
        phi = q_net.moe.phi
        params = [
            {"params": [p for p in q_net.parameters() if p is not phi]},
            {"params": [phi], "eps": args.phi_adam_eps},
        ]
    return torch.optim.Adam(params, lr=args.learning_rate, eps=args.adam_eps, fused=True, capturable=args.cuda_graph)


def period_crossed(step_before: int, step_after: int, period: int) -> bool:
    """True when a multiple of `period` lies in (step_before, step_after]: with N envs the counter moves by up to N."""
    return step_after // period > step_before // period


def to_tensors(batch: dict, device) -> dict[str, torch.Tensor]:
    keys = ("states", "next_states", "actions", "rewards", "terminals")
    return {k: torch.from_numpy(batch[k]).to(device) for k in keys}


# ----------------------------------------------------------------------------------------------------------------------
# --cuda-graph: the update and the acting pass recorded once as CUDA graphs and replayed (same maths, fewer launches)
# ----------------------------------------------------------------------------------------------------------------------
class GraphedUpdate:
    """One update (`loss_fn`, backward, the Adam step) recorded as a CUDA graph and replayed on a static batch
    (PyTorch's whole-network capture): one launch instead of the 100-400 kernel launches whose host-side cost, not
    the GPU's work, bounds an eager update on a GPU. Three warm-up updates on a side stream (cuDNN and cuBLAS choose
    their kernels, Adam creates its state) are undone before the capture, so the weights and Adam's moments go on as
    in eager mode; only the random draws (noise, augmentation) are other ones. Needs Adam(capturable=True)."""

    def __init__(self, loss_fn, q_net, target_net, optimizer, batch: dict, args):
        device = next(q_net.parameters()).device
        self.static = to_tensors(batch, device)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        before = [p.detach().clone() for p in params]
        state_before = {i: {k: v.clone() for k, v in optimizer.state[p].items()} for i, p in enumerate(params)}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                loss, _ = loss_fn(q_net, target_net, self.static, args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.no_grad():  # undo the warm-up: parameters, moments and step counts as they were (zero if new)
            for i, p in enumerate(params):
                p.copy_(before[i])
                for k, v in optimizer.state[p].items():
                    if k in state_before[i]:
                        v.copy_(state_before[i][k])
                    else:
                        v.zero_()
        optimizer.zero_grad(set_to_none=True)  # backward in the graph writes the gradients, never accumulates
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            loss, self.metrics = loss_fn(q_net, target_net, self.static, args)
            loss.backward()
            optimizer.step()

    def __call__(self, batch: dict) -> dict:
        """Copy the sampled batch into the graph's input tensors and replay; the metrics are the graph's outputs."""
        for key, tensor in self.static.items():
            tensor.copy_(torch.from_numpy(batch[key]))
        self.graph.replay()
        return self.metrics


class GraphedPolicy:
    """argmax_a Q(s, a) for every environment, recorded once as a CUDA graph (with NoisyNets, each replay draws fresh
    noise, as every eager forward pass does)."""

    def __init__(self, q_net, num_envs: int):
        device = next(q_net.parameters()).device
        self.obs = torch.zeros(num_envs, STACK, *FRAME_SHAPE, dtype=torch.uint8, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):
                q_net(self.obs)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.actions = q_net(self.obs).argmax(1)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        self.obs.copy_(torch.from_numpy(obs))
        self.graph.replay()
        return self.actions.cpu().numpy()


# ----------------------------------------------------------------------------------------------------------------------
# Main: set up, then the loop act -> step -> store -> learn
# ----------------------------------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    args = fill_defaults(args)
    error = validate(args) or optional_imports_error(args)
    ckpt, saved_replay = None, None
    if error is None and args.resume:
        try:
            ckpt = load_checkpoint(args.resume, args)
            if ckpt["global_step"] >= args.total_timesteps:
                raise ValueError(
                    f"--resume {args.resume!r} is already at step {ckpt['global_step']:,}; raise --total-timesteps"
                )
            saved_replay = load_replay(args.resume, ckpt["replay"]) if ckpt.get("replay") else None
        except ValueError as err:
            error = str(err)
    if error:
        raise SystemExit(f"error: {error}")

    device = pick_device(args.device)
    seed_everything(args.seed, args.torch_deterministic)
    rng = np.random.default_rng(args.seed)
    rom = game_from_env_id(args.env_id)
    envs = make_env(args, rom, args.num_envs)
    num_actions = int(envs.single_action_space.n)
    # channels_last kernels: the same maths, ~5% faster convolutions on CPU (oneDNN) and with cuDNN
    q_net = build_network(args, num_actions).to(device, memory_format=torch.channels_last)
    target_net = build_network(args, num_actions).to(device, memory_format=torch.channels_last)
    target_net.load_state_dict(q_net.state_dict())
    target_net.requires_grad_(False)
    optimizer = make_optimizer(q_net, args)
    phi = q_net.moe.phi if args.moe == "softmoe" else None  # None too with --random-phi
    replay = FrameReplay(args.buffer_size, args.num_envs)
    global_step, updates, episodes = 0, 0, []
    if ckpt is not None:
        try:
            global_step, updates, episodes = restore(ckpt, saved_replay, q_net, target_net, optimizer, replay, rng)
        except (RuntimeError, ValueError, KeyError) as err:
            envs.close()
            raise SystemExit(f"error: --resume {args.resume!r} does not fit this run ({err})") from None

    run = start_run(args, rom, q_net, replay, global_step, updates, episodes, device, resumed=ckpt is not None)

    def checkpoint() -> dict:
        return {"q_net": q_net.state_dict(), "target_net": target_net.state_dict(), "optimizer": optimizer.state_dict()}

    # min_replay_history counts from this segment's start unless the replay memory was restored
    learn_from = global_step + (0 if saved_replay else args.learning_starts)
    updates_before, last_sync, metrics = updates, global_step, {}
    logger = (
        ReplayLogger(args.save_replay, args.num_envs, args.save_replay_rows, args.n_step) if args.save_replay else None
    )
    policy, update = (GraphedPolicy(q_net, args.num_envs), None) if args.cuda_graph else (None, None)
    obs, info = envs.reset(seed=args.seed)
    noop_steps = 30 if args.protocol == "atari100k" else 0
    tracker = EpisodeTracker(
        args.num_envs, args.protocol != "dopamine", args.truncation_is_terminal, info, noop_steps, rng
    )
    with stop_signals() as stopped:
        while global_step < args.total_timesteps and not stopped():
            epsilon = epsilon_schedule(global_step, args.epsilon_decay_steps, args.learning_starts, args.end_e)
            actions = select_actions(q_net, obs, epsilon, rng, num_actions, device, policy)
            envs.send(tracker.actions(actions))  # the emulators step in their threads while the network learns

            if global_step > learn_from and replay.can_sample(args.n_step):
                while updates < updates_before + int((global_step - learn_from) * args.replay_ratio):
                    batch = replay.sample(args.batch_size, rng, args.n_step, args.gamma)
                    if args.cuda_graph:  # the same update, recorded at the first and replayed
                        update = update or GraphedUpdate(dqn_loss, q_net, target_net, optimizer, batch, args)
                        metrics = update(batch)
                    else:
                        loss, metrics = dqn_loss(q_net, target_net, to_tensors(batch, device), args)
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        optimizer.step()
                    if phi is not None:  # the size of Phi's gradient, next to Adam's eps
                        metrics["phi_grad_rms"] = phi.grad.pow(2).mean().sqrt()
                    updates += 1
                if period_crossed(last_sync, global_step, args.target_network_frequency):
                    target_net.load_state_dict(q_net.state_dict())
                if args.analysis_every and period_crossed(last_sync, global_step, args.analysis_every):
                    log_analysis(run, q_net, target_net, replay, args, global_step, device)
                last_sync = global_step

            next_obs, rewards, terminated, truncated, info = envs.recv()
            step = tracker.step(rewards, terminated, truncated, info)
            clipped = np.clip(rewards, -1, 1)  # Dopamine's runner clips before the agent stores; returns stay scores
            replay.add(obs[:, -1], actions, clipped, step.terminal, step.valid, step.history)
            if logger:  # --save-replay: the same transitions in the DQN Replay Dataset's format
                logger.add(obs[:, -1], actions, clipped, step)
            global_step += int(step.acted.sum())
            obs = tracker.agent_view(next_obs)
            log_step(run, global_step, step.finished, next_obs, epsilon, updates, metrics, checkpoint, replay, rng)
    envs.close()
    if logger:
        logger.close(run.episodes)
    return finish_run(run, global_step, updates, checkpoint, replay, rng, complete=not stopped())


# ======================================================================================================================
# Bookkeeping: the run directory, tensorboard, the progress line, outputs and checkpoints, video
# ======================================================================================================================
@dataclass
class Run:
    """What a run writes, and the timers that decide when."""

    args: Args
    rom: str
    run_dir: str
    writer: SummaryWriter
    summary: dict
    episodes: list  # (global_step at the end, return, length) of every finished episode
    start_step: int
    t_start: float = field(default_factory=time.time)
    t_log: float = field(default_factory=time.time)
    t_write: float = field(default_factory=time.time)
    last_step: int = 0
    log_step: int = 0  # global_step at the last progress line
    recent_sps: float = 0.0  # moving average of the steps/s between progress lines while learning, for the ETA
    log_updates: int = 0  # updates at the last progress line (at the start: the checkpoint's count)
    was_learning: bool = False  # whether the interval before the last progress line had updates
    video: EpisodeVideo | None = None


def start_run(
    args: Args, rom: str, net, replay, global_step: int, updates: int, episodes: list, device, resumed: bool
) -> Run:
    game = camel_name(rom)
    run_name = base_name = f"{game}__{args.exp_name}__{args.moe}-{args.encoder}__{args.seed}__{int(time.time())}"
    attempt = 1
    while os.path.exists(os.path.join("runs", run_name)):  # a run started in the same second gets its own directory
        attempt += 1
        run_name = f"{base_name}-{attempt}"
    run_dir = os.path.join("runs", run_name)
    os.makedirs(run_dir, exist_ok=True)
    if args.track:
        import wandb

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
    parts = {name: count_parameters(child) for name, child in net.named_children()}
    print(
        f"{run_name}: {args.moe} on the {args.encoder} encoder, {count_parameters(net):,} parameters {parts}, "
        f"{args.num_envs} env(s), {args.protocol} protocol, replay {replay.rows * replay.num_envs:,} transitions "
        f"({replay.nbytes / 1e9:.2f} GB), device {device}"
        + (f"; resuming at step {global_step:,} ({replay.count * replay.num_envs:,} stored)" if resumed else "")
    )
    summary = {
        "args": asdict(args),
        "run_name": run_name,
        "device": str(device),
        "game": game,
        "num_parameters": count_parameters(net),
        "parameters_by_part": parts,
        "replay_bytes": replay.nbytes,
        "replay_bytes_per_transition": FrameReplay.BYTES_PER_TRANSITION,
        "start_step": global_step,
        "analysis": {},
    }
    video = EpisodeVideo(os.path.join(run_dir, "videos")) if args.capture_video else None
    return Run(
        args,
        rom,
        run_dir,
        writer,
        summary,
        episodes,
        global_step,
        last_step=global_step,
        log_step=global_step,
        log_updates=updates,
        video=video,
    )


def log_step(run: Run, global_step, finished, next_obs, epsilon, updates, metrics, checkpoint, replay, rng):
    """Episode returns, the per-iteration score, video frames, the progress line and the periodic outputs."""
    args, writer = run.args, run.writer
    if run.video is not None:
        run.video.add(next_obs[0, -1], [env for env, _, _ in finished])
    for _, episode_return, length in finished:
        run.episodes.append((global_step, episode_return, length))
        writer.add_scalar("charts/episodic_return", episode_return, global_step)
        writer.add_scalar("charts/episodic_length", length, global_step)
    if period_crossed(run.last_step, global_step, args.iteration_steps):
        last = iteration_returns(run.episodes, args.iteration_steps, global_step)[-1:]
        if last and last[0]["iteration"] == global_step // args.iteration_steps - 1:
            writer.add_scalar("charts/iteration_return", last[0]["mean_return"], last[0]["end_step"])
    run.last_step = global_step
    now = time.time()
    if now - run.t_log >= args.log_every_seconds:
        sps = (global_step - run.start_step) / (now - run.t_start)
        # the ETA follows the recent rate of intervals spent learning throughout: steps slow down once learning
        # starts, so before that (and while a run resumed without its replay memory refills it) the acting rate
        # gives only a lower bound, and the interval in which learning starts is left out, so that the ETA does not
        # keep growing as the average catches up
        recent = (global_step - run.log_step) / (now - run.t_log)
        learning = updates > run.log_updates  # in this interval; throughout it if also in the one before
        if learning and run.was_learning:
            run.recent_sps = recent if run.recent_sps == 0 else 0.7 * run.recent_sps + 0.3 * recent
        left = args.total_timesteps - global_step
        if run.recent_sps > 0:
            eta = f"ETA {fmt_time(left / run.recent_sps)} at the recent rate"
        else:
            why = "no whole interval of learning yet" if learning else "learning has not started"
            eta = f"ETA over {fmt_time(left / recent)} ({why})" if recent > 0 else "ETA ?"
        last = [r for _, r, _ in run.episodes[-100:]]
        for k in ("td_loss", "aux_loss", "q_values", "phi_grad_rms"):
            if k in metrics:
                writer.add_scalar(f"losses/{k}", float(metrics[k]), global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("charts/epsilon", epsilon, global_step)
        print(
            f"step {global_step:,}/{args.total_timesteps:,} | {sps:,.0f} steps/s | updates {updates:,} | "
            f"episodes {len(run.episodes):,} | mean return (last 100) {f'{np.mean(last):.1f}' if last else '-'} | "
            f"epsilon {epsilon:.3f}" + (f" | td loss {float(metrics['td_loss']):.4f}" if metrics else "") + f" | {eta}",
            flush=True,
        )
        run.t_log, run.log_step, run.log_updates, run.was_learning = now, global_step, updates, learning
    if now - run.t_write >= 60 * args.write_every_minutes:
        write_outputs(run, global_step, updates, checkpoint, replay, rng, complete=False)
        run.t_write = now


def write_outputs(run: Run, global_step, updates, checkpoint, replay, rng, complete: bool):
    """summary.json, episodes.csv, learning_curve.png and, with --save-model, the checkpoint (and its replay)."""
    args, episodes = run.args, run.episodes
    elapsed = time.time() - run.t_start
    last = [r for _, r, _ in episodes[-100:]]
    mean_return = float(np.mean(last)) if last else None
    iterations = iteration_returns(episodes, args.iteration_steps, global_step)
    run.summary.update(
        complete=complete,
        global_step=global_step,
        updates=updates,
        episodes=len(episodes),
        wall_time=elapsed,
        sps=(global_step - run.start_step) / max(elapsed, 1e-9),
        mean_return_last_100=mean_return,
        episodes_in_mean=len(last),
        human_normalized_score=None if mean_return is None else human_normalized(mean_return, run.rom),
        random_human_scores=RANDOM_HUMAN_SCORES.get(camel_name(run.rom)),
        iteration_returns=iterations,
        last_iteration_mean_return=iterations[-1]["mean_return"] if iterations else None,
    )
    with open(os.path.join(run.run_dir, "episodes.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["global_step", "return", "length"])
        w.writerows(episodes)
    write_learning_curve(
        os.path.join(run.run_dir, "learning_curve.png"), episodes, camel_name(run.rom), os.path.basename(run.run_dir)
    )
    if args.save_model:
        path = os.path.join(run.run_dir, f"{SCRIPT}.pt")
        state = checkpoint() | {"global_step": global_step, "updates": updates, "episodes": episodes}
        state |= {"numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state()}
        if args.checkpoint_replay:  # the replay first, under its own step's name; the older one goes last
            state["replay"] = save_replay(path, replay, global_step)
        save_checkpoint(path, args, state)
        if args.checkpoint_replay:
            remove_stale_replays(path, keep=state["replay"])
        run.summary["checkpoint"] = path
    with open(os.path.join(run.run_dir, "summary.json"), "w") as f:
        json.dump(run.summary, f, indent=2)


def finish_run(run: Run, global_step, updates, checkpoint, replay, rng, complete: bool) -> dict:
    if not complete:
        print("interrupted: writing the summary and (with --save-model) the checkpoint")
    write_outputs(run, global_step, updates, checkpoint, replay, rng, complete)
    summary = run.summary
    if summary["mean_return_last_100"] is not None:
        run.writer.add_scalar("charts/mean_return_last_100", summary["mean_return_last_100"], global_step)
    hns, mean_return = summary["human_normalized_score"], summary["mean_return_last_100"]
    print(
        f"done: {global_step:,} steps, {len(run.episodes)} episodes, mean return (last {summary['episodes_in_mean']}) "
        f"{'-' if mean_return is None else f'{mean_return:.1f}'}, "
        f"human-normalised {hns if hns is None else round(hns, 3)}, "
        f"{summary['sps']:,.0f} steps/s"
    )
    run.writer.close()
    if run.args.track:
        import wandb

        wandb.finish()
    return summary


def restore(ckpt: dict, saved_replay, q_net, target_net, optimizer, replay, rng):
    """Load a checkpoint's state into this run; returns the step and update counters and the episode history."""
    q_net.load_state_dict(ckpt["q_net"])
    target_net.load_state_dict(ckpt["target_net"])
    optimizer.load_state_dict(ckpt["optimizer"])
    rng.bit_generator.state = ckpt["numpy_rng"]
    torch.set_rng_state(ckpt["torch_rng"])
    if saved_replay is not None:
        replay.load_state_dict(saved_replay)
    return int(ckpt["global_step"]), int(ckpt["updates"]), [tuple(e) for e in ckpt["episodes"]]


def iteration_returns(episodes: list, iteration_steps: int, global_step: int) -> list[dict]:
    """Dopamine's per-iteration score: the mean return of the training episodes that end in each complete iteration
    of `iteration_steps` agent steps (iterations in which no episode ended are left out). episodes: (end step,
    return, length)."""
    ends = np.array([e[0] for e in episodes], dtype=np.int64)
    returns = np.array([e[1] for e in episodes], dtype=np.float64)
    iteration = (ends - 1) // iteration_steps
    out = []
    for k in range(global_step // iteration_steps):
        mine = returns[iteration == k]
        if len(mine):
            out.append({"iteration": k, "end_step": (k + 1) * iteration_steps, "mean_return": float(mine.mean()),
                        "episodes": int(len(mine))})  # fmt: skip
    return out


def replay_path(checkpoint_path: str, global_step: int) -> str:
    """The replay memory saved with the checkpoint of `global_step`. One file per step: the checkpoint names its own,
    and the older file is removed only after the checkpoint that replaces it is written, so a hard kill (SIGKILL, power
    loss) between the two writes leaves the previous checkpoint with the very memory it was saved with."""
    return f"{checkpoint_path.removesuffix('.pt')}_replay_{global_step}.npz"


def save_replay(checkpoint_path: str, replay, global_step: int) -> str:
    """The replay memory beside the checkpoint, written atomically (uncompressed .npz, no pickle); returns its name."""
    path = replay_path(checkpoint_path, global_step)
    with open(f"{path}.tmp", "wb") as f:
        np.savez(f, **replay.state_dict())
    os.replace(f"{path}.tmp", path)
    return os.path.basename(path)


def remove_stale_replays(checkpoint_path: str, keep: str):
    """Every replay file beside the checkpoint but the one it names (left by earlier writes or by a killed one)."""
    stem = os.path.basename(checkpoint_path).removesuffix(".pt")
    folder = os.path.dirname(checkpoint_path) or "."
    for name in os.listdir(folder):
        if name.startswith(f"{stem}_replay") and name.endswith(".npz") and name != keep:
            os.remove(os.path.join(folder, name))


def load_replay(checkpoint_path: str, name: str) -> dict[str, np.ndarray]:
    """The replay memory the checkpoint names (`name`, a file beside it), whole or not at all: the zip checks each
    array's CRC-32 as it is read, and a file that lacks one of the memory's arrays (a damaged zip index) is refused."""
    path = os.path.join(os.path.dirname(checkpoint_path), os.path.basename(name))
    try:
        with np.load(path, allow_pickle=False) as data:
            state = {k: data[k] for k in data.files}
        if missing := sorted({*FrameReplay.ARRAYS, "pointers"} - set(state)):
            raise ValueError(f"no {', '.join(missing)} array")
    except FileNotFoundError:
        raise ValueError(
            f"--resume {checkpoint_path!r} was saved with its replay memory, but {path!r} is missing"
        ) from None
    except Exception as err:  # zipfile.BadZipFile, EOFError, numpy's header parser's errors, missing arrays
        raise ValueError(
            f"--resume: the replay memory {path!r} is truncated or corrupt ({type(err).__name__}: "
            f"{' '.join(str(err).split())}); restore it from a copy, or start the run again"
        ) from None
    return state


class EpisodeVideo:
    """What the agent sees in env 0 (84x84 frames shown at 168x168) as mp4, for episodes 0, 1, 8, 27, ..., 729, 1000,
    2000, ... (gymnasium's capped cubic schedule)."""

    def __init__(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.episode, self.frames = folder, 0, []

    @staticmethod
    def wanted(episode: int) -> bool:
        return round(episode ** (1 / 3)) ** 3 == episode if episode < 1000 else episode % 1000 == 0

    def add(self, frame: np.ndarray, finished_envs: list[int]):
        if self.wanted(self.episode):
            self.frames.append(frame.copy())
        if 0 in finished_envs:
            if self.frames:
                from moviepy import ImageSequenceClip

                rgb = [np.repeat(np.kron(f, np.ones((2, 2), dtype=np.uint8))[..., None], 3, -1) for f in self.frames]
                path = os.path.join(self.folder, f"episode-{self.episode}.mp4")
                ImageSequenceClip(rgb, fps=15).write_videofile(path, logger=None)
            self.episode, self.frames = self.episode + 1, []


def write_learning_curve(path: str, episodes: list[tuple], game: str, title: str, window: int = 100):
    """Episode returns against environment steps, with their running mean over `window` episodes and the game's
    random and human scores (atari_scores.csv) as reference lines."""
    if not episodes:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([e[0] for e in episodes], dtype=np.float64)
    returns = np.array([e[1] for e in episodes], dtype=np.float64)
    if len(returns) >= window:
        running, running_steps = np.convolve(returns, np.ones(window), "valid") / window, steps[window - 1 :]
    else:  # fewer episodes than the window: the mean of all so far
        running, running_steps = returns.cumsum() / np.arange(1, len(returns) + 1), steps
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(steps, returns, ".", color="0.75", ms=2, label="episode return")
    ax.plot(running_steps, running, "k-", lw=1.5, label=f"mean of the last {window} episodes")
    if game in RANDOM_HUMAN_SCORES:
        rnd, human = RANDOM_HUMAN_SCORES[game]
        ax.axhline(rnd, color="gray", ls=":", label=f"random ({rnd:g})")
        ax.axhline(human, color="r", ls=":", label=f"human ({human:g})")
    ax.set_xlabel("environment steps (agent steps, 4 frames each)")
    ax.set_ylabel("episode return (unclipped)")
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=9)  # long run names wrap instead of being cut
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ======================================================================================================================
# Offline datasets (--save-replay): every transition in the DQN Replay Dataset's on-disk format
# ======================================================================================================================
class ReplayLogger:
    """Writes the run's transitions as batch_rl's logged replay buffer wrote the DQN Replay Dataset (Dopamine's
    OutOfGraphReplayBuffer format, softmoe_dopamine.md §6), so that `cql_softmoe.py --dataset-dir DIR` trains on them.

    Checkpoint file N holds `rows_per_file` rows: `$store$_observation_ckpt.N.gz` (uint8, rows x 84 x 84, single
    frames), `$store$_action_ckpt.N.gz` (int32), `$store$_reward_ckpt.N.gz` (float32, clipped),
    `$store$_terminal_ckpt.N.gz` (uint8), each a gzipped .npy, plus `add_count_ckpt.N.gz` and
    `invalid_range_ckpt.N.gz`. Row t is (o_t, a_t, r_{t+1}, terminal); every episode starts with three all-zero padding
    rows; the last row of every episode is terminal, the time-limit cut included (the dataset's quirk: its generating
    agent stored every episode end as terminal); with a life-loss protocol a lost life ends the agent's episode. Each
    environment's episode is written whole when it ends, so the environments' episodes follow one another. A full
    file's add_count counts every row added so far; the last, partial file of a run (written when the run stops) sets
    add_count to its rows, as Dopamine's final buffer does, and a resumed run goes on with the next file. The
    observations stream into the gzip as episodes end; the episodes still running when the run stops are written as
    cut (terminal), so that no episode is ever followed by another's padding as if it went on."""

    def __init__(self, directory: str, num_envs: int, rows_per_file: int, n_step: int):
        os.makedirs(directory, exist_ok=True)
        found = [int(m.group(1)) for f in os.listdir(directory) if (m := re.fullmatch(r"add_count_ckpt\.(\d+)\.gz", f))]
        self.directory, self.rows_per_file, self.n_step = directory, rows_per_file, n_step
        self.index = max(found) + 1 if found else 0  # a resumed run continues after the files already there
        self.episodes = [[] for _ in range(num_envs)]  # the current episode's rows of every environment
        self.add_count = self.index * rows_per_file
        self.stream = None

    def add(self, frames: np.ndarray, actions: np.ndarray, clipped_rewards: np.ndarray, step: Step):
        """The step that started from frames (N, 84, 84); an episode's rows are written when it ends."""
        ends = step.terminal | (step.acted & ~step.valid)  # terminal, or cut by the time limit
        for k in np.flatnonzero(step.acted):
            self.episodes[k].append((frames[k].copy(), int(actions[k]), float(clipped_rewards[k]), bool(ends[k])))
            if ends[k]:
                self.write_episode(self.episodes[k])
                self.episodes[k] = []

    def write_episode(self, rows: list):
        pad = (np.zeros(FRAME_SHAPE, dtype=np.uint8), 0, 0.0, False)
        for row in [pad] * (STACK - 1) + rows:
            if self.stream is None:
                self.open_file()
            frame, action, reward, terminal = row
            self.stream.write(frame.tobytes())
            t = self.cursor
            self.actions[t], self.rewards[t], self.terminals[t] = action, reward, terminal
            self.cursor += 1
            self.add_count += 1
            if self.cursor == self.rows_per_file:
                self.close_file(self.add_count)

    def open_file(self):
        path = os.path.join(self.directory, f"$store$_observation_ckpt.{self.index}.gz")
        self.stream = gzip.open(path, "wb", compresslevel=1)
        np.lib.format.write_array_header_1_0(
            self.stream, {"descr": "|u1", "fortran_order": False, "shape": (self.rows_per_file,) + FRAME_SHAPE}
        )
        self.actions = np.zeros(self.rows_per_file, dtype=np.int32)
        self.rewards = np.zeros(self.rows_per_file, dtype=np.float32)
        self.terminals = np.zeros(self.rows_per_file, dtype=np.uint8)
        self.cursor = 0

    def close_file(self, add_count: int):
        """Pad the observations to the file's rows, then write the other arrays, the add count and the rows that must
        not be sampled around the write cursor (Dopamine's invalid_range: cursor - n .. cursor + 3)."""
        self.stream.write(bytes((self.rows_per_file - self.cursor) * FRAME_SHAPE[0] * FRAME_SHAPE[1]))
        self.stream.close()
        cursor = add_count % self.rows_per_file
        invalid = (cursor - self.n_step + np.arange(STACK + self.n_step)) % self.rows_per_file
        arrays = {"$store$_action": self.actions, "$store$_reward": self.rewards, "$store$_terminal": self.terminals,
                  "add_count": np.array(add_count), "invalid_range": invalid}  # fmt: skip
        for name, array in arrays.items():
            with gzip.open(os.path.join(self.directory, f"{name}_ckpt.{self.index}.gz"), "wb", compresslevel=1) as f:
                np.save(f, array, allow_pickle=False)
        self.stream, self.index = None, self.index + 1

    def close(self, episodes: list):
        """Write the episodes still running, cut here and so ending terminal like every other episode end of the
        dataset (unmarked, the next episode's padding would follow them as their successor), then the last, partial
        file; and the run's episode returns beside the data (behaviour_episodes.csv), for the behaviour policy's
        score."""
        for k, rows in enumerate(self.episodes):
            if rows:
                rows[-1] = rows[-1][:3] + (True,)
                self.write_episode(rows)
                self.episodes[k] = []
        if self.stream is not None:
            self.close_file(self.cursor)  # the final buffer: add_count = its rows, so only rows below it are sampled
        with open(os.path.join(self.directory, "behaviour_episodes.csv"), "w", newline="") as f:
            w = csv.writer(f)  # the whole run's episodes (a resumed run carries its history)
            w.writerow(["global_step", "return", "length"])
            w.writerows(episodes)


# ======================================================================================================================
# Network analysis (Fig. 10; softmoe_dopamine.md §7)
# ======================================================================================================================
def dormant_fraction(hidden: torch.Tensor, tau: float = 0.0) -> float:
    """Sokar et al. (2023): unit i is tau-dormant if s_i = E|h_i| / mean_k E|h_k| <= tau. hidden (B, ..., H): the
    expectation is over the batch and, as the reference's MoE agent does, the middle axes (experts, slots) too, so
    unit i of every expert is one unit. tau = 0 is the reference code's threshold (there sum- and mean-normalised
    scores agree)."""
    score = hidden.abs().mean(dim=tuple(range(hidden.dim() - 1)))  # (H,)
    score = score / (score.mean() + 1e-9)
    return float((score <= tau).float().mean())


def feature_norm(hidden: torch.Tensor) -> float:
    """The reference's Rainbow statistic: per-feature variance across the batch, l2 norm over the feature axis,
    averaged over any leading axes. hidden (B, ..., H)."""
    return float(hidden.var(0, unbiased=False).norm(dim=-1).mean())


def srank(features: torch.Tensor, delta: float = 0.01) -> int:
    """Kumar et al. (2021): min k with sum_{i<=k} sigma_i / sum_i sigma_i >= 1 - delta, sigma the singular values of
    the (batch x features) matrix."""
    sigma = torch.linalg.svdvals(features.double())
    cumulative = sigma.cumsum(0) / sigma.sum().clamp_min(1e-12)
    return int((cumulative < 1 - delta).sum()) + 1


def threshold_rank(matrix: torch.Tensor, t: float = 0.01) -> int:
    """The reference code's rank proxy: #{i : sigma_i / sigma_max > t}."""
    sigma = torch.linalg.svdvals(matrix.double())
    return int((sigma / sigma[0].clamp_min(1e-12) > t).sum())


def routing_statistics(aux: dict) -> dict[str, float]:
    """How much Soft MoE routes, on one batch. Entropy of each slot's dispatch weights over the m tokens / log m, and
    of each token's combine weights over the n p slots / log(n p): at 1 every slot is the mean of all tokens and every
    output token is the same vector, so the layer is global average pooling followed by the experts (where it starts:
    Phi's lecun_normal logits are ~0.01 on the Nature CNN's tokens). Token diversity: the variance of the tokens across
    positions over their mean squared norm (0: every position carries the same vector), of the encoder's tokens (in)
    and of the layer's output tokens (out, the Q head's input)."""
    aux = {k: v.detach() for k, v in aux.items() if torch.is_tensor(v)}  # statistics, no graph
    dispatch, combine = aux["dispatch"], aux["combine"]
    B, m, n, p = dispatch.shape

    def entropy(probs: torch.Tensor, dim: int) -> torch.Tensor:
        return -(probs * probs.clamp_min(1e-30).log()).sum(dim)

    def diversity(tokens: torch.Tensor) -> float:  # (B, m, d)
        spread = tokens.var(1, unbiased=False).sum(-1) / tokens.pow(2).sum(-1).mean(1).clamp_min(1e-30)
        return float(spread.mean())

    out = {
        "token_diversity_in": diversity(aux["tokens"]),
        "token_diversity_out": diversity(aux["head_input"].view(B, m, -1)),
    }
    if m > 1:
        out["routing_dispatch_entropy"] = float(entropy(dispatch, 1).mean() / math.log(m))
    if n * p > 1:
        out["routing_combine_entropy"] = float(entropy(combine.reshape(B, m, n * p), -1).mean() / math.log(n * p))
    return out


def empirical_ntk(per_sample_loss, params: list, batch_size: int, memory_bytes: int = 2**29) -> torch.Tensor:
    """K_ij = <grad l_i, grad l_j> over all parameters, l_i = per_sample_loss(i) the training loss of sample i alone
    (B x B). One forward/backward per sample; when B x #params floats exceed `memory_bytes`, the parameter vector is
    covered in several passes."""
    total = sum(p.numel() for p in params)
    chunk = max(1, min(total, memory_bytes // (4 * batch_size)))
    K = torch.zeros(batch_size, batch_size, dtype=torch.float64)
    for start in range(0, total, chunk):
        rows = torch.empty(batch_size, min(chunk, total - start))
        for i in range(batch_size):
            grads = torch.autograd.grad(per_sample_loss(i), params, allow_unused=True)
            grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params, strict=True)]
            rows[i] = torch.cat([g.flatten() for g in grads])[start : start + rows.shape[1]].cpu()
        K += (rows @ rows.T).double()
    return K


def network_analysis(q_net, target_net, batch: dict, args: Args) -> dict[str, float]:
    """Fig. 10 statistics on one replay batch, each named for what it measures: dormant neurons of the penultimate
    hidden units (the experts' hidden layer for MoEs, as the reference's DQN agent); feature norm and srank of the Q
    head's input (the flattened MoE output, what the reference's Rainbow agent measures) and of the experts' hidden
    layer; the rank of the empirical NTK of the per-sample training loss; for MoEs the expert load (combine mass per
    expert for Soft MoE, routed-token share for Top1), Top1's dropped tokens and Soft MoE's routing entropies and token
    diversity (`routing_statistics`)."""
    with torch.no_grad():
        _, metrics = dqn_loss(q_net, target_net, batch, args)
    aux = metrics["aux"]
    head_input, hidden = aux["head_input"], aux["hidden"]
    out = {
        "dormant_percentage": 100.0 * dormant_fraction(hidden, 0.0),
        "feature_norm_head_input": feature_norm(head_input),
        "srank_head_input": srank(head_input, 0.01),
        "srank_threshold_0.01_head_input": threshold_rank(head_input, 0.01),
        "td_loss": float(metrics["td_loss"]),
        "q_mean": float(metrics["q_values"]),
    }
    if "combine" in aux or "router_probs" in aux:
        out["feature_norm_expert_hidden"] = feature_norm(hidden.flatten(1, -2))
        out["srank_expert_hidden"] = srank(hidden.reshape(len(hidden), -1), 0.01)
        out["srank_threshold_0.01_expert_hidden"] = threshold_rank(hidden.reshape(len(hidden), -1), 0.01)

    def per_sample_loss(i):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        return dqn_loss(q_net, target_net, one, args)[1]["per_sample_loss"][0]

    params = [p for p in q_net.parameters() if p.requires_grad]
    K = empirical_ntk(per_sample_loss, params, len(batch["actions"]), args.ntk_memory_mb * 2**20)
    out["entk_srank_0.01"] = threshold_rank(K, 0.01)
    out["entk_srank_kumar"] = srank(K, 0.01)
    out["entk_diag_mean"] = float(K.diagonal().mean())
    if "combine" in aux:
        per_token = aux["combine"].sum(-1)  # (B, m, n): combine mass of each expert for each token
        load = per_token.mean((0, 1))  # share of the combine mass per expert (sums to 1)
        top = per_token.argmax(-1)  # the reference's logged "top_experts"
        out.update(routing_statistics(aux))
    elif "router_probs" in aux:
        top = aux["expert"]
        load = F.one_hot(top, aux["router_probs"].shape[-1]).float().mean((0, 1))  # share of the routed tokens
        out["dropped_token_fraction"] = float(1.0 - aux["kept"].float().mean())
    else:
        return out
    top_share = F.one_hot(top, len(load)).float().mean((0, 1))
    out.update({f"expert_load_{e}": float(v) for e, v in enumerate(load)})
    out.update({f"expert_top_token_share_{e}": float(v) for e, v in enumerate(top_share)})
    out["expert_load_max"] = float(load.max())
    return out


def log_analysis(run: Run, q_net, target_net, replay, args: Args, global_step: int, device):
    """The analysis draws its own random numbers (a generator seeded by the step; torch's generators forked and
    restored), so turning it on or off leaves the training run, its games and its updates, unchanged."""
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device.type == "cuda" else []):
        batch = to_tensors(replay.sample(32, np.random.default_rng(global_step), args.n_step, args.gamma), device)
        analysis = network_analysis(q_net, target_net, batch, args) | {"global_step": global_step}
        for k, v in analysis.items():
            run.writer.add_scalar(f"analysis/{k}", v, global_step)
        run.summary["analysis"] = analysis


# ======================================================================================================================
# Shared helpers: byte-identical in dqn_softmoe.py, rainbow_softmoe.py and cql_softmoe.py (a test checks), so that a
# diff between the scripts shows the algorithms
# ======================================================================================================================
# Standard no-op-start random / human reference scores (shared/reference/atari_scores.csv: the rliable / DQN Zoo /
# Dopamine table), for the human-normalised score (score - random) / (human - random).
RANDOM_HUMAN_SCORES = {
    "Alien": (227.8, 7127.7), "Amidar": (5.8, 1719.5), "Assault": (222.4, 742.0), "Asterix": (210.0, 8503.3),
    "Asteroids": (719.1, 47388.7), "Atlantis": (12850.0, 29028.1), "BankHeist": (14.2, 753.1),
    "BattleZone": (2360.0, 37187.5), "BeamRider": (363.9, 16926.5), "Berzerk": (123.7, 2630.4),
    "Bowling": (23.1, 160.7), "Boxing": (0.1, 12.1), "Breakout": (1.7, 30.5), "Centipede": (2090.9, 12017.0),
    "ChopperCommand": (811.0, 7387.8), "CrazyClimber": (10780.5, 35829.4), "Defender": (2874.5, 18688.9),
    "DemonAttack": (152.1, 1971.0), "DoubleDunk": (-18.6, -16.4), "Enduro": (0.0, 860.5),
    "FishingDerby": (-91.7, -38.7), "Freeway": (0.0, 29.6), "Frostbite": (65.2, 4334.7), "Gopher": (257.6, 2412.5),
    "Gravitar": (173.0, 3351.4), "Hero": (1027.0, 30826.4), "IceHockey": (-11.2, 0.9), "Jamesbond": (29.0, 302.8),
    "Kangaroo": (52.0, 3035.0), "Krull": (1598.0, 2665.5), "KungFuMaster": (258.5, 22736.3),
    "MontezumaRevenge": (0.0, 4753.3), "MsPacman": (307.3, 6951.6), "NameThisGame": (2292.3, 8049.0),
    "Phoenix": (761.4, 7242.6), "Pitfall": (-229.4, 6463.7), "Pong": (-20.7, 14.6), "PrivateEye": (24.9, 69571.3),
    "Qbert": (163.9, 13455.0), "Riverraid": (1338.5, 17118.0), "RoadRunner": (11.5, 7845.0), "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7), "Skiing": (-17098.1, -4336.9), "Solaris": (1236.3, 12326.7),
    "SpaceInvaders": (148.0, 1668.7), "StarGunner": (664.0, 10250.0), "Surround": (-10.0, 6.5),
    "Tennis": (-23.8, -8.3), "TimePilot": (3568.0, 5229.2), "Tutankham": (11.4, 167.6), "UpNDown": (533.4, 11693.2),
    "Venture": (0.0, 1187.5), "VideoPinball": (0.0, 17667.9), "WizardOfWor": (563.5, 4756.5),
    "YarsRevenge": (3092.9, 54576.9), "Zaxxon": (32.5, 9173.3),
}  # fmt: skip


def camel_name(rom: str) -> str:
    """'ms_pacman' -> 'MsPacman' (Gymnasium's spelling of ROM names)."""
    return "".join(part.capitalize() for part in rom.split("_"))


def game_from_env_id(env_id: str) -> str | None:
    """'ALE/MsPacman-v5' -> the ROM name 'ms_pacman', or None when no ROM has that name."""
    match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5", env_id)
    if match is None:
        return None
    roms = {rom.replace("_", ""): rom for rom in ale_py.roms.get_all_rom_ids()}
    return roms.get(match.group(1).lower())


def unknown_env_message(env_id: str) -> str:
    names = {camel_name(rom).lower(): camel_name(rom) for rom in ale_py.roms.get_all_rom_ids()}
    asked = re.sub(r"^(ALE/)?|(NoFrameskip)?(-v\d+)?$", "", env_id).lower()
    close = difflib.get_close_matches(asked, list(names), n=3, cutoff=0.5)
    hint = ", ".join(f"ALE/{names[c]}-v5" for c in close) if close else "ALE/<Game>-v5 such as ALE/Pong-v5"
    return f"unknown --env-id {env_id!r}; closest valid ids: {hint}"


def human_normalized(score: float, rom: str) -> float | None:
    """(score - random) / (human - random), or None for the games without reference scores."""
    ref = RANDOM_HUMAN_SCORES.get(camel_name(rom))
    if ref is None or not math.isfinite(score):
        return None
    return (score - ref[0]) / (ref[1] - ref[0])


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def optional_imports_error(args) -> str | None:
    if args.track:
        try:
            import wandb  # noqa: F401
        except ImportError:
            return "--track needs wandb; `pip install wandb` or drop --track"
    if args.capture_video:
        try:
            import moviepy  # noqa: F401
        except ImportError:
            return "--capture-video needs moviepy; `pip install moviepy` or drop --capture-video"
    return None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int, deterministic: bool):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = deterministic


class stop_signals:
    """`with stop_signals() as stopped:` SIGINT and SIGTERM (even when a background shell ignored SIGINT) end the loop
    at the next `stopped()` check, so that the summary and the checkpoint are written; the old handlers come back."""

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


def save_checkpoint(path: str, args, state: dict):
    """The script's format, the architecture it must match, the arguments and `state`; atomically (tmp + rename)."""
    tmp = f"{path}.tmp"
    torch.save({"format": f"{SCRIPT}/2", "architecture": architecture(args), "args": asdict(args)} | state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, args) -> dict:
    """Load and check a checkpoint against the requested architecture; raises ValueError with one clear line."""
    if not os.path.isfile(path):
        raise ValueError(f"--resume {path!r}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any unpickling failure means the file is not a checkpoint)
        raise ValueError(f"--resume {path!r} is not a readable checkpoint ({type(err).__name__})") from None
    found = ckpt.get("format") if isinstance(ckpt, dict) else None
    if found != f"{SCRIPT}/2":
        script = found.split("/")[0] if isinstance(found, str) else None
        if script == SCRIPT:
            raise ValueError(f"--resume {path!r} has the format {found} of an older {SCRIPT}.py, not {SCRIPT}/2")
        elsewhere = f" but a {script} one (algos/{script}.py)" if script else ""
        raise ValueError(f"--resume {path!r} is not a {SCRIPT} checkpoint{elsewhere}")
    want, have = architecture(args), ckpt["architecture"]
    if want != have:
        keys = sorted(set(want) | set(have))
        diff = ", ".join(
            f"{k}: checkpoint {have.get(k)} vs requested {want.get(k)}" for k in keys if want.get(k) != have.get(k)
        )
        raise ValueError(f"--resume {path!r} holds another architecture ({diff}); pass matching flags")
    return ckpt


def fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


if __name__ == "__main__":
    main(tyro.cli(Args))
