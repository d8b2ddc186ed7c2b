"""Rainbow (C51, n-step, prioritised replay, double DQN, dueling, NoisyNets) whose penultimate layer is a Soft MoE, a
Top1-MoE or a (widened) dense layer, on ALE games; with the Atari-100k presets DER and DrQ(epsilon).

Obando-Ceron, Sokar, Willi et al. (ICML 2024), "Mixtures of Experts Unlock Parameter Scaling for Deep RL", §2.2
(Soft MoE), §3 (the MoE replaces the penultimate dense layer), §4 (Rainbow: Figs. 1, 4-10, 18) and §5.2 (DER and
DrQ(epsilon): Figs. 12 and 16 are 50M-step runs; at 100k steps the paper has one sentence of text, "no real difference
between the different variants", with no figure, numbers or network), as `dopamine/labs/moes` builds it
(full_rainbow.gin, DER.gin; DrQ_eps.gin of labs/atari_100k). The Soft MoE and Top1-MoE equations are those of
dqn_softmoe.py; this file adds the agent:

    C51: Z(s, a) on the support z_i = v_min + i (v_max - v_min) / (N - 1), i < N = 51;
         p(s, a) = softmax_i(logits(s, a)), Q(s, a) = sum_i z_i p_i(s, a)
    n-step double-DQN target: a* = argmax_a Q_online(s_{t+n}, a); T z_j = R_t + gamma^n (1 - terminal) z_j with
         R_t = sum_{k<n} gamma^k clip(r_{t+k}, -1, 1); m_i = sum_j clip(1 - |clip(T z_j, v_min, v_max) - z_i| / dz,
         0, 1) p_j(s_{t+n}, a*) under the target network
    loss_i = -sum_k m_k log p_k(s_t, a_t) (cross-entropy), L = mean_i w_i loss_i; --num-atoms 1: a scalar Q, Huber
    prioritised replay: P(i) = p_i / sum_j p_j, new rows at the largest priority so far, one draw from each of 32 equal
         slices of the total; w_i = (P(i) + 1e-10)^-1/2 / max_j w_j (beta 0.5); after the update p_i = (loss_i +
         1e-10)^1/2
    dueling: logits = V(s) + A(s, a) - mean_a' A(s, a'); NoisyNets: W = mu_W + sigma_W * f(e_out) f(e_in)^T,
         f(x) = sign(x) sqrt|x|, one draw per forward pass (in an update's online pass one per sample), training
         epsilon 0; the experts' first layer is noisy too

The paper's Rainbow (Impala, Soft MoE with 8 experts, 50M agent steps) and the Atari-100k presets (100k agent steps,
then 100 evaluation episodes at epsilon 0.001):
    python algos/rainbow_softmoe.py --env-id ALE/Breakout-v5
    python algos/rainbow_softmoe.py --preset der --env-id ALE/Pong-v5          # or --preset drq-eps
Every flag, output and difference from the paper: docs/rainbow_softmoe.md. Fig. 10: benchmark/moe_analysis.py.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
import tyro
from torch import nn
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from envs import atari, code_version, damaged_member  # noqa: E402  (the Atari protocol the MoE scripts share)
from envs.atari import FRAME_SHAPE, STACK  # noqa: E402

SCRIPT = Path(__file__).stem  # names the experiment, the checkpoint file and its format


@dataclass
class Network:
    """The network's options: QNetwork is built from them, and a checkpoint records them as its architecture."""

    encoder: Literal["impala", "nature"] = "impala"
    """impala: 3 ResNet stacks 16/32/32, 3x3 (the reference code's; Impala is the paper's main encoder); nature: 3 convs
    32/64/64 (Fig. 7)"""
    impala_kernel: Literal[3, 4, 6] = 3
    """filter size of every Impala convolution (App. D, Fig. 18: 3 is the default, 4 and 6 the scaled variants)"""
    moe: Literal["softmoe", "top1", "none"] = "softmoe"
    """what replaces the penultimate dense layer: Soft MoE, Top1-MoE, or none (the dense 512-unit baseline)"""
    num_experts: int | None = None
    """experts n (default 8)"""
    tokenization: Literal["perconv", "perfeat", "persamp"] | None = None
    """how the encoder output becomes tokens (default perconv; Fig. 6)"""
    expert_width: int | None = None
    """hidden units of each expert (default 512; Fig. 5 uses 512 / n)"""
    random_phi: bool = False
    """softmoe: redraw Phi from N(0, 1) at every forward call instead of learning it (Fig. 8)"""
    moe_normalize: bool = False
    """softmoe: l2-normalise the tokens and the columns of Phi, times a learned scalar, for the logits (Fig. 13)"""
    width_multiplier: int = 1
    """none: widen the penultimate dense layer to 512 x k units (the scaled baseline of Fig. 1)"""
    num_atoms: int = 51
    """atoms N of the C51 return distribution; 1 = a scalar Q with the Huber loss (distributional=False)"""
    v_min: float = -10.0
    """lowest atom of the support (-vmax)"""
    v_max: float = 10.0
    """highest atom of the support (vmax)"""
    noisy: bool = True
    """factorised NoisyNets in the dense hidden layer or the experts' first layer, and the heads; --no-noisy explores
    epsilon-greedily"""
    dueling: bool = True
    """dueling heads: logits = V + A - mean_a A"""


@dataclass
class Args(Network):  # the Network options above come first in --help and in summary.json's args
    # --- experiment ---
    preset: Literal["full-rainbow", "der", "drq-eps"] = "full-rainbow"
    """full-rainbow (full_rainbow.gin: the defaults below), der (DER.gin) or drq-eps (DrQ_eps.gin): the defaults of
    the Atari-100k agents (PRESETS); flags given after it override it; `--preset NAME --help` shows them"""
    exp_name: str = SCRIPT
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the network initialisation, the exploration, the replay sampling and the emulators"""
    device: str = "auto"
    """'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N'"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    cuda_graph: bool = False
    """GPU only: record the update and the acting pass once as CUDA graphs and replay them (fewer kernel launches)"""
    bf16: bool = False
    """run the encoder in bfloat16 autocast; the MoE, the head and the loss stay float32"""
    track: bool = False
    """log to Weights & Biases (needs `pip install wandb`)"""
    wandb_project_name: str = "softmoe-deep-rl"
    """the wandb project"""
    wandb_entity: str | None = None
    """the wandb entity (team)"""
    capture_video: bool = False
    """mp4s of what the agent sees in env 0 in runs/{run_name}/videos/ (its episodes 0, 1, 8, ..., 1000, ... of this
    process: a resumed run counts from its resume)"""
    save_model: bool = False
    """save networks, optimiser, counters, episodes and generators to runs/{run_name}/{script}.pt, also mid-run"""
    checkpoint_replay: bool = False
    """with --save-model: save the replay memory and its priorities beside the checkpoint (7,072 bytes/transition)"""
    resume: str | None = None
    """checkpoint to go on from; --total-timesteps counts from the original start; every env starts a new episode"""
    write_every_minutes: float = 30.0
    """how often summary.json, episodes.csv and (with --save-model) the checkpoint are rewritten mid-run"""
    log_every_seconds: float = 10.0
    """how often the progress line is printed"""

    # --- environment (ale_py.AtariVectorEnv) ---
    env_id: str = "ALE/Breakout-v5"
    """Gymnasium ALE id, ALE/<Game>-v5; the protocol is set by --protocol, not by the id"""
    protocol: Literal["dopamine", "nature", "atari100k"] = "dopamine"
    """dopamine: sticky actions 0.25, game over ends the episode (the paper's); nature: 0-29 no-op emulator frames, a
    lost life is terminal; atari100k: 0-29 no-op agent steps (action 0, not counted or scored), a lost life is
    terminal (Dopamine's atari_100k_runner)"""
    num_envs: int = 1
    """environments stepped together; the updates per agent step stay --replay-ratio"""
    max_episode_frames: int = 108_000
    """episode cap in emulator frames (Dopamine's max_steps_per_episode: 27,000 agent steps; its environment at 5873f54
    also cuts at 100,000 frames, as terminal)"""
    truncation_is_terminal: bool = False
    """learn from the --max-episode-frames cut as terminal (Dopamine at HEAD), not never (the paper-era Dopamine)"""

    # --- algorithm: full Rainbow with the labs/moes defaults (full_rainbow.gin) ---
    total_timesteps: int = 50_000_000
    """agent steps summed over the environments; 50M = 200 iterations x 250k (200M frames)"""
    iteration_steps: int = 250_000
    """agent steps per Dopamine iteration: the mean return of the episodes that end in each is reported"""
    learning_rate: float = 6.25e-5
    """Adam learning rate"""
    adam_eps: float = 1.5e-4
    """Adam epsilon"""
    phi_adam_eps: float | None = None
    """ablation: Adam's epsilon for Soft MoE's Phi alone (its gradient is ~1e-7 RMS at init; losses/phi_grad_rms)"""
    buffer_size: int = 1_000_000
    """replay capacity in transitions (replay_capacity), shared evenly by the environments"""
    gamma: float = 0.99
    """discount factor gamma"""
    n_step: int = 3
    """n of the n-step return (update_horizon)"""
    batch_size: int = 32
    """transitions per gradient update"""
    replay_ratio: float = 0.25
    """gradient updates per agent step (Dopamine's update_period 4; the paper's Fig. 4 raises it)"""
    target_network_frequency: int = 8000
    """agent steps between hard copies of the online network into the target network (target_update_period)"""
    learning_starts: int = 20_000
    """agent steps before the first update (min_replay_history)"""
    end_e: float = 0.01
    """final exploration rate epsilon (epsilon_train); only with --no-noisy (NoisyNets explore with epsilon 0)"""
    epsilon_decay_steps: int = 250_000
    """agent steps over which epsilon falls linearly from 1 to --end-e after --learning-starts (epsilon_decay_period)"""
    load_balance_coef: float = 0.0
    """top1: weight of the importance and load losses added to the TD loss (0 = off, the reference's default)"""
    double: bool = True
    """double DQN: the online network picks a* at s_{t+n}, the target network evaluates it"""
    noise_per_sample: bool = True
    """NoisyNets: in an update's online pass each sample draws its own noise, as the reference's per-sample keys do
    (labs/moes agents' `train`); the target's passes and acting draw one for the batch. --no-noise-per-sample: one
    draw for the whole minibatch in the online pass too (Dopamine's full_rainbow_agent.py)"""
    uniform_replay: bool = False
    """sample the replay memory uniformly instead of by priority (replay_scheme 'uniform')"""
    compact: bool = False
    """Dopamine's plain Rainbow (rainbow_agent.py: C51, n-step, prioritised replay): noisy, dueling and double off"""
    data_augmentation: bool = False
    """DrQ: each sampled state and next state edge-padded by 4, randomly cropped to 84x84, intensity x (1 + 0.05 N)"""

    # --- evaluation (Atari 100k: Dopamine's DataEfficientAtariRunner) ---
    eval_episodes: int = 0
    """episodes (one per parallel env) of the evaluation after training and every --eval-every steps, at --eval-epsilon
    with the noise off; 0 = none (Dopamine's online protocol scores the training episodes); the 100k presets set 100"""
    eval_every: int = 0
    """agent steps between evaluations during training; 0 = only after training"""
    eval_epsilon: float = 0.001
    """epsilon of the evaluation policy (epsilon_eval)"""

    # --- analysis (Fig. 10) ---
    snapshot_every: Annotated[int, tyro.conf.arg(aliases=("--analysis-every",))] = 0
    """agent steps between snapshots (networks + 32 replay transitions) for benchmark/moe_analysis.py (Fig. 10 took
    one every 250k steps; a snapshot is twice the network's size); 0 = never"""


# What each preset changes from the full-Rainbow defaults (dopamine/labs/moes/configs/DER.gin; DrQ(eps) has no MoE
# gin file, so dopamine/labs/atari_100k/configs/DrQ_eps.gin; the 100k protocol: dopamine/labs/atari_100k/
# atari_100k_runner.py); both keep the defaults' network, the reference code's Impala encoder with 8 experts (Fig. 12's
# expert count; a 50M-step figure: the paper's 100k statement is text only and names no network); the shipped DER.gin
# has --encoder nature --num-experts 4
ATARI_100K = dict(
    protocol="atari100k",
    total_timesteps=100_000,
    iteration_steps=10_000,
    learning_starts=1600,
    learning_rate=1e-4,
    adam_eps=1.5e-4,
    replay_ratio=1.0,
    eval_episodes=100,  # update_period 1; 10 iterations of 10k, then 100 episodes
    n_step=10,  # "10 as in SPR, instead of DER's 20" (DER.gin)
    snapshot_every=10_000,  # ours, once per iteration (Fig. 10 analysed 50M-step runs): the routing over a 100k run
)
PRESETS = {
    "full-rainbow": {},
    "der": ATARI_100K | dict(target_network_frequency=2000, epsilon_decay_steps=2000),
    "drq-eps": ATARI_100K
    | dict(
        target_network_frequency=1,
        epsilon_decay_steps=5000,
        num_atoms=1,
        noisy=False,
        uniform_replay=True,
        data_augmentation=True,
    ),  # DQN with a scalar Q (Huber), DrQ
}


def preset_args(name: str, **overrides) -> Args:
    """The Args of a preset, with explicit values on top."""
    return replace(Args(), **({"preset": name} | PRESETS[name] | overrides))


def parse_args(argv: list[str]) -> Args:
    """`--preset NAME` picks the defaults tyro shows and parses over; an unknown name is a one-line error."""
    name = "full-rainbow"
    for i, arg in enumerate(argv):
        if arg == "--preset" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--preset="):
            name = arg.split("=", 1)[1]
    if name not in PRESETS:
        raise SystemExit(f"error: unknown --preset {name!r}; choose one of {', '.join(PRESETS)}")
    return tyro.cli(Args, args=argv, default=preset_args(name))


def fill_defaults(args: Args) -> Args:
    """MoE settings left at None get the reference's values (only for the MoE variants, so misuse is detectable);
    --compact turns the full-Rainbow parts off."""
    if args.compact:
        args.noisy = args.dueling = args.double = False
    if args.moe != "none":
        args.num_experts = 8 if args.num_experts is None else args.num_experts
        args.tokenization = args.tokenization or "perconv"
        args.expert_width = 512 if args.expert_width is None else args.expert_width
    return args


def validate(args: Args) -> str | None:
    """One clear line for the first impossible setting, checked before anything is written."""
    for name, value in asdict(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"--{name.replace('_', '-')} must be a finite number, got {value}"
    moe = args.moe != "none"
    dense = "needs an MoE; --moe none has a dense penultimate layer (use --moe softmoe or top1)"
    envs = max(args.num_envs, 1)
    rows = -(-args.buffer_size // envs)
    memory = rows * envs * FrameReplay.BYTES_PER_TRANSITION
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    checks = [
        (atari.game_from_env_id(args.env_id) is None, atari.unknown_env_message(args.env_id)),
        (not moe and args.num_experts is not None, f"--num-experts {dense}"),
        (not moe and args.tokenization is not None, f"--tokenization {dense}"),
        (
            not moe and args.expert_width is not None,
            "--expert-width needs an MoE; widen the --moe none baseline with --width-multiplier",
        ),
        (moe and args.num_experts < 1, f"--num-experts must be at least 1, got {args.num_experts}"),
        (moe and args.expert_width < 1, f"--expert-width must be at least 1, got {args.expert_width}"),
        (
            moe and args.width_multiplier != 1,
            "--width-multiplier widens the --moe none baseline; scale an MoE with --num-experts",
        ),
        (
            args.moe != "softmoe" and (args.random_phi or args.moe_normalize),
            "--random-phi and --moe-normalize act on Soft MoE's Phi; they need --moe softmoe",
        ),
        (
            args.phi_adam_eps is not None and (args.moe != "softmoe" or args.random_phi or not args.phi_adam_eps > 0),
            "--phi-adam-eps sets a positive eps for Soft MoE's learned Phi; it needs --moe softmoe without "
            "--random-phi",
        ),
        (
            args.moe != "top1" and args.load_balance_coef != 0,
            "--load-balance-coef needs --moe top1 (Soft MoE has no router to balance)",
        ),
        (
            args.width_multiplier < 1 or args.load_balance_coef < 0,
            "--width-multiplier must be at least 1 and --load-balance-coef non-negative",
        ),
        (
            min(args.num_envs, args.batch_size, args.n_step) < 1,
            "--num-envs, --batch-size and --n-step must be at least 1",
        ),
        (
            min(args.replay_ratio, args.learning_rate, args.target_network_frequency) <= 0,
            "--replay-ratio, --learning-rate and --target-network-frequency must be positive",
        ),
        (
            min(args.total_timesteps, args.epsilon_decay_steps, args.iteration_steps) < 1,
            "--total-timesteps, --epsilon-decay-steps and --iteration-steps must be positive",
        ),
        (min(args.learning_starts, args.snapshot_every) < 0, "--learning-starts and --snapshot-every must be >= 0"),
        (
            not (0 <= args.gamma <= 1 and 0 <= args.end_e <= 1 and 0 <= args.eval_epsilon <= 1),
            "--gamma, --end-e and --eval-epsilon must lie in [0, 1]",
        ),
        (args.encoder == "nature" and args.impala_kernel != 3, "--impala-kernel needs --encoder impala"),
        (args.num_atoms < 1, f"--num-atoms must be at least 1 (1 = a scalar Q), got {args.num_atoms}"),
        (
            args.num_atoms > 1 and args.v_min >= args.v_max,
            f"--v-min ({args.v_min}) must be below --v-max ({args.v_max})",
        ),
        (min(args.eval_episodes, args.eval_every) < 0, "--eval-episodes and --eval-every must be >= 0"),
        (
            args.eval_every > 0 and not args.eval_episodes,
            "--eval-every needs --eval-episodes (the number of evaluation episodes)",
        ),
        (
            args.checkpoint_replay and not args.save_model,
            "--checkpoint-replay saves the replay memory with the checkpoint; add --save-model",
        ),
        (
            rows < 2 * STACK + args.n_step,
            f"--buffer-size {args.buffer_size} is too small: it needs {2 * STACK + args.n_step} rows per environment",
        ),
        (
            memory + 2**30 > available,
            f"--buffer-size {args.buffer_size:,} needs {memory / 1e9:.1f} GB of replay memory "
            f"plus 1 GB headroom, but this machine has {available / 1e9:.1f} GB; lower --buffer-size",
        ),
        (
            args.device.startswith("cuda") and not torch.cuda.is_available(),
            f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto",
        ),
        (
            args.cuda_graph and (args.device == "cpu" or not torch.cuda.is_available()),
            "--cuda-graph records CUDA graphs and needs a GPU; drop it on a CPU",
        ),
        (args.track and not importlib.util.find_spec("wandb"), "--track needs wandb; `pip install wandb` or drop it"),
        (
            args.capture_video and not importlib.util.find_spec("moviepy"),
            "--capture-video needs moviepy; `pip install moviepy` or drop --capture-video",
        ),
    ]
    return next((message for failed, message in checks if failed), None)


# ----------------------------------------------------------------------------------------------------------------------
# Replay memory: every frame stored once, stacks and n-step returns rebuilt at sample time; prioritised sampling
# ----------------------------------------------------------------------------------------------------------------------
class SumTree:
    """Priorities p_i of `size` slots in a binary tree whose nodes hold the sums of their children (Dopamine's
    sum_tree.py), in numpy; every operation takes a whole batch, the loops run over the tree's levels."""

    def __init__(self, size: int):
        self.depth = max(1, math.ceil(math.log2(size)))
        self.first_leaf = 2**self.depth
        self.nodes = np.zeros(2 * self.first_leaf)  # node k has children 2k and 2k + 1; the root is node 1
        self.max_recorded = 1.0  # the priority that new rows get

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def get(self, index: np.ndarray) -> np.ndarray:
        return self.nodes[self.first_leaf + index]

    def set(self, index: np.ndarray, priority: np.ndarray):
        """p[index] = priority; a slot given twice keeps its last value, as Dopamine's sequential updates do."""
        index, priority = np.asarray(index), np.broadcast_to(np.asarray(priority, dtype=np.float64), np.shape(index))
        _, last = np.unique(index[::-1], return_index=True)
        keep = len(index) - 1 - last
        node = self.first_leaf + index[keep]
        self.nodes[node] = priority[keep]
        for _ in range(self.depth):  # the sums on the paths to the root, one level at a time
            node = np.unique(node // 2)
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]
        self.max_recorded = max(self.max_recorded, float(priority.max(initial=0.0)))

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each mass in [0, total): the slot i with sum_{j<i} p_j <= mass < sum_{j<=i} p_j."""
        node, mass = np.ones(len(mass), dtype=np.int64), mass.astype(np.float64)
        for _ in range(self.depth):
            left = self.nodes[2 * node]
            right = mass >= left
            mass = mass - left * right
            node = 2 * node + right
        return node - self.first_leaf

    def sample(self, batch_size: int, rng: np.random.Generator, stratified: bool = True) -> np.ndarray:
        """P(i) = p_i / total. Stratified: one draw from each of batch_size equal slices of the total mass."""
        u = rng.random(batch_size)
        mass = (np.arange(batch_size) + u) / batch_size if stratified else u
        return self.find(np.minimum(mass * self.total, np.nextafter(self.total, 0)))


class FrameReplay:
    """Circular memory of (rows, num_envs) slots; the environments write one row together at every step. Row t of env k
    holds the newest frame of the observation o_t it acted on, a_t, the clipped r_{t+1}, whether s_{t+1} is terminal,
    `valid` (False on an episode's final observation, whose next step is ale_py's reset step, and on the step cut by
    the time limit) and `history`, the earlier frames of the same stack in o_t (at most 3): the stack of row t is frames
    t-3..t with the `3 - history` oldest zeroed, so a stack never reaches into another episode. A sample at row t uses
    rows t..t+L-1, L = n or up to the first terminal; all of them must be valid. With `prioritized`, slot (t, k) has a
    priority in a SumTree: a new row gets the largest priority recorded so far (0 if not valid), and the learner sets
    p = sqrt(loss + 1e-10) after each update."""

    # what a row holds, name: (dtype, shape of one env's entry); the arrays, add, the checkpoint files derive from it
    FIELDS = {
        "frames": (np.uint8, FRAME_SHAPE),
        "actions": (np.uint8, ()),
        "rewards": (np.float32, ()),
        "terminals": (bool, ()),
        "valid": (bool, ()),
        "history": (np.uint8, ()),
    }
    # the fields the network reads of a state beside its frame stack (network_inputs gives them when acting)
    INPUTS = ()
    BYTES_PER_TRANSITION = sum(np.dtype(dtype).itemsize * math.prod(shape) for dtype, shape in FIELDS.values())

    def __init__(self, capacity: int, num_envs: int, prioritized: bool = False):
        self.rows, self.num_envs = -(-capacity // num_envs), num_envs
        self.tree = SumTree(self.rows * num_envs) if prioritized else None
        for name, (dtype, shape) in self.FIELDS.items():  # pages are only touched when written
            setattr(self, name, np.zeros((self.rows, num_envs, *shape), dtype=dtype))
        self.cursor, self.count = 0, 0  # the next row to write, the rows written (at most self.rows)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.FIELDS)

    def add(self, **row: np.ndarray):
        """One row for every environment, one array per field: frames (N, 84, 84), the others (N,)."""
        assert row.keys() == self.FIELDS.keys(), f"add() takes exactly the fields {list(self.FIELDS)}"
        for name in self.FIELDS:
            getattr(self, name)[self.cursor] = row[name]
        if self.tree is not None:
            slots = self.cursor * self.num_envs + np.arange(self.num_envs)
            self.tree.set(slots, np.where(row["valid"], self.tree.max_recorded, 0.0))
        self.cursor, self.count = (self.cursor + 1) % self.rows, min(self.count + 1, self.rows)

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

    def sample(self, batch_size: int, rng: np.random.Generator, n_step: int = 1, gamma: float = 0.99) -> dict:
        """Uniform over the stored transitions whose stacks are still in memory and whose n steps may be learned, or
        by priority (sample_prioritized); with the importance-sampling weights."""
        if self.tree is not None:
            return self.sample_prioritized(batch_size, rng, n_step, gamma)
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
        return self.transitions(age, env, n_step, gamma, np.ones(batch_size, dtype=np.float32))

    def sample_prioritized(self, batch_size: int, rng: np.random.Generator, n_step: int, gamma: float) -> dict:
        """Dopamine's prioritised sampling: one draw per stratum; a draw that may not be learned from is redrawn from
        the whole distribution. Weights w_i = (P(i) + 1e-10)^-1/2 / max_j w_j (Dopamine passes the raw priority for
        P(i); the division by the maximum makes the two the same up to the 1e-10)."""
        slots = self.tree.sample(batch_size, rng, stratified=True)
        for _ in range(1000):
            age, env = (slots // self.num_envs - self.cursor + self.count) % self.rows, slots % self.num_envs
            bad = ~(self.windows(age, env, n_step, gamma)[0] & (self.tree.get(slots) > 0))
            if not bad.any():
                break
            slots[bad] = self.tree.sample(int(bad.sum()), rng, stratified=False)
        else:
            raise RuntimeError("the replay memory holds no complete transition yet")
        weights = 1.0 / np.sqrt(self.tree.get(slots) / self.tree.total + 1e-10)
        return self.transitions(age, env, n_step, gamma, (weights / weights.max()).astype(np.float32))

    def inputs(self, age: np.ndarray, env: np.ndarray) -> dict[str, np.ndarray]:
        """The network's inputs for the states at rows `age` of envs `env`: the frame stacks and the INPUTS fields."""
        rows = self._row(age)
        return {"obs": self.stacks(age, env)} | {name: getattr(self, name)[rows, env] for name in self.INPUTS}

    def transitions(self, age: np.ndarray, env: np.ndarray, n_step: int, gamma: float, weights: np.ndarray) -> dict:
        """The batch: the inputs of s_t and s_{t+L}, a_t, the n-step return, whether s_{t+L} is terminal, the
        importance weights."""
        _, length, returns, terminal = self.windows(age, env, n_step, gamma)
        rows = self._row(age)
        return {
            "states": self.inputs(age, env),
            "next_states": self.inputs(age + length, env),
            "rows": rows,
            "actions": self.actions[rows, env].astype(np.int64),
            "rewards": returns,
            "terminals": terminal.astype(np.float32),
            "envs": env,
            "weights": weights,
        }

    def update_priorities(self, batch: dict, losses: torch.Tensor):
        """p = sqrt(loss + 1e-10) for the sampled slots (nothing to do for uniform sampling)."""
        if self.tree is not None:
            priorities = np.sqrt(losses.detach().double().cpu().numpy() + 1e-10)
            self.tree.set(batch["rows"] * self.num_envs + batch["envs"], priorities)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The rows written so far and the priorities (for --checkpoint-replay)."""
        state = {name: getattr(self, name)[: self.count] for name in self.FIELDS}
        if self.tree is not None:
            state |= {
                "priorities": self.tree.get(np.arange(self.rows * self.num_envs)),
                "max_priority": np.array(self.tree.max_recorded),
            }
        return state | {"pointers": np.array([self.cursor, self.count, self.rows, self.num_envs])}

    def load_state_dict(self, state: dict[str, np.ndarray]):
        cursor, count, rows, num_envs = (int(v) for v in state["pointers"])
        if (rows, num_envs) != (self.rows, self.num_envs):
            raise ValueError(
                f"its replay memory has {rows:,} rows x {num_envs} envs, this run {self.rows:,} x {self.num_envs}; "
                "pass the original --buffer-size and --num-envs"
            )
        if self.tree is not None and "priorities" not in state:
            raise ValueError("its replay memory holds no priorities (it was sampled uniformly); add --uniform-replay")
        for name in self.FIELDS:
            getattr(self, name)[:count] = state[name]
        self.cursor, self.count = cursor, count
        self.valid[(cursor - 1) % self.rows] = False  # the envs start new episodes: the last row has no successor
        if self.tree is not None:
            self.tree.set(np.arange(self.rows * self.num_envs), state["priorities"])
            self.tree.max_recorded = float(state["max_priority"])


# ----------------------------------------------------------------------------------------------------------------------
# Network: Flax's initialisers and padding, the encoders, tokens, NoisyNets, Soft MoE, Top1-MoE, the Q-network
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
    """conv(pad_same(x)); where the padding is symmetric the convolution pads by itself (no padded copy: faster)."""
    left, right, top, bottom = same_padding(x, conv.kernel_size[0], conv.stride[0])
    if left == right and top == bottom:
        return F.conv2d(x, conv.weight, conv.bias, conv.stride, (top, left))
    return conv(F.pad(x, [left, right, top, bottom]))


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
    """x + Conv(ReLU(Conv(ReLU(x)))), k x k convs (SAME) with Flax's default lecun_normal init."""

    def __init__(self, channels: int, kernel: int = 3):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel, padding="same")
        self.conv1 = nn.Conv2d(channels, channels, kernel, padding="same")
        for conv in (self.conv0, self.conv1):
            lecun_normal_(conv.weight, channels * kernel**2)
            nn.init.zeros_(conv.bias)

    def forward(self, x):
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaEncoder(nn.Module):
    """Three stacks (16, 32, 32 channels) of Conv k x k (xavier) -> max-pool 3x3/2 SAME (-inf padding) -> 2 residual
    blocks, then ReLU. (B, 4, 84, 84) -> 84 -> 42 -> 21 -> 11 -> (B, 32, 11, 11). k = 3; App. D also runs 4 and 6
    (PyTorch's 'same' puts the odd pixel of an even kernel's padding after, as TensorFlow does)."""

    def __init__(self, channels=(16, 32, 32), kernel: int = 3):
        super().__init__()
        self.convs, self.blocks = nn.ModuleList(), nn.ModuleList()
        for c_in, c in zip((4, *channels), channels, strict=False):
            self.convs.append(xavier_layer(nn.Conv2d(c_in, c, kernel, padding="same")))
            self.blocks.append(nn.Sequential(ResidualBlock(c, kernel), ResidualBlock(c, kernel)))

    def forward(self, x):
        for conv, blocks in zip(self.convs, self.blocks, strict=True):
            x = blocks(F.max_pool2d(pad_same(conv(x), 3, 2, value=float("-inf")), 3, 2))
        return F.relu(x)


def tokenize(features: torch.Tensor, kind: str) -> torch.Tensor:
    """Encoder output C (B, d, h, w) -> tokens X (B, m, token dim) (§3, Fig. 3): perconv m = h*w tokens of size d
    (row-major over the grid), perfeat m = d tokens of size h*w, persamp one token (a channel-major flatten)."""
    if kind == "perconv":
        return features.flatten(2).transpose(1, 2)  # (B, h*w, d)
    if kind == "perfeat":
        return features.flatten(2)  # (B, d, h*w)
    if kind == "persamp":
        return features.flatten(1)[:, None]  # (B, 1, d*h*w)
    raise ValueError(kind)


def factorised_noise(shape, device) -> torch.Tensor:
    """NoisyNets (Fortunato et al. 2018, eq. 10-11): f(e) = sign(e) sqrt|e|, e ~ N(0, 1)."""
    e = torch.randn(shape, device=device)
    return e.sign() * e.abs().sqrt()


class NoisyLinear(nn.Module):
    """y = x (mu_W + sigma_W * f(e_out) f(e_in)^T)^T + mu_b + sigma_b * f(e_out), factorised Gaussian noise as
    Dopamine's NoisyNetwork: mu ~ U(+-1/sqrt(fan_in)), sigma = 0.1/sqrt(fan_in). A fresh draw at every forward pass,
    shared by the batch, or with `per_sample` set (`set_noise_per_sample`: the update's online pass) each sample's
    own, as the reference's per-sample keys draw it (`train` in labs/moes/agents/full_rainbow_moe_agent.py and
    rainbow_100k_moe_agent.py); every layer and network draws its own (the reference feeds one key to a network's
    dense layer and heads, and one to both passes of the double-DQN target). In eval mode (evaluation, analysis) it
    uses the means."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        bound, sigma = 1.0 / math.sqrt(in_features), 0.1 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features).uniform_(-bound, bound))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma))
        self.per_sample = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in) -> (B, out)
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        draws = (len(x),) if self.per_sample else ()
        eps_in = factorised_noise(draws + self.weight_mu.shape[1:], x.device)
        eps_out = factorised_noise(draws + self.weight_mu.shape[:1], x.device)
        # x W^T = x mu^T + ((x * f(e_in)) sigma^T) * f(e_out): the (out x in) noisy matrix is never formed (15x cheaper
        # when acting on one state, ~20% for a batch of 32 on a CPU), so a draw per sample costs no more matmuls
        noise = (F.linear(x * eps_in, self.weight_sigma) + self.bias_sigma) * eps_out
        return F.linear(x, self.weight_mu, self.bias_mu) + noise


def set_noise_per_sample(net: nn.Module, per_sample: bool) -> None:
    """Whether net's NoisyNet layers (NoisyLinear, noisy Experts) draw their noise per sample or once per batch."""
    for module in net.modules():
        if isinstance(module, (NoisyLinear, Experts)):
            module.per_sample = per_sample


def dense_layer(in_features: int, out_features: int, noisy: bool) -> nn.Module:
    """A NoisyNet layer, or Dopamine's plain Dense (xavier_uniform, zero bias)."""
    return NoisyLinear(in_features, out_features) if noisy else xavier_layer(nn.Linear(in_features, out_features))


class Experts(nn.Module):
    """n = cfg.num_experts independent experts f_e(x) = Dense(ReLU(Dense(x))): d -> width -> d (width =
    cfg.expert_width), xavier_uniform kernels, zero biases, stacked on a leading expert axis. With cfg.noisy the first
    Dense is a NoisyNet layer (its own mu / sigma init, one draw per expert and forward pass in train mode, or per
    expert and sample with `per_sample`, as NoisyLinear; the reference's experts share one draw); the projection back
    to d stays plain, as in the reference. (B, n, slots, d)
    -> outputs (B, n, slots, d), hidden (B, n, slots, width)."""

    def __init__(self, cfg: Network, dim: int):
        super().__init__()
        num_experts, width, self.noisy = cfg.num_experts, cfg.expert_width, cfg.noisy
        self.w1 = nn.Parameter(torch.empty(num_experts, dim, width))
        self.b1 = nn.Parameter(torch.zeros(num_experts, width))
        self.w2 = nn.Parameter(torch.empty(num_experts, width, dim))
        self.b2 = nn.Parameter(torch.zeros(num_experts, dim))
        bound = math.sqrt(6.0 / (dim + width))  # xavier_uniform, the same for both layers
        nn.init.uniform_(self.w1, -bound, bound)
        nn.init.uniform_(self.w2, -bound, bound)
        if self.noisy:
            bound, sigma = 1.0 / math.sqrt(dim), 0.1 / math.sqrt(dim)
            nn.init.uniform_(self.w1, -bound, bound)
            nn.init.uniform_(self.b1, -bound, bound)
            self.w1_sigma = nn.Parameter(torch.full((num_experts, dim, width), sigma))
            self.b1_sigma = nn.Parameter(torch.full((num_experts, width), sigma))
        self.per_sample = False

    def forward(self, slots: torch.Tensor):
        B, n, s, d = slots.shape
        x = slots.transpose(0, 1).reshape(n, B * s, d)  # one matmul per expert over all its slots
        w1, b1, width = self.w1, self.b1, self.w1.shape[-1]
        noisy = self.noisy and self.training
        if noisy and not self.per_sample:  # one draw for the batch: the noisy matrix, formed
            eps_in, eps_out = factorised_noise((n, d, 1), x.device), factorised_noise((n, 1, width), x.device)
            w1, b1 = w1 + self.w1_sigma * eps_in * eps_out, b1 + self.b1_sigma * eps_out[:, 0]
        pre = torch.baddbmm(b1[:, None], x, w1)  # (n, B*s, width)
        if noisy and self.per_sample:  # sample b's own draw: ((x * f(e_in)) sigma) * f(e_out)
            eps_in, eps_out = factorised_noise((n, B, 1, d), x.device), factorised_noise((n, B, 1, width), x.device)
            noise = torch.baddbmm(self.b1_sigma[:, None], (x.view(n, B, s, d) * eps_in).flatten(1, 2), self.w1_sigma)
            pre = pre + (noise.view(n, B, s, width) * eps_out).flatten(1, 2)
        hidden = torch.relu(pre)
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
    kernel; the scalar (init 1) is always created but only used with normalisation, as in the reference. Its options
    (num_experts, expert_width, random_phi, moe_normalize) are read from `cfg`, the Network options."""

    def __init__(self, cfg: Network, dim: int, num_tokens: int):
        super().__init__()
        self.cfg = cfg
        self.slots = -(-num_tokens // cfg.num_experts)
        self.phi_shape = (dim, cfg.num_experts, self.slots)
        fan_in = cfg.num_experts * dim
        self.phi = None if cfg.random_phi else nn.Parameter(lecun_normal_(torch.empty(self.phi_shape), fan_in))
        self.scalar = nn.Parameter(torch.ones(1))
        self.experts = Experts(cfg, dim)

    def forward(self, tokens):
        phi = self.phi
        if self.cfg.random_phi:  # a fresh N(0, 1) Phi for every sample of every call (the reference's per-sample keys)
            phi = torch.randn((tokens.shape[0],) + self.phi_shape, device=tokens.device)
        scale = self.scalar if self.cfg.moe_normalize else None
        outputs, dispatch, combine, hidden = soft_moe(tokens, phi, self.experts, scale)
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
    an overflowing token outputs zero; kept outputs are scaled by the gate probability. Options from `cfg`."""

    def __init__(self, cfg: Network, dim: int, num_tokens: int):
        super().__init__()
        self.cfg = cfg
        self.capacity = -(-num_tokens // cfg.num_experts)
        self.router = nn.Parameter(lecun_normal_(torch.empty(dim, cfg.num_experts), dim))
        self.experts = Experts(cfg, dim)

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
    p_mean = (1.0 - torch.special.ndtr((threshold - logits) / noise_std)).mean(1)  # (B, n)
    return ((p_mean.std(-1, unbiased=False) / p_mean.mean(-1)) ** 2).mean()


def load_balancing_loss(aux: dict, num_experts: int) -> torch.Tensor:
    """Importance + load loss with the reference's weights (1, 1) and noise std 1 / n."""
    noise_std, logits = 1.0 / num_experts, aux["router_logits"]
    noisy = logits + noise_std * torch.randn_like(logits)
    return importance_loss(aux["router_probs"]) + load_loss(logits, noisy, noise_std)


class QNetwork(nn.Module):
    """inputs["obs"], uint8 stacks (B, 4, 84, 84), / 255 -> encoder -> [Dense(512 k) + ReLU | tokens -> MoE -> flatten]
    -> dueling heads V (N) and A (A x N) -> logits (B, A, N) = V + A - mean_a A -> Q = sum_i z_i softmax(logits)_i (the
    single logit when N = 1). The dense layers are NoisyNet layers with `noisy`. Built from the Network options of
    `args` (and --bf16); `inputs` is the mapping that FrameReplay.inputs and network_inputs build, the one place that
    names what the network reads."""

    def __init__(self, num_actions: int, args: Args):
        super().__init__()
        self.moe_kind, self.tokenization, self.bf16 = args.moe, args.tokenization, args.bf16
        self.num_actions, self.num_atoms, self.dueling, noisy = num_actions, args.num_atoms, args.dueling, args.noisy
        self.encoder = NatureEncoder() if args.encoder == "nature" else ImpalaEncoder(kernel=args.impala_kernel)
        with torch.no_grad():
            features = self.encoder(torch.zeros(1, STACK, *FRAME_SHAPE))  # (1, d, h, w)
        if args.moe == "none":
            self.dense = dense_layer(features[0].numel(), 512 * args.width_multiplier, noisy)
            head_inputs = 512 * args.width_multiplier
        else:
            num_tokens, dim = tokenize(features, args.tokenization).shape[1:]
            self.moe = (SoftMoE if args.moe == "softmoe" else Top1MoE)(args, dim, num_tokens)
            head_inputs = num_tokens * dim  # the output tokens are flattened, no pooling
        if self.dueling:
            self.value = dense_layer(head_inputs, self.num_atoms, noisy)
            self.advantage = dense_layer(head_inputs, num_actions * self.num_atoms, noisy)
        else:
            self.head = dense_layer(head_inputs, num_actions * self.num_atoms, noisy)
        self.register_buffer("support", torch.linspace(args.v_min, args.v_max, self.num_atoms))  # z_i

    def forward(self, inputs: dict[str, torch.Tensor], return_aux: bool = False):
        x = inputs["obs"]
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.bf16):  # --bf16: the convolutions
            features = self.encoder(x.float() / 255.0).float()  # (B, d, h, w)
        if self.moe_kind == "none":
            hidden = F.relu(self.dense(features.flatten(1)))  # (B, 512 k)
            aux = {"hidden": hidden, "head_input": hidden}
        else:
            outputs, aux = self.moe(tokenize(features, self.tokenization))  # (B, m, d)
            aux["head_input"] = outputs.flatten(1)
        B, h = len(x), aux["head_input"]
        if self.dueling:
            value = self.value(h).view(B, 1, self.num_atoms)
            advantage = self.advantage(h).view(B, self.num_actions, self.num_atoms)
            aux["logits"] = value + advantage - advantage.mean(1, keepdim=True)  # (B, A, N)
        else:
            aux["logits"] = self.head(h).view(B, self.num_actions, self.num_atoms)
        q = (torch.softmax(aux["logits"], -1) * self.support).sum(-1) if self.num_atoms > 1 else aux["logits"][..., 0]
        return (q, aux) if return_aux else q  # q: (B, A)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def build_network(args: Args, num_actions: int) -> QNetwork:
    return QNetwork(num_actions, args)


def architecture(args: Args) -> dict:
    """What a checkpoint must match to be loaded into this run's network: the game and the Network options."""
    return {"env_id": args.env_id} | {f.name: getattr(args, f.name) for f in fields(Network)}


# ----------------------------------------------------------------------------------------------------------------------
# Rainbow: exploration, evaluation, the C51 target, the loss, one update (eager, or as a CUDA graph), the acting pass
# ----------------------------------------------------------------------------------------------------------------------
def epsilon_schedule(step: int, decay_steps: int, warmup_steps: int, end_e: float) -> float:
    """Dopamine's linearly_decaying_epsilon: eps = end + clip((1 - end)(decay + warmup - step) / decay, 0, 1 - end),
    i.e. 1 for the first `warmup_steps` steps, then linear down to `end_e` over `decay_steps` steps."""
    bonus = (1.0 - end_e) * (decay_steps + warmup_steps - step) / decay_steps
    return end_e + min(max(bonus, 0.0), 1.0 - end_e)


def network_inputs(obs: np.ndarray, tracker: atari.EpisodeTracker) -> dict[str, np.ndarray]:
    """The network's inputs for every environment's current step, built from what the loop tracks (the stacks, and
    the tracker's episode counters): what FrameReplay.inputs gives for a stored state. A field added to
    FrameReplay.INPUTS is computed here too (main stores it with the row)."""
    return {"obs": obs}


def select_actions(
    q_net, inputs: dict, epsilon: float, rng: np.random.Generator, num_actions: int, device, policy=None
):
    """epsilon-greedy per environment; the network only sees the environments that act greedily (a GraphedPolicy,
    --cuda-graph, gives every environment's greedy action in one replay). Returns the actions and the acting step's
    diagnostics: every scalar in them is logged (charts/<name> in tensorboard, summary.json's "acting")."""
    num_envs = len(next(iter(inputs.values())))
    actions = rng.integers(0, num_actions, size=num_envs)
    greedy = rng.random(num_envs) > epsilon  # Dopamine explores when u <= epsilon
    if greedy.any() and policy is not None:
        actions[greedy] = policy(inputs)[greedy]
    elif greedy.any():
        with torch.inference_mode():
            acting = {k: torch.from_numpy(v[greedy]).to(device) for k, v in inputs.items()}
            actions[greedy] = q_net(acting).argmax(1).cpu().numpy()
    return actions.astype(np.int32), {"epsilon": epsilon}


def evaluate(q_net, args: Args, rom: str, num_episodes: int, device, rng: np.random.Generator) -> list[tuple]:
    """Atari 100k's evaluation (envs/atari.py: one game per parallel environment, each played to its end under the
    run's protocol), epsilon-greedy at --eval-epsilon in eval mode, the noise off (the reference's eval_mode; its
    experts keep their noise, ours do not); train mode again after. Returns the (return, length) of every game."""

    def act(obs, tracker, live):
        inputs = {k: v[live] for k, v in network_inputs(obs, tracker).items()}
        return select_actions(q_net, inputs, args.eval_epsilon, rng, q_net.num_actions, device)[0]

    q_net.eval()
    try:
        return atari.evaluate(act, args.protocol, rom, num_episodes, args.max_episode_frames, args.seed, rng)
    finally:
        q_net.train()


def project_distribution(target_support: torch.Tensor, probs: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Dopamine's project_distribution (C51's projection onto the fixed support): m_i = sum_j clip(1 - |clip(T z_j,
    v_min, v_max) - z_i| / dz, 0, 1) p_j. target_support T z (B, N), probs p (B, N), support z (N,) -> m (B, N)."""
    dz = support[1] - support[0]
    clipped = target_support.clamp(support[0], support[-1])  # tensor bounds: no host sync
    weight = (1.0 - (clipped[:, None, :] - support[None, :, None]).abs() / dz).clamp(0.0, 1.0)  # (B, i, j)
    return (weight * probs[:, None, :]).sum(-1)


def augment(states: torch.Tensor) -> torch.Tensor:
    """DrQ's augmentation as Dopamine's atari_100k agent does it, per image: edge-pad 4 pixels, crop a random 84x84
    window (offsets 0..7: the reference's randint excludes its upper bound 8), scale the intensity by
    1 + 0.05 clip(N(0, 1), -2, 2). uint8 (B, 4, 84, 84) -> float (B, 4, 84, 84) on the 0..255 scale, channels_last.
    The crop is one copy of the uint8 stack, held as (B, 92, 92, 4) pixels after the padding: flattened, the window
    at (dy, dx) is the 84 rows of 92 pixels that start at pixel dy*92 + dx, of which each row's first 84 are the crop;
    `unfold` views every such start, and one index takes each image's (~2x faster on a CPU than a gather per pixel)."""
    B, C, pad, (h, w) = len(states), states.shape[1], 4, FRAME_SHAPE
    side = h + 2 * pad
    dy, dx = torch.randint(0, 2 * pad, (2, B), device=states.device)
    x = states.permute(0, 2, 3, 1)  # (B, h, w, C); the pads copy the border (F.pad's "replicate" has no uint8 on CUDA)
    x = torch.cat([x[:, :1].expand(B, pad, w, C), x, x[:, -1:].expand(B, pad, w, C)], 1)
    x = torch.cat([x[:, :, :1].expand(B, side, pad, C), x, x[:, :, -1:].expand(B, side, pad, C)], 2)
    windows = x.reshape(B, side * side * C).unfold(1, h * side * C, C)  # (B, starts, 84 rows x 92 pixels x C)
    cropped = windows[torch.arange(B, device=states.device), dy * side + dx].view(B, h, side, C)[:, :, :w]
    scale = 1.0 + 0.05 * torch.randn(B, 1, 1, 1, device=states.device).clamp(-2.0, 2.0)
    return (cropped * scale).permute(0, 3, 1, 2)


def rainbow_loss(q_net, target_net, batch: dict, args: Args):
    """The C51 cross-entropy against the projected n-step double-DQN target (with --num-atoms 1, the Huber loss of the
    scalar Q), weighted by the importance-sampling weights (+ the weighted load-balancing losses for top1). Returns the
    loss and its metrics, with the unweighted per-sample loss (the new priorities) and the network's activations
    (`aux`) that benchmark/moe_analysis.py measures."""
    states, next_states, actions = batch["states"], batch["next_states"], batch["actions"]
    if args.data_augmentation:  # the frame stacks of s_t and s_{t+n}, independently
        states, next_states = ({**inputs, "obs": augment(inputs["obs"])} for inputs in (states, next_states))
    rows = torch.arange(len(actions), device=actions.device)
    discount = args.gamma**args.n_step * (1.0 - batch["terminals"])  # gamma^n (1 - terminal)
    with torch.no_grad():
        next_q, next_aux = target_net(next_states, return_aux=True)
        # double DQN: the online network picks a*; with target period 1 the target network is the online one (main)
        # and the reference's shared noise key makes the two passes the same, so next_q is reused
        online = q_net(next_states) if args.double and args.target_network_frequency > 1 else next_q
        next_action = online.argmax(1)
        if args.num_atoms > 1:
            support = target_net.support
            next_probs = torch.softmax(next_aux["logits"][rows, next_action], -1)  # p_target(s_{t+n}, a*) (B, N)
            target = project_distribution(batch["rewards"][:, None] + discount[:, None] * support, next_probs, support)
        else:
            target = batch["rewards"] + discount * next_q[rows, next_action]
    set_noise_per_sample(q_net, args.noise_per_sample)  # the online pass: each sample its own draw (reference's keys)
    q, aux = q_net(states, return_aux=True)
    set_noise_per_sample(q_net, False)
    q_taken = q[rows, actions]
    if args.num_atoms > 1:
        per_sample = -(target * torch.log_softmax(aux["logits"][rows, actions], -1)).sum(-1)  # cross-entropy
    else:
        per_sample = F.huber_loss(q_taken, target, reduction="none")
    td_loss = (batch["weights"] * per_sample).mean()
    load_balance_loss = load_balancing_loss(aux, args.num_experts) if args.load_balance_coef > 0 else torch.zeros(())
    metrics = {
        "td_loss": td_loss.detach(),
        "load_balance_loss": load_balance_loss.detach(),
        "q_values": q_taken.detach().mean(),
    }
    return td_loss + args.load_balance_coef * load_balance_loss, metrics | {"per_sample_loss": per_sample, "aux": aux}


def make_optimizer(q_net, args: Args) -> torch.optim.Adam:
    """Adam with --adam-eps; with --phi-adam-eps, Soft MoE's Phi in a parameter group of its own with that eps.
    fused=True: one vectorised pass per tensor (the same maths, 4x faster on a CPU than the unfused step)."""
    params = q_net.parameters()
    if args.phi_adam_eps is not None:
        phi = q_net.moe.phi
        others = [p for p in q_net.parameters() if p is not phi]
        params = [{"params": others}, {"params": [phi], "eps": args.phi_adam_eps}]
    return torch.optim.Adam(params, lr=args.learning_rate, eps=args.adam_eps, fused=True, capturable=args.cuda_graph)


def train_step(q_net, target_net, optimizer, batch: dict, args: Args) -> dict:
    """One update on a batch of tensors: the loss, backward, Adam, with the online network in train mode (the target
    too: its NoisyNets draw noise, as the reference's target does). Returns the loss's metrics (the per-sample loss
    sets the priorities) and, for a learned Phi, the RMS of its gradient (to compare with Adam's eps) and its norm."""
    q_net.train()
    loss, metrics = rainbow_loss(q_net, target_net, batch, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if (phi := getattr(getattr(q_net, "moe", None), "phi", None)) is not None:
        metrics |= {"phi_grad_rms": phi.grad.pow(2).mean().sqrt(), "phi_norm": phi.detach().norm()}
    return metrics


def to_tensors(batch: dict, device) -> dict:
    """Every array of a batch as a tensor on `device`, those of its input mappings (states, next_states) too."""
    return {
        k: to_tensors(v, device) if isinstance(v, dict) else torch.from_numpy(v).to(device) for k, v in batch.items()
    }


class GraphedUpdate:
    """`step(q_net, target_net, optimizer, batch, args)` recorded as one CUDA graph at the first call and replayed on a
    static copy of each batch: one launch instead of the hundreds whose host-side cost bounds an eager update on a GPU.
    Three warm-up steps (cuDNN and cuBLAS pick kernels, Adam makes its state) are undone before the capture, so the
    weights and moments go on as in eager mode; only random draws differ. Needs Adam(capturable=True)."""

    def __init__(self, step, q_net, target_net, optimizer, args):
        self.step, self.q_net, self.target_net, self.optimizer, self.args = step, q_net, target_net, optimizer, args
        self.graph = None

    def capture(self, batch: dict):
        device, optimizer = next(self.q_net.parameters()).device, self.optimizer
        self.static = to_tensors(batch, device)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        before = [p.detach().clone() for p in params]
        state_before = {i: {k: v.clone() for k, v in optimizer.state[p].items()} for i, p in enumerate(params)}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self.step(self.q_net, self.target_net, optimizer, self.static, self.args)
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
            self.metrics = self.step(self.q_net, self.target_net, optimizer, self.static, self.args)

    def __call__(self, batch: dict) -> dict:
        """Copy the sampled batch into the graph's input tensors and replay; the metrics are the graph's outputs."""
        if self.graph is None:
            self.capture(batch)
        for key, tensor in self.static.items():
            tensor.copy_(torch.from_numpy(batch[key]))
        self.graph.replay()
        return self.metrics


class ObservationOnly(nn.Module):
    """--cuda-graph's view of the network: the observation alone. GraphedPolicy and GraphedUpdate were last checked on a
    GPU (tests/test_cuda_graph.py, results/gpu_check) in this form, before the network took a mapping of inputs; until
    a GPU run checks them with mappings, a new input reaches the graphed path only through this adapter and
    observation_batch / observation_step below."""

    def __init__(self, q_net):
        super().__init__()
        self.q_net = q_net

    def forward(self, obs: torch.Tensor):
        return self.q_net({"obs": obs})


def observation_batch(batch: dict) -> dict:
    """A sampled batch as GraphedUpdate takes it: s_t and s_{t+n} as arrays of observations."""
    return batch | {"states": batch["states"]["obs"], "next_states": batch["next_states"]["obs"]}


def observation_step(q_net, target_net, optimizer, batch: dict, args) -> dict:
    """train_step on an observation_batch, the update GraphedUpdate records."""
    inputs = {"states": {"obs": batch["states"]}, "next_states": {"obs": batch["next_states"]}}
    return train_step(q_net, target_net, optimizer, batch | inputs, args)


class GraphedPolicy:
    """argmax_a Q(s, a) for every environment, recorded once as a CUDA graph."""

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


def period_crossed(step_before: int, step_after: int, period: int) -> bool:
    """True when a multiple of `period` lies in (step_before, step_after]: with N envs the counter moves by up to N."""
    return step_after // period > step_before // period


# ----------------------------------------------------------------------------------------------------------------------
# Main: set up, then the loop act -> step -> store -> learn -> sync -> log (the emulators step in their threads while
# the network learns: the actions are sent, the updates run, then the observations are received and stored)
# ----------------------------------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    args = fill_defaults(args)
    error, ckpt = validate(args), None
    if error is None and args.resume:
        try:
            ckpt = read_checkpoint(args)
        except ValueError as err:
            error = str(err)
    if error:
        raise SystemExit(f"error: {error}")

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng(args.seed)
    rom = atari.game_from_env_id(args.env_id)
    envs = atari.make_env(args.protocol, rom, args.num_envs, args.max_episode_frames)
    num_actions = int(envs.single_action_space.n)
    # channels_last kernels: the same maths, ~5% faster convolutions on CPU (oneDNN) and with cuDNN
    q_net = build_network(args, num_actions).to(device, memory_format=torch.channels_last)
    target_net = build_network(args, num_actions).to(device, memory_format=torch.channels_last)
    target_net.load_state_dict(q_net.state_dict())
    target_net.requires_grad_(False)  # in train mode: its NoisyNets draw noise for the target, as the reference's do
    if args.target_network_frequency == 1:  # the target tracks the online network at every step: it is the online one
        target_net = q_net
    optimizer = make_optimizer(q_net, args)
    replay = FrameReplay(args.buffer_size, args.num_envs, prioritized=not args.uniform_replay)
    global_step, updates, episodes = 0, 0, []
    if ckpt is not None:
        try:
            global_step, updates, episodes = restore(ckpt, q_net, target_net, optimizer, replay, rng)
        except (RuntimeError, ValueError, KeyError) as err:
            envs.close()
            raise SystemExit(f"error: --resume {args.resume!r} does not fit this run ({err})") from None
    run = Run(args, rom, q_net, target_net, optimizer, replay, rng, device, global_step, updates, episodes)
    if ckpt is not None and ckpt.get("evaluations"):  # the evaluations of the segments before this one
        run.summary["evaluations"], e = list(ckpt["evaluations"]), ckpt["evaluations"][-1]
        run.summary.update(eval_mean_return=e["mean_return"], eval_human_normalized_score=e["human_normalized_score"])

    update = lambda batch: train_step(q_net, target_net, optimizer, to_tensors(batch, device), args)
    if args.cuda_graph:  # the same update, recorded as a CUDA graph at its first call and replayed (observations only)
        graphed_update = GraphedUpdate(observation_step, q_net, target_net, optimizer, args)
        update = lambda batch: graphed_update(observation_batch(batch))

    # min_replay_history counts from this segment's start unless the replay memory was restored
    learn_from = global_step + (0 if ckpt and ckpt["replay_state"] is not None else args.learning_starts)
    updates_before, last_sync, metrics = updates, global_step, {}
    obs, info = envs.reset(seed=args.seed)
    tracker = atari.EpisodeTracker(args.num_envs, args.protocol, info, rng, args.truncation_is_terminal)
    policy = None
    if args.cuda_graph:  # the acting pass as a CUDA graph, recorded in train mode (NoisyNets draw in it)
        graphed_policy = GraphedPolicy(ObservationOnly(q_net.train()), args.num_envs)
        policy = lambda inputs: graphed_policy(inputs["obs"])
    with stop_signals() as stopped:
        while global_step < args.total_timesteps and not stopped():
            epsilon = epsilon_schedule(global_step, args.epsilon_decay_steps, args.learning_starts, args.end_e)
            epsilon = 0.0 if args.noisy else epsilon  # NoisyNets explore: the training epsilon is 0 (zero_epsilon)
            inputs = network_inputs(obs, tracker)  # the agent acts in train mode: its NoisyNets explore
            actions, acting = select_actions(q_net, inputs, epsilon, rng, num_actions, device, policy)
            envs.send(tracker.actions(actions))  # the emulators step in their threads while the network learns

            if global_step > learn_from and replay.can_sample(args.n_step):
                while updates < updates_before + int((global_step - learn_from) * args.replay_ratio):
                    batch = replay.sample(args.batch_size, rng, args.n_step, args.gamma)
                    metrics = update(batch)
                    replay.update_priorities(batch, metrics["per_sample_loss"])  # p = sqrt(loss + 1e-10)
                    updates += 1
                if target_net is not q_net and period_crossed(last_sync, global_step, args.target_network_frequency):
                    target_net.load_state_dict(q_net.state_dict())
                if args.snapshot_every and period_crossed(last_sync, global_step, args.snapshot_every):
                    run.save_snapshot(global_step)
                last_sync = global_step

            next_obs, rewards, terminated, truncated, info = envs.recv()
            step = tracker.step(rewards, terminated, truncated, info)
            clipped = np.clip(rewards, -1, 1)  # Dopamine's runner clips before the agent stores; returns stay scores
            stored = {name: inputs[name] for name in replay.INPUTS}  # a state's further inputs go with its row
            replay.add(
                frames=obs[:, -1],
                actions=actions,
                rewards=clipped,
                terminals=step.terminal,
                valid=step.valid,
                history=step.history,
                **stored,
            )
            global_step += int(step.acted.sum())
            obs = tracker.agent_view(next_obs)
            run.log_step(global_step, step.finished, next_obs, updates, metrics, acting)
    envs.close()
    last_multiple = args.snapshot_every and period_crossed(last_sync, global_step, args.snapshot_every)
    if last_multiple and not stopped() and replay.can_sample(args.n_step):  # a finished run's final network, as the
        run.save_snapshot(global_step)  # checkpoint and the evaluation have it
    return run.finish(global_step, updates, complete=not stopped())


# ----------------------------------------------------------------------------------------------------------------------
# Outputs: runs/{run_name} (tensorboard, progress line, summary.json, episodes.csv), checkpoints, snapshots, video
# ----------------------------------------------------------------------------------------------------------------------
class Run:
    """Everything a run writes, and the timers that decide when."""

    def __init__(self, args, rom, q_net, target_net, optimizer, replay, rng, device, global_step, updates, episodes):
        self.args, self.rom, self.game, self.episodes = args, rom, atari.camel_name(rom), episodes
        self.losses, self.acting = {}, {}  # the latest scalars of the loss's metrics and of the acting step
        self.q_net, self.target_net, self.optimizer, self.replay, self.rng = q_net, target_net, optimizer, replay, rng
        self.device = device
        self.start_step = self.last_step = global_step
        self.start_updates, self.learning_since = updates, None  # (time, step) of this segment's first update
        self.t_start = self.t_log = self.t_write = time.time()
        base = f"{self.game}__{args.exp_name}__{args.moe}-{args.encoder}__{args.seed}__{int(time.time())}"
        self.run_name = base
        for attempt in range(2, 10**6):  # a run started in the same second gets its own directory
            if not os.path.exists(os.path.join("runs", self.run_name)):
                break
            self.run_name = f"{base}-{attempt}"
        self.run_dir = os.path.join("runs", self.run_name)
        os.makedirs(self.run_dir)
        if args.track:
            import wandb

            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config=vars(args),
                name=self.run_name,
                save_code=True,
            )
        self.writer = SummaryWriter(self.run_dir)
        table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
        self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
        parts = {name: count_parameters(child) for name, child in q_net.named_children()}
        resumed = (
            f"; resuming at step {global_step:,} ({replay.count * replay.num_envs:,} stored)" if global_step else ""
        )
        print(
            f"{self.run_name}: {args.moe} on the {args.encoder} encoder, {sum(parts.values()):,} parameters {parts}, "
            f"{args.num_envs} env(s), {args.protocol} protocol, replay {replay.rows * replay.num_envs:,} transitions "
            f"({replay.nbytes / 1e9:.2f} GB), device {device}{resumed}"
        )
        self.summary = dict(
            args=asdict(args),
            run_name=self.run_name,
            code=code_version(),
            device=str(device),
            game=self.game,
            start_step=global_step,
            num_parameters=sum(parts.values()),
            parameters_by_part=parts,
            replay_bytes=replay.nbytes,
            replay_bytes_per_transition=replay.BYTES_PER_TRANSITION,
        )
        self.video = atari.EpisodeVideo(os.path.join(self.run_dir, "videos")) if args.capture_video else None

    def log_step(self, global_step, finished, next_obs, updates, metrics, acting):
        """Evaluations, episode returns, the per-iteration score, video frames, the progress line, periodic outputs."""
        if self.args.eval_every and period_crossed(self.last_step, global_step, self.args.eval_every):
            self.log_evaluation(global_step)
        args, writer, now = self.args, self.writer, time.time()
        if self.video is not None:
            self.video.add(next_obs[0, -1], [env for env, _, _ in finished])
        for _, episode_return, length in finished:
            self.episodes.append((global_step, episode_return, length))
            writer.add_scalar("charts/episodic_return", episode_return, global_step)
            writer.add_scalar("charts/episodic_length", length, global_step)
        if period_crossed(self.last_step, global_step, args.iteration_steps):
            last = iteration_returns(self.episodes, args.iteration_steps, global_step)[-1:]
            if last and last[0]["iteration"] == global_step // args.iteration_steps - 1:
                writer.add_scalar("charts/iteration_return", last[0]["mean_return"], last[0]["end_step"])
        self.last_step = global_step
        if self.learning_since is None and updates > self.start_updates:
            self.learning_since = (now, global_step)
        if now - self.t_log >= args.log_every_seconds:
            sps = (global_step - self.start_step) / max(now - self.t_start, 1e-9)
            t0, step0 = self.learning_since or (now, global_step)
            learning_sps = (global_step - step0) / (now - t0) if now - t0 >= max(args.log_every_seconds, 1e-9) else 0.0
            self.losses = {k: float(v) for k, v in metrics.items() if torch.is_tensor(v) and v.dim() == 0}
            for k, v in self.losses.items():  # every scalar of the loss's metrics
                writer.add_scalar(f"losses/{k}", v, global_step)
            self.acting = {k: float(v) for k, v in acting.items() if np.ndim(v) == 0}
            for k, v in self.acting.items():  # every scalar the acting step returned
                writer.add_scalar(f"charts/{k}", v, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            last = [r for _, r, _ in self.episodes[-100:]]
            mean = f"{np.mean(last):.1f}" if last else "-"
            diagnostics = "".join(f" | {k} {v:.3f}" for k, v in self.acting.items())
            loss = f" | td loss {self.losses['td_loss']:.4f}" if self.losses else ""
            print(
                f"step {global_step:,}/{args.total_timesteps:,} | {sps:,.0f} steps/s | updates {updates:,} | "
                f"episodes {len(self.episodes):,} | mean return (last 100) {mean}{diagnostics}{loss} | "
                f"{eta(args.total_timesteps - global_step, learning_sps, sps)}",
                flush=True,
            )
            self.t_log = now
        if now - self.t_write >= 60 * args.write_every_minutes:
            self.write_outputs(global_step, updates, complete=False)
            self.t_write = now

    def write_outputs(self, global_step, updates, complete: bool):
        """summary.json, episodes.csv and, with --save-model, the checkpoint (and its replay memory)."""
        args, episodes, elapsed = self.args, self.episodes, time.time() - self.t_start
        last = [r for _, r, _ in episodes[-100:]]
        mean_return = float(np.mean(last)) if last else None
        iterations = iteration_returns(episodes, args.iteration_steps, global_step)
        self.summary.update(
            complete=complete,
            global_step=global_step,
            updates=updates,
            episodes=len(episodes),
            wall_time=elapsed,
            sps=(global_step - self.start_step) / max(elapsed, 1e-9),
            mean_return_last_100=mean_return,
            episodes_in_mean=len(last),
            human_normalized_score=atari.human_normalized(mean_return, self.rom),
            random_human_scores=atari.RANDOM_HUMAN_SCORES.get(self.game),
            iteration_returns=iterations,
            last_iteration_mean_return=iterations[-1]["mean_return"] if iterations else None,
            losses=self.losses,
            acting=self.acting,
        )
        with open(os.path.join(self.run_dir, "episodes.csv"), "w", newline="") as f:
            csv.writer(f).writerows([("global_step", "return", "length"), *episodes])
        if args.save_model:
            path = os.path.join(self.run_dir, f"{SCRIPT}.pt")
            state = {
                "q_net": self.q_net.state_dict(),
                "target_net": self.target_net.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "global_step": global_step,
                "updates": updates,
                "episodes": episodes,
                "numpy_rng": self.rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": cuda_rng_state(self.q_net),
                "evaluations": self.summary.get("evaluations", []),
            }
            if args.checkpoint_replay:  # the replay first, under its own step's name; the older one goes last
                state["replay"] = save_replay(path, self.replay, global_step)
            save_checkpoint(path, args, state)
            if args.checkpoint_replay:
                remove_stale_replays(path, keep=state["replay"])
            self.summary["checkpoint"] = path
        with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=2)

    def save_snapshot(self, global_step: int):
        """The networks and 32 replay transitions, drawn by a generator seeded by the step (so the run goes on
        unchanged), for benchmark/moe_analysis.py; with torch's generator state, which a random Phi draws from."""
        probe = self.replay.sample(32, np.random.default_rng(global_step), self.args.n_step, self.args.gamma)
        path = os.path.join(self.run_dir, "snapshots", f"{SCRIPT}_{global_step}.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(
            {
                "script": SCRIPT,
                "args": asdict(self.args),
                "global_step": global_step,
                "num_actions": self.q_net.num_actions,
                "q_net": self.q_net.state_dict(),
                "target_net": self.target_net.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "probe": to_tensors(probe, "cpu"),
            },
            path,
        )

    def log_evaluation(self, global_step: int):
        """Evaluate (a generator seeded by the seed and the step), then write the mean score and its human-normalised
        value to tensorboard (eval/*) and summary.json (evaluations, eval_mean_return, eval_human_normalized_score)."""
        evaluations = self.summary.setdefault("evaluations", [])
        if evaluations and evaluations[-1]["global_step"] == global_step:
            return
        t0, rng = time.time(), np.random.default_rng([self.args.seed, global_step])
        games = evaluate(self.q_net, self.args, self.rom, self.args.eval_episodes, self.device, rng)
        returns = np.array([r for r, _ in games])
        mean, hns = float(returns.mean()), atari.human_normalized(float(returns.mean()), self.rom)
        evaluations.append(
            {
                "global_step": global_step,
                "episodes": len(games),
                "mean_return": mean,
                "std_return": float(returns.std()),
                "human_normalized_score": hns,
                "mean_length": float(np.mean([n for _, n in games])),
                "returns": returns.tolist(),
                "seconds": time.time() - t0,
            }
        )
        self.summary.update(eval_mean_return=mean, eval_human_normalized_score=hns)
        self.writer.add_scalar("eval/mean_return", mean, global_step)
        if hns is not None:
            self.writer.add_scalar("eval/human_normalized_score", hns, global_step)
        print(
            f"evaluation at step {global_step:,}: {len(games)} episodes, mean return {mean:.1f} (sd "
            f"{returns.std():.1f}), human-normalised {hns if hns is None else round(hns, 3)}, "
            f"{time.time() - t0:.0f} s",
            flush=True,
        )

    def finish(self, global_step, updates, complete: bool) -> dict:
        if not complete:
            print("interrupted: writing the summary and (with --save-model) the checkpoint")
        elif self.args.eval_episodes:  # Atari 100k: the score is this evaluation's
            if self.args.save_model:  # the trained network first: a run stopped while it plays resumes here, to play
                self.write_outputs(global_step, updates, complete=False)
            self.log_evaluation(global_step)
        self.write_outputs(global_step, updates, complete)
        hns, mean_return = self.summary["human_normalized_score"], self.summary["mean_return_last_100"]
        if mean_return is not None:
            self.writer.add_scalar("charts/mean_return_last_100", mean_return, global_step)
        mean, hns = "-" if mean_return is None else f"{mean_return:.1f}", hns if hns is None else round(hns, 3)
        print(
            f"done: {global_step:,} steps, {len(self.episodes)} episodes, mean return (last "
            f"{self.summary['episodes_in_mean']}) {mean}, human-normalised {hns}, {self.summary['sps']:,.0f} "
            "steps/s"
            + (f"; evaluation {self.summary['eval_mean_return']:.1f}" if "eval_mean_return" in self.summary else "")
        )
        self.writer.close()
        if self.args.track:
            import wandb

            wandb.finish()
        return self.summary


def eta(steps_left: int, learning_sps: float, sps: float) -> str:
    """Time left at the rate since learning started (steps slow down once it does); until learning has run for a
    whole progress interval, the faster rate so far gives only a lower bound."""
    if learning_sps > 0:
        return f"ETA {fmt_time(steps_left / learning_sps)} at the rate while learning"
    return f"ETA over {fmt_time(steps_left / sps)} (not yet learning for a whole interval)" if sps > 0 else "ETA ?"


def iteration_returns(episodes: list, iteration_steps: int, global_step: int) -> list[dict]:
    """Dopamine's per-iteration score: the mean return of the training episodes that end in each complete iteration
    of `iteration_steps` agent steps (iterations without an episode end are left out). episodes: (end step, return,
    length)."""
    ends, returns = np.array([e[0] for e in episodes], dtype=np.int64), np.array([e[1] for e in episodes], dtype=float)
    out = []
    for k in range(global_step // iteration_steps):
        if len(mine := returns[(ends - 1) // iteration_steps == k]):
            out.append(
                {
                    "iteration": k,
                    "end_step": (k + 1) * iteration_steps,
                    "mean_return": float(mine.mean()),
                    "episodes": len(mine),
                }
            )
    return out


def read_checkpoint(args: Args) -> dict:
    """The checkpoint to resume, with its replay memory under "replay_state"; ValueError with one line otherwise."""
    ckpt = load_checkpoint(args.resume, args)
    step, evaluated = ckpt["global_step"], [e["global_step"] for e in ckpt.get("evaluations", [])]
    evaluation_left = step == args.total_timesteps and args.eval_episodes and step not in evaluated  # stopped in it
    if step >= args.total_timesteps and not evaluation_left:
        raise ValueError(f"--resume {args.resume!r} is already at step {step:,}; raise --total-timesteps")
    ckpt["replay_state"] = load_replay(args.resume, ckpt["replay"]) if ckpt.get("replay") else None
    return ckpt


def restore(ckpt: dict, q_net, target_net, optimizer, replay, rng):
    """Load a checkpoint's state into this run; returns the step and update counters and the episode history."""
    q_net.load_state_dict(ckpt["q_net"])
    if target_net is not q_net:  # rainbow's --target-network-frequency 1 makes them one network
        target_net.load_state_dict(ckpt["target_net"])
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(ckpt["optimizer"])  # Adam's moments; it also brings back the saved lr, eps, ...
    for group, ours in zip(optimizer.param_groups, settings, strict=True):
        group.update(ours)  # ... so this run's flags (--learning-rate, --adam-eps, --cuda-graph's capturable) win
    rng.bit_generator.state = ckpt["numpy_rng"]
    torch.set_rng_state(ckpt["torch_rng"])
    if ckpt.get("cuda_rng") is not None and (device := next(q_net.parameters()).device).type == "cuda":
        torch.cuda.set_rng_state(ckpt["cuda_rng"], device)
    if ckpt["replay_state"] is not None:
        replay.load_state_dict(ckpt["replay_state"])
    return int(ckpt["global_step"]), int(ckpt["updates"]), [tuple(e) for e in ckpt["episodes"]]


def replay_path(checkpoint_path: str, global_step: int) -> str:
    """One replay file per checkpoint step: the checkpoint names its own and the older one is removed only after the
    newer checkpoint is written, so a hard kill between the two writes leaves a matching pair."""
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
    stem, folder = os.path.basename(checkpoint_path).removesuffix(".pt"), os.path.dirname(checkpoint_path) or "."
    for name in os.listdir(folder):
        if name.startswith(f"{stem}_replay") and name.endswith(".npz") and name != keep:
            os.remove(os.path.join(folder, name))


def load_replay(checkpoint_path: str, name: str) -> dict[str, np.ndarray]:
    """The replay memory the checkpoint names, whole or not at all (the zip checks each array's CRC-32)."""
    path = os.path.join(os.path.dirname(checkpoint_path), os.path.basename(name))
    try:
        with np.load(path, allow_pickle=False) as data:
            state = {k: data[k] for k in data.files}
        if missing := sorted({*FrameReplay.FIELDS, "pointers"} - set(state)):
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


# ======================================================================================================================
# Shared helpers: byte-identical in dqn_softmoe.py, rainbow_softmoe.py and cql_softmoe.py (a test checks), so that a
# diff between the scripts shows the algorithms
# ======================================================================================================================
class stop_signals:
    """`with stop_signals() as stopped:` SIGINT and SIGTERM (even when a background shell ignored SIGINT) end the loop
    at the next `stopped()` check, so that the summary and the checkpoint are written; the old handlers come back."""

    def __enter__(self):
        self.received = False
        self.previous = {sig: signal.signal(sig, self.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        return lambda: self.received

    def handler(self, signum, frame):
        self.received = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def save_checkpoint(path: str, args, state: dict):
    """The script's format, the architecture it must match, the arguments and `state`; atomically (tmp + rename)."""
    head = {"format": f"{SCRIPT}/2", "architecture": architecture(args), "args": asdict(args)}
    torch.save(head | state, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def load_checkpoint(path: str, args) -> dict:
    """Load and check a checkpoint against the requested architecture; raises ValueError with one clear line."""
    if not os.path.isfile(path):
        raise ValueError(f"--resume {path!r}: no such file")
    if member := damaged_member(path):  # torch.load does not check the zip's CRC-32 records
        raise ValueError(
            f"--resume {path!r} is damaged ({member} fails its CRC-32 check); restore it from a copy or start again"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001  (any unpickling failure means the file is not a checkpoint)
        raise ValueError(f"--resume {path!r} is not a readable checkpoint ({type(err).__name__})") from None
    found = ckpt.get("format") if isinstance(ckpt, dict) else None
    if found != f"{SCRIPT}/2":
        script = found.split("/")[0] if isinstance(found, str) else None
        if script == SCRIPT:
            raise ValueError(f"--resume {path!r} has the format {found} of an older {SCRIPT}.py, not {SCRIPT}/2")
        raise ValueError(f"--resume {path!r} is not a {SCRIPT} checkpoint" + (f" but a {script} one" if script else ""))
    # every option the checkpoint records must match (an older script's checkpoint records only what its network used)
    want, have = architecture(args), ckpt["architecture"]
    if diff := [f"{k}: checkpoint {v} vs requested {want.get(k)}" for k, v in sorted(have.items()) if want.get(k) != v]:
        raise ValueError(f"--resume {path!r} holds another architecture ({', '.join(diff)}); pass matching flags")
    return ckpt


def cuda_rng_state(net) -> torch.Tensor | None:
    """The CUDA generator's state on the network's device (NoisyNets, a random Phi, DrQ's shifts use it), or None."""
    device = next(net.parameters()).device
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


if __name__ == "__main__":
    main(parse_args(sys.argv[1:]))
