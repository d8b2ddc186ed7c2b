"""Import the Soft MoE paper's reference code (google/dopamine at commit 5873f54, `labs/moes`) from a checkout, with
the smallest changes that let its Atari-100k agent run on this machine, each made here in memory (the checkout is
never edited) and each listed in CHANGES:

    from dopamine_reference import load
    dopamine = load("/path/to/dopamine")   # then dopamine.runner, dopamine.agent_module, dopamine.gin, ...

Used by train.py (the reference's own training run) and lockstep.py (the reference beside rainbow_softmoe.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

COMMIT = "5873f54"

# Every change to the reference, in the order load() makes them (README.md lists them with their reasons).
CHANGES = {
    "atari_lib": "dopamine/discrete_domains/atari_lib.py does not parse: a function body whose header was stripped "
    "(ROM copying with gfile) is left indented after the namedtuples; the orphan block is dropped",
    "continuous_networks": "dopamine/jax/networks.py imports dopamine.jax.continuous_networks and "
    "tensorflow_probability (PPO only; tfp's JAX substrate fails on this JAX): both are stubbed, their attributes "
    "read at class creation are placeholders",
    "run_experiment": "dopamine/discrete_domains/run_experiment.py imports the PPO agent and the TF agents, none used "
    "by the 100k MoE agent: those four modules are stubbed",
    "baseline_branch": "labs/moes/architectures/networks.py: FullRainbowMoENetwork's BASELINE branch returns a hidden "
    "activation it never assigns; the one assignment is added (as ImpalaMoE has it)",
    "replay_scheme": "dopamine/jax/agents/dqn/dqn_agent.py: JaxDQNAgent.__init__ sets self._replay_scheme = 'uniform' "
    "after JaxFullRainbowAgent.__init__ has set it from its replay_scheme argument (DER.gin: 'prioritized'), so every "
    "full-Rainbow agent at this commit runs uniform: new elements get priority 1, the loss weights are 1 and no "
    "priority is ever updated (introduced by Dopamine's 9f616b9 of 2024-10-25, after the paper; labs/moes at its "
    "import, 0a5b581, used the prioritised OutOfGraphPrioritizedReplayBuffer). The line keeps a scheme set before it",
    "set_priority": "labs/moes/agents/rainbow_100k_moe_agent.py calls self._replay.set_priority(indices, priorities), "
    "a method of the TF replay buffer; the JAX ReplayBuffer the agent builds has update(keys, priorities=...) "
    "(what the non-MoE Atari100kRainbowAgent calls): set_priority is given to it as that call",
    "gin_replay": "labs/moes/configs/DER.gin binds only the TF replay (OutOfGraphPrioritizedReplayBuffer.*); the JAX "
    "replay the agent builds gets the bindings of labs/atari_100k/configs/DER.gin: ReplayBuffer.max_capacity = "
    "1_000_000, ReplayBuffer.batch_size = 32, PrioritizedSamplingDistribution.max_capacity = 1_000_000",
    "transition_copy": "labs/atari_100k/atari_100k_runner.py's _run_parallel reuses its arrays from step to step, "
    "and the JAX replay keeps the very arrays it is handed (its TransitionAccumulator builds an element up to n + 3 "
    "steps later; an element's is_terminal stays the array it was given, read when a minibatch is stacked or the "
    "replay is checkpointed). "
    "Observations go into one of two alternating buffers (new_obses[step % 2]), so every stored stack alternated "
    "the two newest frames (with n = 10, next_state was state); `terminals` is one array written in place at every "
    "step, so every element's terminal reads the runner's latest done (all of them in the update after a lost life, "
    "none in any other; none of the 51,461 elements of the Soft MoE run's 50,000-step checkpoint was saved as "
    "terminal); `rewards` is rebound by np.clip each step and the next step's raw reward is "
    "written into the array just handed over, so each n-step return summed the unclipped rewards one step late. "
    "ReplayBuffer.add is given a copy of each of the transition's arrays (the TF buffer that labs/moes used at its "
    "import copies each transition into its own storage when it is added)",
    "restart_new_trajectory": "dopamine/jax/replay_memory/replay_buffer.py: restoring a checkpoint restores the "
    "accumulator's unfinished trajectory, but the runner starts a new game after a restart, so the next n + 3 "
    "elements would join the two games; the accumulator is cleared after a restore (the cut game's last steps make no "
    "element, as rainbow_softmoe.py's resume learns no window across the cut)",
    "noise_factorised": "dopamine/jax/networks.py: NoisyNetwork forms the noisy weight w_mu + w_sigma * (f(p) f(q)^T) "
    "and multiplies by it; the agent's online pass runs under vmap with a key per sample, so every sample's weight "
    "(7,744 x 512 in the baseline's layer) is built, and its gradient too: most of the update's time. The same "
    "product is computed as x w_mu + ((x * f(p)) w_sigma) * f(q), which is equal in exact arithmetic, draws the same "
    "noise from the same keys and builds no weight per sample (noise_check.py: outputs and gradients equal "
    "to float32 rounding); the eval-mode branch (zero noise) is unchanged",
    "max_priority_kept": "dopamine/jax/replay_memory/sum_tree.py: a SumTree's checkpoint (to_state_dict) keeps its "
    "nodes but not max_recorded_priority, the priority every new replay element gets, so a run restored from a "
    "checkpoint gives new elements 1.0 until an update sets a larger one, where the uninterrupted run gives the "
    "largest ever recorded. It is saved beside the nodes; a checkpoint written without it restores the largest "
    "priority the tree holds (at least 1.0), a lower bound of the value lost",
    "driver": "labs/moes/atari_100k_train.py keeps an internal-only import; train.py does what its main() does "
    "(gin configs, the agent factory with seed = run number, DataEfficientAtariRunner, run_experiment) and seeds "
    "tf and numpy with the run number as it does",
}

GIN_REPLAY = [
    "ReplayBuffer.max_capacity = 1_000_000",
    "ReplayBuffer.batch_size = 32",
    "PrioritizedSamplingDistribution.max_capacity = 1_000_000",
]


class Stub(types.ModuleType):
    """A module whose every attribute is another stub (only read when classes and annotations are defined)."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Stub(attr)

    def __call__(self, *args, **kwargs):
        return None

    def __repr__(self):
        return f"<stub {self.__name__}>"


def exec_module(name: str, edit) -> types.ModuleType:
    """Import module `name` from its source after `edit(source) -> source`."""
    spec = importlib.util.find_spec(name)
    with open(spec.origin) as f:
        source = edit(f.read())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)
    return module


def drop_orphan_block(source: str) -> str:
    """atari_lib.py: remove the indented lines between the namedtuples and the next decorator."""
    start = source.index("ImplicitQuantileNetworkType = collections.namedtuple(")
    start = source.index("\n\n", start)
    end = source.index("@gin.configurable", start)
    orphan = source[start:end]
    if "gfile.ListDir(source_dir)" not in orphan:
        raise SystemExit("error: this dopamine checkout's atari_lib.py differs from the one at commit " + COMMIT)
    return source[:start] + "\n\n\n" + source[end:]


def add_baseline_hidden(source: str) -> str:
    missing = "      x = nn.relu(x)\n    else:\n      if x.ndim == 4"
    if source.count(missing) != 1:
        raise SystemExit("error: this dopamine checkout's labs/moes networks.py differs from the one at " + COMMIT)
    return source.replace(missing, "      x = nn.relu(x)\n      x_hidden = x\n    else:\n      if x.ndim == 4")


def keep_replay_scheme(source: str) -> str:
    line = "    self._replay_scheme = 'uniform'\n"
    if source.count(line) != 1:
        raise SystemExit(
            "error: this dopamine checkout's jax/agents/dqn/dqn_agent.py differs from the one at " + COMMIT
        )
    return source.replace(line, "    self._replay_scheme = getattr(self, '_replay_scheme', 'uniform')\n")


def noise_off(source: str) -> str:
    """dopamine/jax/networks.py, for lockstep.py only: every NoisyNetwork takes its eval-mode branch (zero noise), the
    experts' too (their ExpertModel never passes eval_mode on)."""
    branch = "    if self.eval_mode:\n      # Turn off noise during evaluation"
    if source.count(branch) != 1:
        raise SystemExit("error: this dopamine checkout's jax/networks.py differs from the one at " + COMMIT)
    return source.replace(branch, "    if True:  # lockstep.py: noise off\n      # Turn off noise during evaluation")


def noise_factorised(source: str) -> str:
    """dopamine/jax/networks.py: the noisy layer's product without a weight per sample (CHANGES)."""
    product = "    w = w_mu + jnp.multiply(w_sigma, w_epsilon)\n    ret = jnp.matmul(x, w)\n"
    if source.count(product) != 1:
        raise SystemExit("error: this dopamine checkout's jax/networks.py differs from the one at " + COMMIT)
    return source.replace(
        product,
        "    if self.eval_mode:\n"
        "      ret = jnp.matmul(x, w_mu + jnp.multiply(w_sigma, w_epsilon))\n"
        "    else:  # results/reference_training: x (w_mu + w_sigma * f_p f_q) without forming the weight\n"
        "      ret = jnp.matmul(x, w_mu) + jnp.multiply(jnp.matmul(jnp.multiply(x, f_p[:, 0]), w_sigma), f_q[0])\n",
    )


def load(
    dopamine_dir: str,
    without_noise: bool = False,
    replay_as_shipped: bool = False,
    aliasing_as_shipped: bool = False,
    noise_as_shipped: bool = False,
    max_priority_as_shipped: bool = False,
) -> types.SimpleNamespace:
    """The reference's modules, changed as CHANGES says; `without_noise` (lockstep.py) also zeroes every NoisyNet's
    noise (its noisy layers then run as shipped); `replay_as_shipped` leaves the replay scheme uniform, as this commit
    runs it; `aliasing_as_shipped` leaves the replay holding the runner's own arrays (transition_copy);
    `noise_as_shipped` builds every noisy weight (noise_factorised); `max_priority_as_shipped` leaves the largest
    recorded priority out of the replay's checkpoint (max_priority_kept)."""
    if not os.path.isfile(
        os.path.join(dopamine_dir, "dopamine", "labs", "moes", "agents", "rainbow_100k_moe_agent.py")
    ):
        raise SystemExit(
            f"error: {dopamine_dir} has no dopamine/labs/moes; pass a checkout of google/dopamine at {COMMIT}"
        )
    sys.path.insert(0, os.path.abspath(dopamine_dir))
    for name in (
        "dopamine.jax.continuous_networks",
        "tensorflow_probability",
        "tensorflow_probability.substrates",
        "dopamine.jax.agents.ppo.ppo_agent",
        "dopamine.tf.agents.dqn.dqn_agent",
        "dopamine.tf.agents.implicit_quantile.implicit_quantile_agent",
        "dopamine.tf.agents.rainbow.rainbow_agent",
    ):
        sys.modules[name] = Stub(name)
    atari_lib = exec_module("dopamine.discrete_domains.atari_lib", drop_orphan_block)
    if without_noise:
        exec_module("dopamine.jax.networks", noise_off)
    elif not noise_as_shipped:
        exec_module("dopamine.jax.networks", noise_factorised)
    if not replay_as_shipped:
        exec_module("dopamine.jax.agents.dqn.dqn_agent", keep_replay_scheme)
    moe_networks = exec_module("dopamine.labs.moes.architectures.networks", add_baseline_hidden)
    import gin
    from dopamine.discrete_domains import run_experiment
    from dopamine.jax.replay_memory import replay_buffer
    from dopamine.labs.atari_100k import atari_100k_runner
    from dopamine.labs.moes.agents import rainbow_100k_moe_agent

    def set_priority(self, indices, priorities):
        self.update(indices, priorities=priorities)

    replay_buffer.ReplayBuffer.set_priority = set_priority
    if not max_priority_as_shipped:
        from dopamine.jax.replay_memory import sum_tree

        shipped_to, shipped_from = sum_tree.SumTree.to_state_dict, sum_tree.SumTree.from_state_dict

        def to_state_dict(self):
            return {**shipped_to(self), "max_recorded_priority": float(self.max_recorded_priority)}

        def from_state_dict(self, state_dict):
            shipped_from(self, state_dict)
            held = float(self._nodes[self._first_leaf_offset :].max(initial=1.0))
            self.max_recorded_priority = float(state_dict.get("max_recorded_priority", held))

        sum_tree.SumTree.to_state_dict, sum_tree.SumTree.from_state_dict = to_state_dict, from_state_dict
    if not aliasing_as_shipped:
        import numpy

        shipped_add = replay_buffer.ReplayBuffer.add

        def add_a_copy(self, transition, **kwargs):
            return shipped_add(self, type(transition)(*(numpy.array(field) for field in transition)), **kwargs)

        replay_buffer.ReplayBuffer.add = add_a_copy
    shipped_restore = replay_buffer.ReplayBuffer.from_state_dict

    def restore_then_new_trajectory(self, state_dict):
        shipped_restore(self, state_dict)
        self._transition_accumulator.clear()

    replay_buffer.ReplayBuffer.from_state_dict = restore_then_new_trajectory
    return types.SimpleNamespace(
        dir=os.path.abspath(dopamine_dir),
        gin=gin,
        atari_lib=atari_lib,
        moe_networks=moe_networks,
        run_experiment=run_experiment,
        replay_buffer=replay_buffer,
        runner=atari_100k_runner,
        agent_module=rainbow_100k_moe_agent,
        der_gin=os.path.join(os.path.abspath(dopamine_dir), "dopamine", "labs", "moes", "configs", "DER.gin"),
    )
