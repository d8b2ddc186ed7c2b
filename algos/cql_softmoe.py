"""Offline CQL and CQL+C51 whose penultimate layer is a Soft MoE, a Top1-MoE or a (widened) dense layer, trained on
the DQN Replay Dataset and evaluated online in the real ALE game.

Obando-Ceron, Sokar, Willi et al. (ICML 2024), "Mixtures of Experts Unlock Parameter Scaling for Deep RL", §2.2
(Soft MoE), §3 (the MoE replaces the penultimate dense layer) and §5.1 (offline RL: Fig. 11 and 17, Table 3), as
Dopamine's offline agents build it (dopamine/labs/offline_rl: jax_classy_cql.gin, offline_rainbow_agent.py).

    tokens X (m x d) from the encoder output C (h x w x d): PerConv = h*w tokens of size d (default),
    PerFeat = d tokens of size h*w, PerSamp = 1 token of size h*w*d
    logits  L = X Phi,  Phi in R^{d x (n*p)}, p = ceil(m / n) slots per expert
    D_ij = exp(L_ij) / sum_i' exp(L_i'j)      dispatch: softmax over the m tokens, per slot
    C_ij = exp(L_ij) / sum_j' exp(L_ij')      combine: softmax over all n*p slots, per token
    X~ = D^T X,   Y~_i = f_{floor(i/p)}(X~_i),   Y = C Y~,   Q(s, .) = Dense(flatten(Y))
    Top1-MoE: softmax(X W_r) sends each token to one expert, which takes at most ceil(m / n) tokens in token order;
              an overflowing token outputs zero, a kept one gate * f_e(x)
    CQL (Kumar et al. 2020), discrete actions, a_D the action of the sampled transition:
        L = TD + alpha mean_batch [ logsumexp_a Q(s, a) - Q(s, a_D) ],   alpha = --cql-coef = 0.1
    --agent cql:     TD = Huber(y - Q(s, a_D)), y = R + gamma^n (1 - terminal) max_a' Q_target(s', a'), n = 1
    --agent cql-c51: TD = cross-entropy of p(s, a_D) against the C51 projection of R + gamma^n (1 - terminal) z under
                     p_target(s', a*), a* = argmax_a Q(s', a) (double DQN); dueling; n = 3; the CQL term on
                     the expected Q = sum_i z_i p_i
    Data: the first --data-percent of the rows of every file of a DQN Replay Dataset run, sampled where Dopamine's
          OutOfGraphReplayBuffer may sample; --num-iterations of --steps-per-iteration gradient steps, each followed
          by an online evaluation (epsilon 0.001, Dopamine's protocol)

The paper's setting (Impala, Soft MoE with 8 experts, 5% of a DQN Replay Dataset run, 200 x 62,500 gradient steps):
    python algos/cql_softmoe.py --agent cql --env-id ALE/Pong-v5 --dataset-dir dqn_replay/Pong/1/replay_logs
Every flag, output and check of the dataset, and the differences from the paper: docs/cql_softmoe.md. A dataset from a
run of your own: benchmark/replay_to_dataset.py.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import importlib.util
import json
import math
import os
import random
import re
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
    """impala: 3 ResNet stacks 16/32/32, 3x3 (the reference code's; Impala is the paper's Fig. 11 and 17 encoder);
    nature: 3 convs 32/64/64"""
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
    num_atoms: int = 1
    """atoms of the C51 distribution; 1 = a scalar Q with the Huber loss"""
    v_min: float = -10.0
    """lowest atom of the support (-vmax)"""
    v_max: float = 10.0
    """highest atom of the support (vmax)"""
    dueling: bool = False
    """dueling heads: logits = V + A - mean_a A"""


@dataclass
class Args(Network):  # the Network options above come first in --help and in summary.json's args
    # --- experiment ---
    exp_name: str = SCRIPT
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the network initialisation, the sampling and the evaluation games"""
    device: str = "auto"
    """'auto' (CUDA if available, else CPU), 'cpu', 'cuda' or 'cuda:N'"""
    torch_deterministic: bool = True
    """torch.backends.cudnn.deterministic"""
    bf16: bool = False
    """run the encoder in bfloat16 autocast; the MoE, the head and the loss stay float32"""
    track: bool = False
    """log to Weights & Biases (needs `pip install wandb`)"""
    wandb_project_name: str = "softmoe-deep-rl"
    """the wandb project"""
    wandb_entity: str | None = None
    """the wandb entity (team)"""
    capture_video: bool = False
    """write what the agent sees in the first evaluation game of every iteration as mp4 to runs/{run_name}/videos/"""
    save_model: bool = False
    """save networks, optimiser, counters, evaluations and generators to runs/{run_name}/{script}.pt, also mid-run"""
    resume: Annotated[str | None, tyro.conf.arg(aliases=("--load-model",))] = None
    """checkpoint to go on from; --num-iterations counts from the original start; the dataset is read again"""
    write_every_minutes: Annotated[float, tyro.conf.arg(aliases=("--checkpoint-every-minutes",))] = 30.0
    """how often summary.json, eval_curve.csv and the checkpoint are rewritten mid-iteration (and after evaluations)"""
    log_every_seconds: float = 10.0
    """how often the progress line is printed"""

    # --- data: a run of the DQN Replay Dataset (Agarwal et al. 2020) ---
    dataset_dir: str = ""
    """a DQN Replay Dataset run (e.g. dqn_replay/Pong/1/replay_logs), or a benchmark/replay_to_dataset.py folder"""
    data_percent: float = 5.0
    """the first P% of the rows of every checkpoint file (Dopamine's fixed-replay subset; the paper uses 5, 10, 50)"""
    checkpoints: str = "all"
    """which checkpoint files to read: 'all', a list '0,1,7' or a range '40-49' (later files: better policies' data)"""
    verify_dataset: bool = False
    """below 100%: read every chosen file to its end once, so gzip checks its CRC-32 and length (always done at 100%)"""

    # --- environment of the online evaluation (ale_py.AtariVectorEnv) ---
    env_id: str = "ALE/Pong-v5"
    """Gymnasium ALE id of the dataset's game, ALE/<Game>-v5"""
    protocol: Literal["dopamine", "nature", "atari100k"] = "dopamine"
    """dopamine: sticky actions 0.25 (the paper's); nature: 0-29 no-op emulator frames, a lost life starts a new
    stack; atari100k: 0-29 no-op agent steps (action 0, not counted or scored), a lost life starts a new stack"""
    max_episode_frames: int = 108_000
    """episode cap in emulator frames (Dopamine's max_steps_per_episode: 27,000 agent steps; its environment at 5873f54
    also cuts at 100,000 frames, as terminal)"""

    # --- algorithm: CQL with the labs/offline_rl defaults (the paper's Table 3) ---
    agent: Literal["cql", "cql-c51"] = "cql"
    """the defaults of AGENTS (`--agent NAME --help` shows them; explicit flags override them): cql: a scalar Q, Huber
    TD loss, n 1, Adam 5e-5 / eps 3.125e-4; cql-c51: C51, double DQN, dueling, n 3, Adam 6.25e-5 / eps 1.5e-4"""
    num_iterations: int = 200
    """iterations of --steps-per-iteration gradient steps, each followed by an evaluation"""
    steps_per_iteration: int = 62_500
    """gradient steps per iteration (training_steps of Dopamine's offline runner)"""
    learning_rate: float = 5e-5
    """Adam learning rate"""
    adam_eps: float = 3.125e-4
    """Adam epsilon"""
    gamma: float = 0.99
    """discount factor gamma"""
    n_step: int = 1
    """n of the n-step return (update_horizon)"""
    batch_size: int = 32
    """transitions per gradient update"""
    target_network_frequency: int = 2000
    """gradient steps between hard target copies (target_update_period): jax_classy_cql.gin's 2,000 for both agents
    (jax_rainbow.gin's offline CQL+C51 uses 100; docs/cql_softmoe.md says why we follow the CQL file)"""
    cql_coef: float = 0.1
    """alpha, the weight of the CQL term (bc_coefficient in the reference's gin files)"""
    load_balance_coef: float = 0.0
    """top1: weight of the importance and load losses added to the loss (0 = off, the reference's default)"""
    double: bool = False
    """double DQN: the online network picks a* at s_{t+n}, the target network evaluates it"""

    # --- evaluation (online, after every iteration: Dopamine's evaluation phase) ---
    eval_steps: int = 125_000
    """agent steps of each evaluation, summed over --eval-envs (evaluation_steps); the mean return of the games that
    end within them is the iteration's score. 0 = use --eval-episodes"""
    eval_episodes: int = 0
    """if set, replaces --eval-steps: this many games, one per parallel environment, each to its end"""
    eval_envs: int = 8
    """parallel environments of a step-budget evaluation"""
    eval_epsilon: float = 0.001
    """epsilon of the evaluation policy (epsilon_eval)"""


# What each agent sets (the paper's Table 3)
AGENTS = {
    "cql": dict(num_atoms=1, dueling=False, double=False, n_step=1, learning_rate=5e-5, adam_eps=3.125e-4),
    "cql-c51": dict(num_atoms=51, dueling=True, double=True, n_step=3, learning_rate=6.25e-5, adam_eps=1.5e-4),
}


def agent_args(name: str, **overrides) -> Args:
    """The Args of an agent, with explicit values on top."""
    return replace(Args(), **({"agent": name} | AGENTS[name] | overrides))


def parse_args(argv: list[str]) -> Args:
    """`--agent NAME` picks the defaults tyro shows and parses over; an unknown name is a one-line error."""
    name = "cql"
    for i, arg in enumerate(argv):
        if arg == "--agent" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--agent="):
            name = arg.split("=", 1)[1]
    if name not in AGENTS:
        raise SystemExit(f"error: unknown --agent {name!r}; choose one of {', '.join(AGENTS)}")
    return tyro.cli(Args, args=argv, default=agent_args(name))


def fill_defaults(args: Args) -> Args:
    """MoE settings left at None get the reference's values (only for the MoE variants, so misuse is detectable)."""
    if args.moe != "none":
        args.num_experts = 8 if args.num_experts is None else args.num_experts
        args.tokenization = args.tokenization or "perconv"
        args.expert_width = 512 if args.expert_width is None else args.expert_width
    return args


def validate(args: Args) -> str | None:
    """One clear line for the first impossible setting, checked before anything is read or written."""
    for name, value in asdict(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"--{name.replace('_', '-')} must be a finite number, got {value}"
    moe = args.moe != "none"
    dense = "needs an MoE; --moe none has a dense penultimate layer (use --moe softmoe or top1)"
    checks = [
        (atari.game_from_env_id(args.env_id) is None, atari.unknown_env_message(args.env_id)),
        (
            not args.dataset_dir,
            "--dataset-dir is required: a DQN Replay Dataset run, or a folder written by "
            "benchmark/replay_to_dataset.py",
        ),
        (not 0 < args.data_percent <= 100, f"--data-percent must lie in (0, 100], got {args.data_percent}"),
        (
            parse_checkpoints(args.checkpoints) is None,
            f"--checkpoints {args.checkpoints!r}: give 'all', a list like '0,1,7' or a range like '40-49'",
        ),
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
            args.moe != "top1" and args.load_balance_coef != 0,
            "--load-balance-coef needs --moe top1 (Soft MoE has no router to balance)",
        ),
        (
            args.width_multiplier < 1 or args.load_balance_coef < 0,
            "--width-multiplier must be at least 1 and --load-balance-coef non-negative",
        ),
        (min(args.batch_size, args.n_step) < 1, "--batch-size and --n-step must be at least 1"),
        (
            args.learning_rate <= 0 or args.target_network_frequency < 1,
            "--learning-rate and --target-network-frequency must be positive",
        ),
        (
            min(args.num_iterations, args.steps_per_iteration) < 1,
            "--num-iterations and --steps-per-iteration must be at least 1",
        ),
        (not 0 <= args.gamma <= 1, "--gamma must lie in [0, 1]"),
        (args.num_atoms < 1, f"--num-atoms must be at least 1 (1 = a scalar Q), got {args.num_atoms}"),
        (
            args.num_atoms > 1 and args.v_min >= args.v_max,
            f"--v-min ({args.v_min}) must be below --v-max ({args.v_max})",
        ),
        (args.cql_coef < 0, "--cql-coef must be >= 0"),
        (
            min(args.eval_steps, args.eval_episodes) < 0 or args.eval_envs < 1,
            "--eval-steps and --eval-episodes must be >= 0 and --eval-envs at least 1",
        ),
        (
            args.eval_steps == 0 and args.eval_episodes == 0,
            "the evaluation needs a budget: --eval-steps N or --eval-episodes N",
        ),
        (not 0 <= args.eval_epsilon <= 1, "--eval-epsilon must lie in [0, 1]"),
        (
            args.device.startswith("cuda") and not torch.cuda.is_available(),
            f"--device {args.device} asked for CUDA but torch sees no GPU; use --device cpu or auto",
        ),
        (args.track and not importlib.util.find_spec("wandb"), "--track needs wandb; `pip install wandb` or drop it"),
        (
            args.capture_video and not importlib.util.find_spec("moviepy"),
            "--capture-video needs moviepy; `pip install moviepy` or drop --capture-video",
        ),
    ]
    return next((message for failed, message in checks if failed), None)


# ----------------------------------------------------------------------------------------------------------------------
# Replay: the DQN Replay Dataset on disk (Dopamine's OutOfGraphReplayBuffer checkpoints), the rows it may sample
# ----------------------------------------------------------------------------------------------------------------------
# The four arrays of a checkpoint file and their (dtype, shape of one row); the files hold 1M rows in the real dataset
STORE = {
    "observation": (np.uint8, FRAME_SHAPE),
    "action": (np.int32, ()),
    "reward": (np.float32, ()),
    "terminal": (np.uint8, ()),
}
REFETCH = "download it again, or write it again with benchmark/replay_to_dataset.py"


class DatasetError(ValueError):
    """A missing, truncated or malformed dataset file: one line that names it."""


def store_path(directory: str, name: str, checkpoint: int) -> str:
    """`$store$_observation_ckpt.7.gz`, ... for the arrays; `add_count_ckpt.7.gz`, `invalid_range_ckpt.7.gz`."""
    prefix = "$store$_" if name in STORE else ""
    return os.path.join(directory, f"{prefix}{name}_ckpt.{checkpoint}.gz")


def dataset_directory(dataset_dir: str) -> str:
    """--dataset-dir, or its replay_logs/ (a DQN Replay Dataset run's layout)."""
    nested = os.path.join(dataset_dir, "replay_logs")
    return nested if os.path.isdir(nested) else dataset_dir


def parse_checkpoints(spec: str) -> list[int] | str | None:
    """'all' | '0,1,7' | '40-49' -> 'all' or the indices; None when malformed."""
    if spec == "all":
        return "all"
    try:
        if re.fullmatch(r"\d+-\d+", spec):
            low, high = (int(v) for v in spec.split("-"))
            return list(range(low, high + 1)) if low <= high else None
        return sorted({int(v) for v in spec.split(",")})
    except ValueError:
        return None


@contextlib.contextmanager
def open_npy(path: str):
    """(f, shape, dtype) of a gzipped .npy file, f at its first data byte. Any error while the file is read (zlib,
    EOF, gzip CRC, a header numpy cannot parse) becomes one DatasetError line that names the file."""
    try:
        with gzip.open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            if fortran:
                raise DatasetError(f"{path}: Fortran-ordered array; the dataset's files are C-ordered")
            yield f, shape, dtype
    except DatasetError:
        raise
    except Exception as err:  # zlib.error, EOFError, a failed CRC (OSError), numpy's header parser's errors
        message = " ".join(str(err).split())  # numpy's header errors span lines
        raise DatasetError(f"{path}: truncated or corrupt gzip ({type(err).__name__}: {message}); {REFETCH}") from None


def read_rows(path: str, rows: int | None = None, to_end: bool = False) -> np.ndarray:
    """The first `rows` rows (all when None) of a gzipped .npy file, streamed: only those bytes are decompressed,
    unless they are all the rows or to_end is set: then the file is read to its end, where gzip checks its CRC-32."""
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: missing")
    with open_npy(path) as (f, shape, dtype):
        count = shape[0] if shape and rows is None else (min(rows, shape[0]) if shape else 1)
        out = np.empty((count,) + tuple(shape[1:]), dtype=dtype)
        view, done = memoryview(out.reshape(-1).view(np.uint8)), 0
        while done < len(view):  # readinto in chunks: the gzip module fills at most its buffer per call
            got = f.readinto(view[done : done + (64 << 20)])
            if not got:
                raise EOFError(f"file ends after {done:,} of {len(view):,} bytes")
            done += got
        whole = math.prod(shape) * dtype.itemsize
        if to_end or done == whole:
            rest = sum(len(chunk) for chunk in iter(lambda: f.read(64 << 20), b""))
            if done + rest != whole:
                raise EOFError(f"{done + rest:,} data bytes, its header says {whole:,}")
    return out if shape else out.reshape(())


@dataclass
class CheckpointFile:
    index: int
    capacity: int  # rows of each array in the file
    add_count: int
    invalid_range: np.ndarray
    rows: int = 0  # rows read (the first --data-percent of the capacity, plus the stack)


def inspect_dataset(args: Args) -> list[CheckpointFile]:
    """Find the checkpoint files, read their headers, add counts and invalid ranges, check dtypes and shapes, and
    decide how many rows of each to read; one DatasetError line for the first problem, before any long read."""
    directory = dataset_directory(args.dataset_dir)
    if not os.path.isdir(directory):
        raise DatasetError(f"--dataset-dir {args.dataset_dir!r}: no such directory")
    if os.path.isfile(meta := os.path.join(directory, "dataset.json")):  # replay_to_dataset.py records its game
        try:
            with open(meta) as f:
                env_id = json.load(f).get("env_id")
        except (ValueError, AttributeError) as err:
            raise DatasetError(f"{meta}: not the JSON object replay_to_dataset.py writes ({err}); remove it") from None
        if env_id and atari.game_from_env_id(env_id) != atari.game_from_env_id(args.env_id):
            raise DatasetError(f"--dataset-dir {args.dataset_dir!r} holds {env_id} data; pass --env-id {env_id}")
    pattern = r"\$store\$_observation_ckpt\.(\d+)\.gz"
    found = sorted(int(m.group(1)) for f in os.listdir(directory) if (m := re.fullmatch(pattern, f)))
    if not found:
        raise DatasetError(
            f"--dataset-dir {args.dataset_dir!r} holds no checkpoint ($store$_observation_ckpt.N.gz); "
            "point it at a run's replay_logs/ or at a folder written by benchmark/replay_to_dataset.py"
        )
    wanted = parse_checkpoints(args.checkpoints)
    indices = found if wanted == "all" else wanted
    if missing := sorted(set(indices) - set(found)):
        raise DatasetError(f"--checkpoints asks for {missing} but {directory!r} holds {found[0]}..{found[-1]}")
    files = []
    for index in indices:
        capacity = None
        for name, (dtype, row_shape) in STORE.items():
            path = store_path(directory, name, index)
            if not os.path.isfile(path):
                raise DatasetError(f"{path}: missing (checkpoint {index} is incomplete)")
            with open_npy(path) as (_, shape, found_dtype):
                pass  # the header only
            if found_dtype != np.dtype(dtype) or len(shape) != 1 + len(row_shape) or tuple(shape[1:]) != row_shape:
                expected = "(rows" + "".join(f", {d}" for d in row_shape) + ")"
                raise DatasetError(f"{path}: {found_dtype} {tuple(shape)}, expected {np.dtype(dtype)} {expected}")
            if capacity is not None and shape[0] != capacity:
                first = store_path(directory, "observation", index)
                raise DatasetError(f"{path}: {shape[0]:,} rows, but {first} has {capacity:,}; {REFETCH}")
            capacity = shape[0]
        add_count, invalid_range = (read_rows(store_path(directory, n, index)) for n in ("add_count", "invalid_range"))
        for name, array, ndim in (("add_count", add_count, 0), ("invalid_range", invalid_range, 1)):
            if array.ndim != ndim or array.dtype.kind not in "iu" or (array < 0).any():
                path = store_path(directory, name, index)
                raise DatasetError(f"{path}: {array.dtype} {array.shape}, expected {ndim}-d integers >= 0; {REFETCH}")
        rows = min(capacity, math.ceil(capacity * args.data_percent / 100) + STACK)
        files.append(CheckpointFile(index, capacity, int(add_count), invalid_range.astype(np.int64), rows))
    return files


class OfflineReplay:
    """The chosen rows of every checkpoint file, one after another, with the indices that Dopamine's
    OutOfGraphReplayBuffer would sample. Row i holds frame o_i, action a_i, clipped reward r_{i+1} and whether s_{i+1}
    is terminal; an episode starts with three all-zero padding rows, so a stack never needs masking. Index i may be
    sampled when: i >= 3 (its stack is in the rows read), its n-step window i..i+n-1 and s_{i+n} are in the rows read
    (and below the file's write cursor if the file is not full), rows i-3..i+n do not straddle the write cursor, i is
    not in the file's invalid_range, and none of the rows i-3..i-1 is terminal (a terminal may only end a stack)."""

    # the arrays the network reads of a state beside its frame stack (network_inputs gives them when acting)
    INPUTS = ()

    def __init__(self, directory: str, files: list[CheckpointFile], n_step: int, to_end: bool = False):
        total = sum(f.rows for f in files)
        self.frames = np.empty((total,) + FRAME_SHAPE, dtype=np.uint8)
        self.actions, self.rewards = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.float32)
        self.terminals = np.empty(total, dtype=bool)  # the files' uint8 terminals are stored as != 0
        indices, start = [], 0
        for f in files:
            end = start + f.rows
            for name, array in zip(STORE, (self.frames, self.actions, self.rewards, self.terminals), strict=True):
                array[start:end] = read_rows(store_path(directory, name, f.index), f.rows, to_end)
            indices.append(start + self.sample_indices(f, self.terminals[start:end], n_step))
            start = end
        self.indices = np.concatenate(indices)
        if not len(self.indices):
            raise DatasetError(
                f"{directory}: the chosen rows hold no transition that may be sampled; raise --data-percent"
            )
        self.episodes_started = int(self.terminals.sum())

    @staticmethod
    def sample_indices(f: CheckpointFile, terminals: np.ndarray, n_step: int) -> np.ndarray:
        i = np.arange(STACK - 1, f.rows - n_step)  # the stack and s_{i+n} inside the rows read
        if f.add_count < f.capacity:  # a file that was never full: only rows below the write cursor hold data
            i = i[i < f.add_count - n_step]
        # Dopamine's [cursor - capacity + 3, cursor - n) mod capacity (max_id = cursor - update_horizon) for any n: the
        # invalid_range of the file was written for the logging agent's n = 1
        age = (i - f.add_count) % f.capacity  # rows since the write cursor, the oldest row
        i = i[(age >= STACK - 1) & (age < f.capacity - n_step)]
        i = i[~np.isin(i, f.invalid_range % f.capacity)]
        after_terminal = np.zeros(len(i), dtype=bool)
        for back in range(1, STACK):
            after_terminal |= terminals[i - back]
        return i[~after_terminal]

    @property
    def num_transitions(self) -> int:
        return len(self.indices)

    def sample(self, batch_size: int, rng: np.random.Generator, n_step: int = 1, gamma: float = 0.99) -> dict:
        """Uniform over the indices that may be sampled; n-step returns stop at the first terminal (as dqn's replay)."""
        i = self.indices[rng.integers(0, len(self.indices), size=batch_size)]
        offsets = np.arange(n_step)
        terminal = self.terminals[i[:, None] + offsets]  # (B, n)
        length = np.where(terminal.any(1), terminal.argmax(1) + 1, n_step)
        inside = offsets[None, :] < length[:, None]
        returns = (self.rewards[i[:, None] + offsets] * gamma**offsets * inside).sum(1, dtype=np.float32)
        return {
            "states": self.inputs(i),
            "next_states": self.inputs(i + length),
            "actions": self.actions[i],
            "rewards": returns,
            "terminals": terminal.any(1).astype(np.float32),
            "rows": i,
        }

    def inputs(self, i: np.ndarray) -> dict[str, np.ndarray]:
        """The network's inputs for the states at rows `i`: the frame stacks and the INPUTS arrays."""
        return {"obs": self.frames[i[:, None] + np.arange(1 - STACK, 1)]} | {
            k: getattr(self, k)[i] for k in self.INPUTS
        }


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_dataset(args: Args, num_actions: int) -> OfflineReplay:
    """Check every chosen file, say what the subset needs in memory (and stop if it does not fit), then read it."""
    files, directory = inspect_dataset(args), dataset_directory(args.dataset_dir)
    row_bytes = FRAME_SHAPE[0] * FRAME_SHAPE[1] + 8 + 4 + 1 + 8  # frame, action, reward, terminal, sample index
    rows, available = sum(f.rows for f in files), physical_memory_bytes()
    needed = rows * row_bytes
    print(
        f"dataset: {len(files)} checkpoint file(s) {files[0].index}..{files[-1].index} of {directory}, the first "
        f"{args.data_percent:g}% of each = {rows:,} rows, {needed / 1e9:.2f} GB in memory (this machine: "
        f"{available / 1e9:.1f} GB)",
        flush=True,
    )
    if needed + 2**30 > available:
        fits = max(int((available - 2**30) // (needed / len(files))), 0)  # whole files that would fit
        fewer = f" or read fewer files, e.g. --checkpoints {files[0].index}-{files[0].index + fits - 1}" if fits else ""
        raise DatasetError(
            f"the chosen subset needs {needed / 1e9:.1f} GB plus 1 GB headroom but this machine has "
            f"{available / 1e9:.1f} GB; lower --data-percent{fewer}"
        )
    t_read = time.perf_counter()
    replay = OfflineReplay(directory, files, args.n_step, args.verify_dataset)
    if args.verify_dataset:
        seconds = time.perf_counter() - t_read
        print(f"dataset: --verify-dataset read every file to its end (CRC-32 checked) in {fmt_time(seconds)}")
    if replay.actions.max(initial=0) >= num_actions:
        raise DatasetError(
            f"{directory}: actions up to {int(replay.actions.max())} but {args.env_id} has "
            f"{num_actions}; is --env-id the dataset's game?"
        )
    return replay


# ----------------------------------------------------------------------------------------------------------------------
# Network: Flax's initialisers and padding, the encoders, tokens, Soft MoE, Top1-MoE, the Q-network
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
    """x + Conv(ReLU(Conv(ReLU(x)))), 3x3 convs with Flax's default lecun_normal init."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
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
        for c_in, c in zip((4, *channels), channels, strict=False):
            self.convs.append(xavier_layer(nn.Conv2d(c_in, c, 3, padding=1)))
            self.blocks.append(nn.Sequential(ResidualBlock(c), ResidualBlock(c)))

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


class Experts(nn.Module):
    """n = cfg.num_experts independent experts f_e(x) = Dense(ReLU(Dense(x))): d -> width -> d (width =
    cfg.expert_width), xavier_uniform kernels, zero biases, stacked on a leading expert axis. (B, n, slots, d) ->
    outputs (B, n, slots, d), hidden (B, n, slots, width)."""

    def __init__(self, cfg: Network, dim: int):
        super().__init__()
        num_experts, width = cfg.num_experts, cfg.expert_width
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
    -> [dueling] heads -> logits (B, A, N) -> Q = sum_i z_i softmax(logits)_i (the single logit when N = 1). Built from
    the Network options of `args` (and --bf16); `inputs` is the mapping that OfflineReplay.inputs and network_inputs
    build, the one place that names what the network reads."""

    def __init__(self, num_actions: int, args: Args):
        super().__init__()
        self.moe_kind, self.tokenization, self.bf16 = args.moe, args.tokenization, args.bf16
        self.num_actions, self.num_atoms, self.dueling = num_actions, args.num_atoms, args.dueling
        self.encoder = NatureEncoder() if args.encoder == "nature" else ImpalaEncoder()
        with torch.no_grad():
            features = self.encoder(torch.zeros(1, STACK, *FRAME_SHAPE))  # (1, d, h, w)
        if args.moe == "none":
            self.dense = xavier_layer(nn.Linear(features[0].numel(), 512 * args.width_multiplier))
            head_inputs = 512 * args.width_multiplier
        else:
            num_tokens, dim = tokenize(features, args.tokenization).shape[1:]
            self.moe = (SoftMoE if args.moe == "softmoe" else Top1MoE)(args, dim, num_tokens)
            head_inputs = num_tokens * dim  # the output tokens are flattened, no pooling
        if self.dueling:
            self.value = xavier_layer(nn.Linear(head_inputs, self.num_atoms))
            self.advantage = xavier_layer(nn.Linear(head_inputs, num_actions * self.num_atoms))
        else:
            self.head = xavier_layer(nn.Linear(head_inputs, num_actions * self.num_atoms))
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
            value, advantage = self.value(h).view(B, 1, -1), self.advantage(h).view(B, self.num_actions, -1)
            aux["logits"] = value + advantage - advantage.mean(1, keepdim=True)  # (B, A, N)
        else:
            aux["logits"] = self.head(h).view(B, self.num_actions, self.num_atoms)
        logits = aux["logits"]
        q = (torch.softmax(logits, -1) * self.support).sum(-1) if self.num_atoms > 1 else logits[..., 0]  # (B, A)
        return (q, aux) if return_aux else q


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def build_network(args: Args, num_actions: int) -> QNetwork:
    return QNetwork(num_actions, args)


def architecture(args: Args) -> dict:
    """What a checkpoint must match to be loaded into this run's network: the game and the Network options."""
    return {"env_id": args.env_id} | {f.name: getattr(args, f.name) for f in fields(Network)}


# ----------------------------------------------------------------------------------------------------------------------
# CQL: acting, the C51 projection, the CQL penalty, the loss, one update, the online evaluation
# ----------------------------------------------------------------------------------------------------------------------
def network_inputs(obs: np.ndarray, tracker: atari.EpisodeTracker) -> dict[str, np.ndarray]:
    """The network's inputs for every environment's current step, built from what the evaluation loop tracks (the
    stacks, and the tracker's episode counters): what OfflineReplay.inputs gives for a stored state."""
    return {"obs": obs}


def select_actions(q_net, inputs: dict, epsilon: float, rng: np.random.Generator, num_actions: int, device):
    """epsilon-greedy per environment; the network only sees the environments that act greedily. Returns the actions
    and the acting step's diagnostics."""
    num_envs = len(next(iter(inputs.values())))
    actions = rng.integers(0, num_actions, size=num_envs)
    greedy = rng.random(num_envs) > epsilon  # Dopamine explores when u <= epsilon
    if greedy.any():
        with torch.inference_mode():
            acting = {k: torch.from_numpy(v[greedy]).to(device) for k, v in inputs.items()}
            actions[greedy] = q_net(acting).argmax(1).cpu().numpy()
    return actions.astype(np.int32), {"epsilon": epsilon}


def project_distribution(target_support: torch.Tensor, probs: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Dopamine's project_distribution (C51's projection onto the fixed support): m_i = sum_j clip(1 - |clip(T z_j,
    v_min, v_max) - z_i| / dz, 0, 1) p_j. target_support T z (B, N), probs p (B, N), support z (N,) -> m (B, N)."""
    dz = support[1] - support[0]
    clipped = target_support.clamp(support[0], support[-1])  # tensor bounds: no host sync
    weight = (1.0 - (clipped[:, None, :] - support[None, :, None]).abs() / dz).clamp(0.0, 1.0)  # (B, i, j)
    return (weight * probs[:, None, :]).sum(-1)


def cql_penalty(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Kumar et al. (2020), discrete actions: logsumexp_a Q(s, a) - Q(s, a_D) per sample. q (B, A) -> (B,)."""
    return torch.logsumexp(q, 1) - q.gather(1, actions[:, None]).squeeze(1)


def cql_loss(q_net, target_net, batch: dict, args: Args):
    """TD + alpha mean [logsumexp_a Q(s, a) - Q(s, a_D)]: TD is the Huber loss of the scalar Q against the n-step
    target (cql), or the C51 cross-entropy against the projected double-DQN target (cql-c51), whose CQL term takes the
    expected Q-values (+ the weighted load-balancing losses for top1). Returns the loss and its metrics, with the
    per-sample loss (TD + alpha penalty) and the network's activations (`aux`)."""
    states, next_states, actions = batch["states"], batch["next_states"], batch["actions"]
    rows = torch.arange(len(actions), device=actions.device)
    discount = args.gamma**args.n_step * (1.0 - batch["terminals"])  # gamma^n (1 - terminal)
    with torch.no_grad():
        next_q, next_aux = target_net(next_states, return_aux=True)
        # double DQN: the online network picks a*, the target network evaluates it
        next_action = (q_net(next_states) if args.double else next_q).argmax(1)
        if args.num_atoms > 1:
            support = target_net.support
            next_probs = torch.softmax(next_aux["logits"][rows, next_action], -1)  # p_target(s_{t+n}, a*) (B, N)
            target = project_distribution(batch["rewards"][:, None] + discount[:, None] * support, next_probs, support)
        else:
            target = batch["rewards"] + discount * next_q[rows, next_action]
    q, aux = q_net(states, return_aux=True)
    q_taken = q[rows, actions]
    if args.num_atoms > 1:
        td = -(target * torch.log_softmax(aux["logits"][rows, actions], -1)).sum(-1)  # cross-entropy
    else:
        td = F.huber_loss(q_taken, target, reduction="none")
    penalty = cql_penalty(q, actions)  # on the expected Q-values
    per_sample = td + args.cql_coef * penalty
    load_balance_loss = load_balancing_loss(aux, args.num_experts) if args.load_balance_coef > 0 else torch.zeros(())
    metrics = {
        "td_loss": td.detach().mean(),
        "cql_penalty": penalty.detach().mean(),
        "load_balance_loss": load_balance_loss.detach(),
        "q_values": q_taken.detach().mean(),
    }
    loss = per_sample.mean() + args.load_balance_coef * load_balance_loss
    return loss, metrics | {"per_sample_loss": per_sample, "aux": aux}


def make_optimizer(q_net, args: Args) -> torch.optim.Adam:
    """Adam with --adam-eps. fused=True: one vectorised pass per tensor (the same maths, 4x faster on a CPU)."""
    return torch.optim.Adam(q_net.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=True)


def train_step(q_net, target_net, optimizer, batch: dict, args: Args) -> dict:
    """One update on a batch of tensors: the loss, backward, Adam, with the online network in train mode (the target
    stays in eval mode: main). Returns the loss's metrics and, for a learned Phi, the RMS of its gradient (to compare
    with Adam's eps) and its norm."""
    q_net.train()
    loss, metrics = cql_loss(q_net, target_net, batch, args)
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


def evaluate(q_net, args: Args, rom: str, device, rng: np.random.Generator, video_path: str | None = None) -> list:
    """Dopamine's evaluation phase (envs/atari.py), in parallel: --eval-envs games until their agent steps add up to
    --eval-steps, keeping the games that end within the budget; or (--eval-episodes) one game per environment, each to
    its end. epsilon-greedy at --eval-epsilon, the no-op starts of the protocol. Returns the (return, length) of the
    games kept; with `video_path`, env 0's first game (what the agent sees) is written there as mp4. The network acts
    in eval mode (a dropout fork's mean network) and is back in train mode after."""

    def act(obs, tracker, live):
        inputs = {k: v[live] for k, v in network_inputs(obs, tracker).items()}
        return select_actions(q_net, inputs, args.eval_epsilon, rng, q_net.num_actions, device)[0]

    budget, num_envs = (None, args.eval_episodes) if args.eval_episodes else (args.eval_steps, args.eval_envs)
    q_net.eval()
    try:
        return atari.evaluate(
            act, args.protocol, rom, num_envs, args.max_episode_frames, args.seed, rng, budget, video_path
        )
    finally:
        q_net.train()


# ----------------------------------------------------------------------------------------------------------------------
# Main: read the data, then the loop sample -> learn -> sync, with an online evaluation after every iteration
# ----------------------------------------------------------------------------------------------------------------------
def main(args: Args) -> dict:
    args = fill_defaults(args)
    error, ckpt, replay = validate(args), None, None
    rom = atari.game_from_env_id(args.env_id)
    num_actions = atari.num_game_actions(rom) if rom else 0
    if error is None and args.resume:
        try:
            ckpt = read_checkpoint(args)
        except ValueError as err:
            error = str(err)
    if error is None:
        try:  # every chosen file is checked before the long read of its rows
            replay = load_dataset(args, num_actions)
        except DatasetError as err:
            error = str(err)
    if error:
        raise SystemExit(f"error: {error}")

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    rng = np.random.default_rng(args.seed)
    # channels_last kernels: the same maths, ~5% faster convolutions on CPU (oneDNN) and with cuDNN
    q_net = build_network(args, num_actions).to(device, memory_format=torch.channels_last)
    target_net = build_network(args, num_actions).to(device, memory_format=torch.channels_last)
    target_net.load_state_dict(q_net.state_dict())
    target_net.requires_grad_(False).eval()  # the target is the mean network (a dropout fork's too)
    optimizer = make_optimizer(q_net, args)
    updates, evaluations = 0, []
    if ckpt is not None:
        try:
            updates, evaluations = restore(ckpt, q_net, target_net, optimizer, rng)
        except (RuntimeError, ValueError, KeyError) as err:
            raise SystemExit(f"error: --resume {args.resume!r} does not fit this run ({err})") from None
    run = Run(args, rom, q_net, target_net, optimizer, replay, rng, device, updates, evaluations)

    total_updates = args.num_iterations * args.steps_per_iteration
    with stop_signals() as stopped:
        while updates < total_updates and not stopped():
            t_sample = time.perf_counter()
            batch = to_tensors(replay.sample(args.batch_size, rng, args.n_step, args.gamma), device)
            run.sample_seconds += time.perf_counter() - t_sample
            metrics = train_step(q_net, target_net, optimizer, batch, args)
            updates += 1
            if updates % args.target_network_frequency == 0:
                target_net.load_state_dict(q_net.state_dict())
            if updates % args.steps_per_iteration == 0:  # an iteration is over: play the game
                t_eval, video = time.time(), run.video_path(updates)
                games = evaluate(q_net, args, rom, device, np.random.default_rng([args.seed, updates]), video)
                run.log_evaluation(updates, games, time.time() - t_eval)
            run.log_step(updates, metrics)
    return run.finish(updates, complete=not stopped())


# ----------------------------------------------------------------------------------------------------------------------
# Outputs: runs/{run_name} (tensorboard, progress line, summary.json, eval_curve.csv / .png), checkpoints, video
# ----------------------------------------------------------------------------------------------------------------------
class Run:
    """Everything a run writes, and the timers that decide when."""

    def __init__(self, args, rom, q_net, target_net, optimizer, replay, rng, device, updates, evaluations):
        self.args, self.rom, self.game, self.evaluations = args, rom, atari.camel_name(rom), evaluations
        self.q_net, self.target_net, self.optimizer, self.rng, self.losses = q_net, target_net, optimizer, rng, {}
        self.start_updates, self.sample_seconds, self.eval_seconds = updates, 0.0, 0.0  # time sampling, evaluating
        self.t_start = self.t_log = self.t_write = time.time()
        variant = f"{args.agent}-{args.moe}-{args.encoder}"
        base = f"{self.game}__{args.exp_name}__{variant}__{args.seed}__{int(time.time())}"
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
        resumed = f"; resuming at gradient step {updates:,}" if updates else ""
        print(
            f"{self.run_name}: {args.agent}, {args.moe} on the {args.encoder} encoder, {sum(parts.values()):,} "
            f"parameters {parts}, {replay.num_transitions:,} transitions to sample from, device {device}"
            f"{resumed}"
        )
        dataset = dict(
            rows=len(replay.frames),
            transitions_sampled_from=replay.num_transitions,
            episode_ends=replay.episodes_started,
            loading_path="Dopamine's fixed-replay path: the first --data-percent rows of every checkpoint file",
        )
        self.summary = dict(
            args=asdict(args),
            run_name=self.run_name,
            code=code_version(),
            device=str(device),
            game=self.game,
            num_parameters=sum(parts.values()),
            parameters_by_part=parts,
            dataset=dataset,
            behaviour_policy=behaviour_policy_score(args.dataset_dir, rom),
            start_updates=updates,
        )

    def log_step(self, updates, metrics):
        """The progress line and the periodic outputs."""
        args, writer, now = self.args, self.writer, time.time()
        if now - self.t_log >= args.log_every_seconds:
            sps = (updates - self.start_updates) / max(now - self.t_start - self.eval_seconds, 1e-9)  # evaluations out
            self.losses = {k: float(v) for k, v in metrics.items() if torch.is_tensor(v) and v.dim() == 0}
            for k, v in self.losses.items():  # every scalar of the loss's metrics
                writer.add_scalar(f"losses/{k}", v, updates)
            writer.add_scalar("charts/gradient_steps_per_second", sps, updates)
            total, spi = args.num_iterations * args.steps_per_iteration, args.steps_per_iteration
            timed = len(self.evaluations) - self.start_updates // spi  # the evaluations of this segment
            left = eta(
                total - updates,
                sps,
                args.num_iterations - updates // spi,
                self.eval_seconds / timed if timed > 0 else None,
            )
            td, penalty = (self.losses.get(k, float("nan")) for k in ("td_loss", "cql_penalty"))
            last = f"{self.evaluations[-1]['mean_return']:.1f}" if self.evaluations else "-"
            print(
                f"iteration {min(updates // spi + 1, args.num_iterations)}/{args.num_iterations} | gradient step "
                f"{updates:,}/{total:,} | {sps:,.1f} steps/s | td loss {td:.4f} | cql penalty {penalty:.3f} | "
                f"last evaluation {last} | {left}",
                flush=True,
            )
            self.t_log = now
        if now - self.t_write >= 60 * args.write_every_minutes:
            self.write_outputs(updates, complete=False)
            self.t_write = now

    def video_path(self, updates: int) -> str | None:
        iteration = updates // self.args.steps_per_iteration
        return os.path.join(self.run_dir, "videos", f"iteration-{iteration}.mp4") if self.args.capture_video else None

    def log_evaluation(self, updates: int, games: list, seconds: float):
        """An iteration's score and its human-normalised value to tensorboard, summary.json, the evaluation curve and
        (with --save-model) the checkpoint."""
        returns, lengths = np.array([r for r, _ in games], dtype=np.float64), [n for _, n in games]
        mean = float(returns.mean()) if games else float("nan")
        hns = atari.human_normalized(mean, self.rom)
        self.evaluations.append(
            {
                "iteration": updates // self.args.steps_per_iteration,
                "updates": updates,
                "episodes": len(games),
                "mean_return": mean,
                "std_return": float(returns.std()) if games else float("nan"),
                "human_normalized_score": hns,
                "mean_length": float(np.mean(lengths)) if games else float("nan"),
                "seconds": seconds,
            }
        )
        self.eval_seconds += seconds
        self.writer.add_scalar("eval/mean_return", mean, updates)
        if hns is not None:
            self.writer.add_scalar("eval/human_normalized_score", hns, updates)
        print(
            f"iteration {self.evaluations[-1]['iteration']}: {len(games)} evaluation games, mean return {mean:.1f}, "
            f"human-normalised {hns if hns is None else round(hns, 3)}, {seconds:.0f} s",
            flush=True,
        )
        self.write_outputs(updates, complete=False)
        self.t_write = time.time()

    def write_outputs(self, updates, complete: bool):
        """summary.json, eval_curve.csv / .png and, with --save-model, the checkpoint."""
        args, evaluations, elapsed = self.args, self.evaluations, time.time() - self.t_start
        done, last = updates - self.start_updates, evaluations[-1] if evaluations else {}
        self.summary.update(
            complete=complete,
            updates=updates,
            iterations=len(evaluations),
            wall_time=elapsed,
            gradient_steps_per_second=done / max(elapsed - self.eval_seconds, 1e-9),
            # the sampler's own rate: how many batches it could deliver per second, against the learner's consumption
            sampler_batches_per_second=done / self.sample_seconds if self.sample_seconds else None,
            eval_mean_return=last.get("mean_return"),
            eval_human_normalized_score=last.get("human_normalized_score"),
            evaluations=evaluations,
            random_human_scores=atari.RANDOM_HUMAN_SCORES.get(self.game),
            losses=self.losses,
        )
        keys = ("iteration", "updates", "mean_return", "human_normalized_score", "episodes")
        with open(os.path.join(self.run_dir, "eval_curve.csv"), "w", newline="") as f:
            header = ("iteration", "gradient_steps", "mean_return", "human_normalized_score", "episodes")
            csv.writer(f).writerows([header, *([e[k] for k in keys] for e in evaluations)])
        self.plot_evaluations(os.path.join(self.run_dir, "eval_curve.png"))
        if args.save_model:
            path = os.path.join(self.run_dir, f"{SCRIPT}.pt")
            state = {
                "q_net": self.q_net.state_dict(),
                "target_net": self.target_net.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "updates": updates,
                "evaluations": evaluations,
                "numpy_rng": self.rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": cuda_rng_state(self.q_net),
            }
            save_checkpoint(path, args, state)
            self.summary["checkpoint"] = path
        with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=2)

    def plot_evaluations(self, path: str):
        """The evaluation score per iteration, with the game's random and human scores and the behaviour policy's."""
        if not self.evaluations:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(
            [e["iteration"] for e in self.evaluations],
            [e["mean_return"] for e in self.evaluations],
            "ko-",
            ms=3,
            label=f"{self.args.agent}, {self.args.moe}",
        )
        if self.game in atari.RANDOM_HUMAN_SCORES:
            low, human = atari.RANDOM_HUMAN_SCORES[self.game]
            ax.axhline(low, color="gray", ls=":", label=f"random ({low:g})")
            ax.axhline(human, color="r", ls=":", label=f"human ({human:g})")
        if behaviour := self.summary["behaviour_policy"]:
            score = behaviour["mean_return_last_100"]
            ax.axhline(score, color="b", ls="--", label=f"behaviour policy, last 100 episodes ({score:.1f})")
        ax.set_xlabel(f"iteration ({self.args.steps_per_iteration:,} gradient steps each)")
        ax.set_ylabel("evaluation return (unclipped)")
        ax.set_title(self.run_name)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def finish(self, updates, complete: bool) -> dict:
        if not complete:
            print("interrupted: writing the summary and (with --save-model) the checkpoint")
        self.write_outputs(updates, complete)
        hns, mean_return = self.summary["eval_human_normalized_score"], self.summary["eval_mean_return"]
        mean, hns = "-" if mean_return is None else f"{mean_return:.1f}", hns if hns is None else round(hns, 3)
        print(
            f"done: {updates:,} gradient steps, {len(self.evaluations)} iterations, last evaluation {mean}, "
            f"human-normalised {hns}, {self.summary['gradient_steps_per_second']:,.1f} gradient steps/s (sampler: "
            f"{self.summary['sampler_batches_per_second'] or 0:,.0f} batches/s)"
        )
        self.writer.close()
        if self.args.track:
            import wandb

            wandb.finish()
        return self.summary


def eta(steps_left: int, sps: float, evaluations_left: int, seconds_per_evaluation: float | None) -> str:
    """Time left: the gradient steps at this segment's rate (evaluations excluded) plus the evaluations to come at the
    mean time of this segment's; until one has been timed, the gradient steps' time alone, a lower bound."""
    if sps <= 0:
        return "ETA ?"
    learning = steps_left / sps
    if seconds_per_evaluation is None and evaluations_left:
        return f"ETA over {fmt_time(learning)} (no evaluation timed yet)"
    total = learning + evaluations_left * (seconds_per_evaluation or 0.0)
    return f"ETA {fmt_time(total)} (evaluations included)"


def read_checkpoint(args: Args) -> dict:
    """The checkpoint to resume; ValueError with one line otherwise."""
    ckpt = load_checkpoint(args.resume, args)
    # the same data: the game is in the architecture; --dataset-dir may have moved, so only its selection is compared
    trained = {k: ckpt["args"].get(k, getattr(args, k)) for k in ("checkpoints", "data_percent", "n_step")}

    def selection(k: str, v):  # what the value selects: "0-2" and "0,1,2" are one selection
        return parse_checkpoints(v) if k == "checkpoints" else v

    if data := [
        f"--{k.replace('_', '-')} {v}" for k, v in trained.items() if selection(k, v) != selection(k, getattr(args, k))
    ]:
        raise ValueError(f"--resume {args.resume!r} was trained on another part of the data; pass " + " ".join(data))
    if ckpt["updates"] >= args.num_iterations * args.steps_per_iteration:
        raise ValueError(f"--resume {args.resume!r} has done all {ckpt['updates']:,} steps; raise --num-iterations")
    return ckpt


def restore(ckpt: dict, q_net, target_net, optimizer, rng):
    """Load a checkpoint's state into this run; returns the gradient-step counter and the evaluations."""
    q_net.load_state_dict(ckpt["q_net"])
    target_net.load_state_dict(ckpt["target_net"])
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(ckpt["optimizer"])  # Adam's moments; it also brings back the saved lr, eps, ...
    for group, ours in zip(optimizer.param_groups, settings, strict=True):
        group.update(ours)  # ... so this run's flags (--learning-rate, --adam-eps, --cuda-graph's capturable) win
    rng.bit_generator.state = ckpt["numpy_rng"]
    torch.set_rng_state(ckpt["torch_rng"])
    if ckpt.get("cuda_rng") is not None and (device := next(q_net.parameters()).device).type == "cuda":
        torch.cuda.set_rng_state(ckpt["cuda_rng"], device)
    return int(ckpt["updates"]), list(ckpt["evaluations"])


def behaviour_policy_score(dataset_dir: str, rom: str) -> dict | None:
    """The generating run's own training returns, when benchmark/replay_to_dataset.py wrote them beside the data."""
    path = os.path.join(dataset_dir, "behaviour_episodes.csv")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        returns = [float(r["return"]) for r in csv.DictReader(f)]
    if not returns:
        return None
    last = float(np.mean(returns[-100:]))
    return {
        "episodes": len(returns),
        "mean_return_last_100": last,
        "human_normalized_score": atari.human_normalized(last, rom),
    }


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
