"""The Atari protocol of dqn_softmoe.py, rainbow_softmoe.py and cql_softmoe.py: ale_py's vector env per --protocol, the
bookkeeping of its episodes, the evaluation loop, ROM names, the random / human reference scores, and the video writer.

Protocols (Obando-Ceron et al. 2024, §4 and §5.2, as `dopamine/labs/moes` and `dopamine/labs/atari_100k` run them):
    dopamine   sticky actions (repeat_action_probability 0.25), no no-op starts, game over ends the episode (the
               paper's 50M-step runs; Machado et al. 2018)
    nature     0-29 no-op emulator frames at the start of a game, a lost life is terminal for learning (Mnih et al.
               2015)
    atari100k  no sticky actions, 0-29 no-op agent steps (action 0, not learned from, counted or scored) at the start
               of every episode, a lost life is terminal (Dopamine's atari_100k DataEfficientAtariRunner)
Every protocol: frame skip 4 with a max-pool over the last two frames, 84x84 grayscale, 4-frame stacks, unclipped
rewards (the scripts clip what they store), episodes cut at --max-episode-frames emulator frames. docs/protocols.md.
This module takes plain values and imports nothing from the scripts.
"""

from __future__ import annotations

import csv
import difflib
import functools
import os
import re
from collections.abc import Callable
from typing import NamedTuple

import ale_py
import numpy as np

FRAME_SHAPE = (84, 84)
STACK = 4
PROTOCOLS = ("dopamine", "nature", "atari100k")
NOOP_STEPS = 30  # atari100k: k ~ U{0, ..., 29} no-op agent steps
EVAL_SEED_OFFSET = 1_000_003  # evaluation games use other emulator seeds than the training games


def make_env(protocol: str, rom: str, num_envs: int, max_episode_frames: int):
    """ale_py's vector env for `protocol`. A lost life is `terminated` under `nature` and `atari100k`, but the game
    goes on (no reset). The step that loses a life plays all 4 frames (Dopamine's preprocessing stops at the lost
    life's frame): up to 3 frames more. No-op agent steps (atari100k) are EpisodeTracker's."""
    return ale_py.AtariVectorEnv(
        rom,
        num_envs,
        num_threads=min(num_envs, os.cpu_count() or 1),
        frameskip=4,
        maxpool=True,
        grayscale=True,
        img_height=FRAME_SHAPE[0],
        img_width=FRAME_SHAPE[1],
        stack_num=STACK,
        full_action_space=False,
        repeat_action_probability=0.25 if protocol == "dopamine" else 0.0,
        reward_clipping=False,
        noop_max=30 if protocol == "nature" else 0,
        life_loss_info=protocol != "dopamine",
        episodic_life=False,
        use_fire_reset=False,
        max_num_frames_per_episode=max_episode_frames,
    )


@functools.cache  # loading a ROM takes ~0.4 s; a game's action set never changes
def num_game_actions(rom: str) -> int:
    """The game's minimal action set (what ale_py's vector env acts with), known before any env is made."""
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(ale_py.roms.get_rom_path(rom))
    return len(ale.getMinimalActionSet())


class Step(NamedTuple):
    acted: np.ndarray  # (N,) the env took the agent's action (False on ale_py's reset step and on no-op starts)
    terminal: np.ndarray  # (N,) s_{t+1} is terminal for learning
    valid: np.ndarray  # (N,) acted, and not cut by the time limit: a transition that may be learned from
    history: np.ndarray  # (N,) earlier frames of the same stack in o_t, capped at 3
    finished: list  # [(env, return, length)] of the episodes that ended


class EpisodeTracker:
    """After a step that ends an episode, ale_py's next step is a reset step: its action is ignored and it returns the
    first observation of a new episode, so it is neither learned from nor counted (recognised from the previous step's
    flags and, as a safeguard, the episode frame counter going backwards). Under `nature` and `atari100k` a lost life
    is terminal for learning and the agent starts a new stack, while the game and its return go on. Under `atari100k`
    every episode starts with k ~ U{0, ..., 29} agent steps of action 0 (`actions`; k drawn from `rng`) that are
    neither learned from, counted nor scored; the first stack starts after them. `truncation_is_terminal`: the
    time-limit cut is learned as terminal."""

    def __init__(self, num_envs: int, protocol: str, info: dict, rng=None, truncation_is_terminal: bool = False):
        self.noop_steps, self.rng = NOOP_STEPS if protocol == "atari100k" else 0, rng
        self.noops = rng.integers(0, self.noop_steps, num_envs) if self.noop_steps else np.zeros(num_envs, np.int64)
        self.life_loss_terminal, self.truncation_is_terminal = protocol != "dopamine", truncation_is_terminal
        self.reset_next = np.zeros(num_envs, dtype=bool)
        self.stack_steps = np.zeros(num_envs, dtype=np.int64)  # agent steps since the current stack began
        self.lives = np.asarray(info["lives"]).copy()
        self.frame_number = np.asarray(info["episode_frame_number"]).copy()
        self.returns, self.lengths = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)

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


def evaluate(
    act: Callable[[np.ndarray, EpisodeTracker, np.ndarray], np.ndarray],
    protocol: str,
    rom: str,
    num_envs: int,
    max_episode_frames: int,
    seed: int,
    rng: np.random.Generator,
    step_budget: int | None = None,
    video_path: str | None = None,
) -> list[tuple[float, int]]:
    """Dopamine's evaluation phase with `num_envs` games in parallel under `protocol` (its no-op starts drawn from
    `rng`), the emulators seeded from seed + EVAL_SEED_OFFSET. `act(obs, tracker, live)` is given every env's stacks
    and the episode tracker (what the training loop builds the network's inputs from) and returns the actions of the
    envs where `live` is True, with the script's policy, exploration and noise as it wants them. Without a step budget
    every env plays one game to its end and the (return, length) of each are returned in env order (Atari 100k's
    DataEfficientAtariRunner); with one, games are played until their agent steps add up to `step_budget`, and those
    that end within it are returned in the order they end (the 50M-step runner's evaluation phase). With
    `video_path`, env 0's first game (what the agent sees) is written there as mp4."""
    envs = make_env(protocol, rom, num_envs, max_episode_frames)
    obs, info = envs.reset(seed=seed + EVAL_SEED_OFFSET)
    tracker = EpisodeTracker(num_envs, protocol, info, rng)
    games, steps, live, frames = [], 0, np.ones(num_envs, dtype=bool), [] if video_path else None
    try:
        while live.any() and (step_budget is None or steps < step_budget):
            actions = np.zeros(num_envs, dtype=np.int32)
            actions[live] = act(obs, tracker, live)
            next_obs, rewards, terminated, truncated, info = envs.step(tracker.actions(actions))
            step = tracker.step(rewards, terminated, truncated, info)
            steps += int((step.acted & live).sum())
            if frames is not None:
                frames.append(next_obs[0, -1].copy())
            for env, episode_return, length in step.finished:
                if live[env] and (step_budget is None or steps <= step_budget):
                    games.append((env, episode_return, length))
                if step_budget is None:
                    live[env] = False  # one game per environment
                if env == 0 and frames:
                    write_video(video_path, frames)
                    frames = None
            obs = tracker.agent_view(next_obs)
    finally:
        envs.close()
    games = sorted(games) if step_budget is None else games
    return [(episode_return, length) for _, episode_return, length in games]


# ROM names: 'ALE/MsPacman-v5' <-> 'ms_pacman'
def camel_name(rom: str) -> str:
    """'ms_pacman' -> 'MsPacman' (Gymnasium's spelling of ROM names)."""
    return "".join(part.capitalize() for part in rom.split("_"))


def game_from_env_id(env_id: str) -> str | None:
    """'ALE/MsPacman-v5' -> the ROM name 'ms_pacman', or None when no ROM has that name."""
    match = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5", env_id)
    roms = {rom.replace("_", ""): rom for rom in ale_py.roms.get_all_rom_ids()}
    return roms.get(match.group(1).lower()) if match else None


def unknown_env_message(env_id: str) -> str:
    names = {camel_name(rom).lower(): camel_name(rom) for rom in ale_py.roms.get_all_rom_ids()}
    asked = re.sub(r"^(ALE/)?|(NoFrameskip)?(-v\d+)?$", "", env_id).lower()
    close = difflib.get_close_matches(asked, list(names), n=3, cutoff=0.5)
    hint = ", ".join(f"ALE/{names[c]}-v5" for c in close) if close else "ALE/<Game>-v5 such as ALE/Pong-v5"
    return f"unknown --env-id {env_id!r}; closest valid ids: {hint}"


def read_scores() -> dict[str, dict]:
    """envs/atari_scores.csv, game -> row: the standard no-op-start random and human scores (the table of rliable,
    DQN Zoo's atari_data.py and Dopamine's atari_100k normalization_utils.py), the scores of Mnih et al. (2015), the
    game subsets and each row's source."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "atari_scores.csv"), newline="") as f:
        return {row["game"]: row for row in csv.DictReader(f)}


RANDOM_HUMAN_SCORES = {g: (float(r["random"]), float(r["human"])) for g, r in read_scores().items() if r["human"]}


def human_normalized(score: float | None, rom: str) -> float | None:
    """(score - random) / (human - random), or None without a score or for the games without reference scores."""
    ref = RANDOM_HUMAN_SCORES.get(camel_name(rom))
    return None if ref is None or score is None or not np.isfinite(score) else (score - ref[0]) / (ref[1] - ref[0])


def write_video(path: str, frames: list[np.ndarray]):
    """84x84 frames shown at 168x168, as mp4 at 15 fps (needs moviepy)."""
    from moviepy import ImageSequenceClip

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    rgb = [np.repeat(np.kron(f, np.ones((2, 2), dtype=np.uint8))[..., None], 3, -1) for f in frames]
    ImageSequenceClip(rgb, fps=15).write_videofile(path, logger=None)


class EpisodeVideo:
    """What the agent sees in env 0 during training, as mp4 in `folder`, for episodes 0, 1, 8, 27, ..., 729, 1000,
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
                write_video(os.path.join(self.folder, f"episode-{self.episode}.mp4"), self.frames)
            self.episode, self.frames = self.episode + 1, []
