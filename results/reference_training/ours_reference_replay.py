"""algos/rainbow_softmoe.py with the reference's replay memory in place of its own: the chase's first candidate, ready
to run.

The comparison (README.md, "The comparison, fixed before the trained runs end") names the replay first if the two
codes train apart: the reference's JAX replay (google/dopamine at 5873f54, `dopamine/jax/replay_memory`:
TransitionAccumulator, PrioritizedSamplingDistribution, ReplayBuffer) builds its n-step elements differently from ours
around terminals (README.md, "Lockstep"). This script runs ours unchanged in everything else (network, loss, Adam,
noise, schedules, protocol, evaluation, outputs, checkpoints) with that replay object in place of FrameReplay, fed and
read as Atari100kRainbowMoEAgent feeds and reads it:

- every acted step goes in as the reference's runner hands it over, each array new (as dopamine_reference's
  transition_copy makes the runner's): the newest frame, the action, the clipped reward, the terminal (a lost life, in
  Atari 100k) and the episode end (the game is over or cut); ale_py's reset steps, which the runner never sees, do not;
- a new element gets the largest priority recorded so far (Atari100kRainbowAgent._store_transition, prioritised);
- a minibatch is 32 i.i.d. draws proportional to priority (ReplayBuffer.sample), weighted by
  (P + 1e-10)^-1/2 / max, and the drawn elements get p = sqrt(loss + 1e-10) after the update
  (rainbow_100k_moe_agent.py's _training_step_update);
- capacity 1,000,000 elements (the gin binding the reference runs with: labs/atari_100k/configs/DER.gin), so nothing
  is evicted in 100k steps, although the accumulator stores more elements than steps.

Kept from ours: learning starts after agent step 1,600 (the reference counts elements, and in the lockstep its first
update came at step 1,519); the snapshots' probe is drawn from the reference's sampler with its generator put back
afterwards, so that a snapshot leaves the run unchanged, as in ours; a resume starts a new game with an empty n-step
trajectory (dopamine_reference's restart_new_trajectory). The reference's environment cuts a game at 100,000 frames
(atari_lib.create_atari_environment's max_num_frames_per_episode) and counts the cut as terminal, where the atari100k
protocol cuts at 108,000 frames without a terminal; the two flags below give the reference's:

    .refvenv/bin/python -W ignore results/reference_training/ours_reference_replay.py --dopamine-dir ../dopamine \\
        --preset der --env-id ALE/Breakout-v5 --encoder nature --moe softmoe --num-experts 4 --seed 1 \\
        --max-episode-frames 100000 --truncation-is-terminal

Every flag after --dopamine-dir is rainbow_softmoe.py's (one environment: the reference's runner has one). It runs in
the reference's virtual environment (.refvenv, README.md), which has torch, gymnasium and ale-py at this project's
versions beside JAX. With --checkpoint-replay a checkpoint keeps the whole replay object, pickled
(ReferenceReplay.FIELDS), so --resume goes on from the same elements, priorities and sampler state.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "algos"))

import rainbow_softmoe as R  # noqa: E402

atari = R.atari  # envs/atari.py, as the script imported it

REFERENCE_CAPACITY = 1_000_000  # ReplayBuffer.max_capacity and PrioritizedSamplingDistribution.max_capacity


class ReferenceReplay:
    """FrameReplay's interface (what main(), Run and the checkpoints call) over the reference's ReplayBuffer, built as
    JaxFullRainbowAgent._build_replay_buffer builds it: a TransitionAccumulator of stacks of 4 frames, n = --n-step and
    gamma = --gamma, and a PrioritizedSamplingDistribution seeded by --seed (the agent's seed)."""

    # a checkpoint's replay file: the whole ReplayBuffer (elements, accumulator, sampler with its sum tree, largest
    # priority and generator) pickled into one array; its elements keep their stacks snappy-compressed (~3.6 KB each on
    # Breakout, against 7 KB a frame in FrameReplay), and the sum tree is 16 MB at the reference's capacity
    FIELDS = {"pickled": (np.uint8, ())}
    INPUTS = ()
    BYTES_PER_TRANSITION = 0  # not fixed (snappy-compressed stacks), so validate() checks no memory for it
    settings: dict = {}  # n_step, gamma, seed: set by main() before rainbow_softmoe.main builds the replay
    last_step = None  # the EpisodeTracker's latest Step: whether the row main() adds was acted, and ended a game
    probing = False  # True while Run.save_snapshot draws its probe

    def __init__(self, capacity: int, num_envs: int, prioritized: bool = False):
        if num_envs != 1 or not prioritized:
            raise SystemExit(
                "error: the reference's replay is fed by one environment and samples by priority; "
                "drop --num-envs and --uniform-replay"
            )
        from dopamine.jax.replay_memory import accumulator, replay_buffer, samplers

        self.memory = replay_buffer.ReplayBuffer(
            transition_accumulator=accumulator.TransitionAccumulator(
                stack_size=R.STACK, update_horizon=self.settings["n_step"], gamma=self.settings["gamma"]
            ),
            sampling_distribution=samplers.PrioritizedSamplingDistribution(
                seed=self.settings["seed"], max_capacity=REFERENCE_CAPACITY
            ),
            batch_size=32,
            max_capacity=REFERENCE_CAPACITY,
        )
        self.rows, self.num_envs = REFERENCE_CAPACITY, 1  # --buffer-size is not read: the reference's capacity

    @property
    def count(self) -> int:
        return self.memory.add_count

    @property
    def nbytes(self) -> int:
        import jax

        return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(list(self.memory._memory.values())))

    def add(self, **row: np.ndarray):
        """The acted step main() just took, as the runner gives it to the agent (arrays over its one environment)."""
        from dopamine.jax.replay_memory import elements

        step = self.last_step
        if not step.acted[0]:
            return
        transition = elements.TransitionElement(
            np.array(row["frames"]),  # (1, 84, 84), a copy
            np.asarray(row["actions"], dtype=np.int64),
            np.asarray(row["rewards"], dtype=np.float64),
            np.asarray(row["terminals"], dtype=np.float64),
            np.array([float(bool(step.finished))]),
        )
        sum_tree = self.memory._sampling_distribution._sum_tree
        self.memory.add(transition, priority=sum_tree.max_recorded_priority)

    def can_sample(self, n_step: int) -> bool:
        return self.memory.add_count > 0

    def sample(self, batch_size: int, rng: np.random.Generator, n_step: int = 1, gamma: float = 0.99) -> dict:
        """The reference's draw, in the batch layout of FrameReplay.transitions (stacks channel-first)."""
        generator = self.memory._sampling_distribution._rng
        kept = generator.bit_generator.state
        element, metadata = self.memory.sample(size=batch_size, with_sample_metadata=True)
        if self.probing:  # a snapshot's probe: the run's draws go on as if it had not been taken
            generator.bit_generator.state = kept
        weights = 1.0 / np.sqrt(metadata.probabilities + 1e-10)
        return {
            "states": {"obs": np.ascontiguousarray(element.state[:, 0].transpose(0, 3, 1, 2))},
            "next_states": {"obs": np.ascontiguousarray(element.next_state[:, 0].transpose(0, 3, 1, 2))},
            "actions": element.action[:, 0].astype(np.int64),
            "rewards": element.reward[:, 0].astype(np.float32),
            "terminals": element.is_terminal[:, 0].astype(np.float32),
            "weights": (weights / weights.max()).astype(np.float32),
            "keys": np.asarray(metadata.keys, dtype=np.int64),
        }

    def update_priorities(self, batch: dict, losses):
        priorities = np.sqrt(losses.detach().double().cpu().numpy() + 1e-10)
        self.memory.update(batch["keys"].astype(np.int32), priorities=priorities)

    def state_dict(self) -> dict[str, np.ndarray]:
        pickled = np.frombuffer(pickle.dumps(self.memory, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        return {"pickled": pickled, "pointers": np.array([0, self.memory.add_count, self.rows, self.num_envs])}

    def load_state_dict(self, state: dict[str, np.ndarray]):
        self.memory = pickle.loads(state["pickled"].tobytes())  # a file this script wrote (--resume)
        self.memory._transition_accumulator.clear()  # main() starts a new game: no n-step window joins the two


def recording(step_method):
    """EpisodeTracker.step, keeping its result where ReferenceReplay.add reads it."""

    def step(self, *args, **kwargs):
        ReferenceReplay.last_step = step_method(self, *args, **kwargs)
        return ReferenceReplay.last_step

    return step


def probing(save_snapshot):
    """Run.save_snapshot, with ReferenceReplay.probing set while it runs."""

    def save(self, global_step: int):
        ReferenceReplay.probing = True
        try:
            return save_snapshot(self, global_step)
        finally:
            ReferenceReplay.probing = False

    return save


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(
        usage="ours_reference_replay.py --dopamine-dir DIR [rainbow_softmoe.py's flags]", add_help=False
    )
    parser.add_argument("--dopamine-dir", required=True, help="a checkout of google/dopamine at 5873f54")
    known, rest = parser.parse_known_args(argv)
    if not os.path.isfile(os.path.join(known.dopamine_dir, "dopamine", "jax", "replay_memory", "accumulator.py")):
        raise SystemExit(f"error: {known.dopamine_dir} has no dopamine/jax/replay_memory; pass a checkout of 5873f54")
    sys.path.insert(0, os.path.abspath(known.dopamine_dir))
    if not any(a == "--exp-name" or a.startswith("--exp-name=") for a in rest):
        rest += ["--exp-name", "ours_reference_replay"]
    args = R.fill_defaults(R.parse_args(rest))
    ReferenceReplay.settings = dict(n_step=args.n_step, gamma=args.gamma, seed=args.seed)
    R.FrameReplay = ReferenceReplay  # main() builds its replay, and load_replay checks a checkpoint's, by this name
    atari.EpisodeTracker.step = recording(atari.EpisodeTracker.step)
    R.Run.save_snapshot = probing(R.Run.save_snapshot)
    return R.main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
