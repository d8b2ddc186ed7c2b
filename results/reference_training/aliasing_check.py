"""What the reference's replay stores when its own runner feeds it, as shipped and with dopamine_reference's
transition_copy: the check behind that change (README.md, "What it took to run the reference").

The reference's `DataEfficientAtariRunner._run_parallel` (labs/atari_100k/atari_100k_runner.py) reuses its arrays from
step to step, and the JAX replay keeps the arrays it is handed. This script drives that very function and the agent's
own `log_transition` / `_store_transition` (Atari100kRainbowAgent) into a real ReplayBuffer (TransitionAccumulator,
PrioritizedSamplingDistribution), with a scripted one-environment game small enough to read by hand:

- after env step j the frame holds the value j (the reset frame holds 100);
- step j gives reward 2 when j is odd (clipped to 1 by the runner), 0 otherwise;
- step 12 loses a life (done); the game goes on to step 20.

With n = 3 and gamma = 1, every element's n-step return is a sum of at most three clipped rewards (at most 2 here,
since rewards fall on odd steps), and the elements built at the terminal are terminal. The same stream is also handed
to a second buffer directly, a fresh array every step (as lockstep.py feeds the reference): the buffer fed by the
runner must store exactly what that one stores.

    .refvenv/bin/python -W ignore results/reference_training/aliasing_check.py --dopamine-dir ../dopamine

writes aliasing_check.json: every stored element (its state's and next state's newest frames, return, terminal) as
shipped, with the copy, and fed fresh arrays. With --replay-checkpoint (a trained run's
checkpoints/<N>/replay/checkpoint.msgpack, given once per file) it also counts the terminal elements and the largest
return in that replay as saved, under "replay_checkpoints" (an element's terminal is frozen there at the value the
runner's array held when the checkpoint was written), with the first terminal element, the first element whose
n-step return is positive, and every run of over 1,000 elements without a terminal (places in the add order).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
N_STEP, STACK, LIFE_LOST_AT, STEPS = 3, 4, 12, 20


def scalar(field) -> float:
    """An element's field over the one environment (an array of shape (1,) or ()), as a number."""
    import numpy as np

    return float(np.asarray(field).ravel()[0])


def elements_stored(dopamine_dir: str, as_shipped: bool) -> dict:
    """The elements the runner's stream leaves in the replay, and those of the same stream fed fresh arrays."""
    import numpy as np

    sys.path.insert(0, HERE)
    import dopamine_reference

    ref = dopamine_reference.load(dopamine_dir, aliasing_as_shipped=as_shipped)
    from dopamine.jax.replay_memory import accumulator, elements, replay_buffer, samplers
    from dopamine.labs.atari_100k import atari_100k_rainbow_agent

    def new_replay():
        return replay_buffer.ReplayBuffer(
            transition_accumulator=accumulator.TransitionAccumulator(
                stack_size=STACK, update_horizon=N_STEP, gamma=1.0
            ),
            sampling_distribution=samplers.PrioritizedSamplingDistribution(seed=0, max_capacity=100),
            batch_size=32,
            max_capacity=100,
        )

    class Game:
        """The scripted game, with the attributes the runner reads and writes."""

        def __init__(self):
            self.t, self.game_over, self.cum_length, self.cum_reward = 0, False, 0, 0.0

        def reset(self):
            return np.full((2, 2, 1), 100, np.uint8)

        def step(self, action):
            self.t += 1
            return np.full((2, 2, 1), self.t, np.uint8), 2.0 * (self.t % 2), self.t == LIFE_LOST_AT, {}

    # the agent's own storing methods on a bare object: no network, the action is always 0
    agent = types.SimpleNamespace(observation_shape=(2, 2), state_shape=(2, 2, STACK), eval_mode=False)
    agent._replay_scheme, agent._replay = "prioritized", new_replay()
    for name in ("log_transition", "_record_observation", "_store_transition", "reset_one", "reset_all"):
        setattr(agent, name, types.MethodType(getattr(atari_100k_rainbow_agent.Atari100kRainbowAgent, name), agent))
    agent.step = lambda: np.zeros(1, np.int32)

    stream = []  # what the runner hands over at each step, copied at that moment
    shipped_log = agent.log_transition

    def log_and_keep(observation, action, reward, terminal, episode_end):
        stream.append([np.array(a) for a in (agent._observation, action, reward, terminal, episode_end)])
        return shipped_log(observation, action, reward, terminal, episode_end)

    agent.log_transition = log_and_keep
    runner = object.__new__(ref.runner.DataEfficientAtariRunner)
    runner._agent, runner._clip_rewards, runner._max_steps_per_episode, runner.max_noops = agent, True, 27_000, 0
    runner.num_steps, runner._maybe_save_single_summary = 0, lambda *args: None
    runner._run_parallel([Game()], max_steps=STEPS - 1, needs_reset=True)

    fresh = new_replay()  # the same transitions, each array new, straight into the buffer
    for observation, action, reward, terminal, episode_end in stream:
        fresh.add(
            elements.TransitionElement(observation.reshape(2, 2), action, reward, terminal, episode_end),
            priority=1.0,
        )

    def table(replay) -> list[dict]:
        rows = []
        for element in replay._memory.values():
            e = element.unpack()
            rows.append(
                {
                    "state_newest_frame": int(scalar(e.state[..., -1])),
                    "next_state_newest_frame": int(scalar(e.next_state[..., -1])),
                    "n_step_return": scalar(e.reward),
                    "terminal": scalar(e.is_terminal),
                }
            )
        return rows

    return {"runner": table(agent._replay), "fresh": table(fresh)}


def replay_checkpoint_counts(path: str) -> dict:
    """How many elements of a saved replay are terminal, and its largest n-step return."""
    import msgpack
    from dopamine.jax import serialization  # dopamine_reference.load() has run (main)

    with open(path, "rb") as f:
        state = msgpack.unpackb(f.read(), object_hook=serialization.decode, raw=False, strict_map_key=False)
    treedef = pickle.loads(state["memory"]["treedef"])
    stored = [treedef.unflatten(leaves) for leaves in state["memory"]["values"]]
    terminal = [i for i, e in enumerate(stored) if scalar(e.is_terminal)]
    returns = [scalar(e.reward) for e in stored]
    bounds = [-1, *terminal, len(stored)]
    return {
        "path": os.path.relpath(path, HERE),
        "add_count": int(state["add_count"]),
        "elements": len(stored),
        "terminal_elements": len(terminal),
        "largest_return": max(returns),
        # places in the add order (about the agent step: a restart makes no element of the cut game's last steps)
        "first_terminal_element": terminal[0] if terminal else None,
        "first_positive_return_element": next((i for i, r in enumerate(returns) if r > 0), None),
        "terminal_free_spans_over_1000": [[a + 1, b - 1] for a, b in itertools.pairwise(bounds) if b - a - 1 > 1000],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dopamine-dir", required=True)
    p.add_argument("--mode", choices=["shipped", "copy"], help=argparse.SUPPRESS)  # one process per mode
    p.add_argument("--replay-checkpoint", action="append", default=[], help="a trained run's saved replay to count")
    p.add_argument("--out", default=os.path.join(HERE, "aliasing_check.json"))
    args = p.parse_args()
    if args.mode:
        print(json.dumps(elements_stored(args.dopamine_dir, as_shipped=args.mode == "shipped")))
        return
    written = {}  # an earlier aliasing_check.json: a run of either kind keeps what the other wrote
    if os.path.exists(args.out):
        with open(args.out) as f:
            written = json.load(f)
    if args.replay_checkpoint:
        result = written
        sys.path.insert(0, HERE)
        import dopamine_reference

        dopamine_reference.load(args.dopamine_dir)  # once: it patches the reference's classes
        for path in args.replay_checkpoint:
            counts = replay_checkpoint_counts(path)
            result.setdefault("replay_checkpoints", {})[counts["path"]] = counts
            print(counts)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        return
    result = {
        "stream": f"{STEPS} steps of a scripted game: frame j after step j (100 at reset), reward 2 on odd steps "
        f"(clipped to 1), a lost life at step {LIFE_LOST_AT}; n = {N_STEP}, gamma = 1, stacks of {STACK}",
    }
    for mode in ("shipped", "copy"):  # load() patches the reference's classes, so each mode in its own process
        out = subprocess.run(
            [sys.executable, "-W", "ignore", __file__, "--dopamine-dir", args.dopamine_dir, "--mode", mode],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        stored = json.loads(out.strip().splitlines()[-1])
        runner, fresh = stored["runner"], stored["fresh"]
        result[mode] = {
            "elements": runner,
            "elements_fed_fresh_arrays": fresh,
            "equal_to_fresh": runner == fresh,
            "terminal_elements": sum(r["terminal"] for r in runner),
            "largest_return": max(r["n_step_return"] for r in runner),
        }
        print(
            f"{mode}: {len(runner)} elements, {result[mode]['terminal_elements']:.0f} terminal, largest n-step return "
            f"{result[mode]['largest_return']}, equal to the fresh-array buffer: {result[mode]['equal_to_fresh']} "
            f"(that one: {sum(r['terminal'] for r in fresh):.0f} terminal, largest return "
            f"{max(r['n_step_return'] for r in fresh)})"
        )
    result |= {k: v for k, v in written.items() if k == "replay_checkpoints"}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
