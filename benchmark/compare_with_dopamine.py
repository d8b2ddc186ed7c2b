"""Our Q-networks and updates against the paper's reference code, on the same weights and on the same data.

The reference is google/dopamine's `labs/moes` (Flax): `FullRainbowMoENetwork` (Rainbow, DER, DrQ(eps), and with
noise off the offline agents' network), `NatureDQNMoE` and `ImpalaMoE` (DQN), with `softmoe.SoftMoE` and `moe.MoE`
inside. Three parts (`--parts`):

1. Same weights. For each configuration below: initialise the reference network with Flax, copy its parameters
   into the matching network of algos/rainbow_softmoe.py, dqn_softmoe.py or cql_softmoe.py (kernels transposed from
   Flax's HWIO / (in, out) layouts; the baseline's dense layer and the per-sample token permuted from Flax's HWC
   flatten to PyTorch's CHW flatten), run both on the same real Atari stacks (Boxing and Breakout, random play) with
   the noise off, and report the largest difference in Q (and in the C51 logits). For noisy experts it also reports
   the reference's own eval mode, which leaves the experts' noise on (its ExpertModel never receives eval_mode).
2. Own initialisations, for the networks of our Atari-100k runs (DER.gin's Nature CNN with 4 experts, and the
   reference code's Impala encoder with 8 experts, Fig. 12's expert count, the presets' default): the root mean square
   of every parameter tensor (the NoisyNet sigmas are constants), and the routing each starts with on those states
   (dispatch entropy / log m, 1 = every slot the mean token).
3. One update on the same batch: the reference's jitted train() (full_rainbow_moe_agent; offline_rainbow_agent for
   CQL; dqn_moe_agent for DQN) against our rainbow_loss / cql_loss / dqn_loss and torch Adam, comparing the losses
   and the parameters after the step.

Not compared: the noise draws themselves (a different random generator; the NoisyLinear docstring says how the two
share noise), random Phi (ditto) and `--impala-kernel 4|6` (the reference's Stack hard-codes 3x3).

The reference's `FullRainbowMoENetwork` cannot run its own baseline branch: it returns a hidden activation that it never
assigned (`labs/moes/architectures/networks.py`: its `moe_type='BASELINE'` path). This script adds that one assignment
in memory, as `ImpalaMoE` has it, and changes nothing else. Modules the code only touches in functions not called here
(atari_lib, continuous_networks, tensorflow, tensorflow_probability, snappy, the statistics and offline replay modules)
are stubbed while it is imported.

Setup (JAX and Flax are not in requirements.txt; they live in a second venv):
    python -m venv .refvenv && .refvenv/bin/pip install torch==2.13.0 jax flax chex gin-config absl-py \
        tyro gymnasium ale-py tensorboard
    git clone https://github.com/google/dopamine /tmp/dopamine   # checked at commit 5873f54
    .refvenv/bin/python benchmark/compare_with_dopamine.py --dopamine-dir /tmp/dopamine
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import types

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, os.path.join(ROOT, "algos"))
import cql_softmoe  # noqa: E402
import dqn_softmoe  # noqa: E402
import rainbow_softmoe  # noqa: E402
from envs import atari  # noqa: E402  (the scripts put the repository root on sys.path)


# ----------------------------------------------------------------------------------------------------------------------
# The reference, imported from a checkout
# ----------------------------------------------------------------------------------------------------------------------
class Stub(types.ModuleType):
    """A module whose every attribute is another stub (only reached at definition time here)."""

    def __getattr__(self, attr):
        if attr.startswith("__"):  # __file__, __path__ ...: absent, as inspect and importlib expect
            raise AttributeError(attr)
        return Stub(attr)

    def __call__(self, *args, **kwargs):
        return None

    def __repr__(self):  # gin prints default arguments
        return f"<stub {self.__name__}>"


def import_reference(dopamine_dir: str):
    if not os.path.isfile(os.path.join(dopamine_dir, "dopamine", "labs", "moes", "architectures", "networks.py")):
        sys.exit(f"error: {dopamine_dir} has no dopamine/labs/moes; pass a checkout of github.com/google/dopamine")
    sys.path.insert(0, dopamine_dir)
    stubs = (
        "dopamine.discrete_domains.atari_lib",
        "dopamine.jax.continuous_networks",
        "dopamine.metrics.statistics_instance",
        "snappy",
        "tensorflow",
        "tensorflow_probability",
        "tensorflow_probability.substrates",
        "dopamine.labs.offline_rl.fixed_replay",
        "dopamine.labs.offline_rl.rlu_tfds.tfds_replay",
    )
    for name in stubs:
        sys.modules[name] = Stub(name)
    spec = importlib.util.find_spec("dopamine.labs.moes.architectures.networks")
    with open(spec.origin) as f:
        source = f.read()
    missing = "      x = nn.relu(x)\n    else:\n      if x.ndim == 4"  # FullRainbowMoENetwork's baseline branch
    if source.count(missing) != 1:
        sys.exit("error: this dopamine checkout's networks.py differs from the one checked (commit 5873f54)")
    source = source.replace(missing, "      x = nn.relu(x)\n      x_hidden = x\n    else:\n      if x.ndim == 4")
    networks = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = networks
    exec(compile(source, spec.origin, "exec"), networks.__dict__)
    from dopamine.labs.moes.agents import dqn_moe_agent, full_rainbow_moe_agent
    from dopamine.labs.offline_rl.jax import offline_rainbow_agent

    for name in stubs:  # the imported modules keep theirs; others (torch's import checks) must not see them
        del sys.modules[name]
    return networks, {"rainbow": full_rainbow_moe_agent, "offline": offline_rainbow_agent, "dqn": dqn_moe_agent}


# ----------------------------------------------------------------------------------------------------------------------
# States: real frame stacks under random play
# ----------------------------------------------------------------------------------------------------------------------
def atari_states(game: str, count: int, seed: int) -> np.ndarray:
    """count stacks as rainbow_softmoe.py's vector env returns them (the Atari-100k protocol), random play."""
    args = rainbow_softmoe.preset_args("der", env_id=f"ALE/{game}-v5")
    env = atari.make_env(args.protocol, atari.game_from_env_id(args.env_id), 1, args.max_episode_frames)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    states = []
    for step in range(count * 10):
        obs, _, _, _, _ = env.step(rng.integers(env.single_action_space.n, size=1))
        if step % 10 == 9:
            states.append(obs[0])
    env.close()
    return np.stack(states)  # (count, 4, 84, 84) uint8


# ----------------------------------------------------------------------------------------------------------------------
# Reference parameters -> our state_dict
# ----------------------------------------------------------------------------------------------------------------------
def conv(kernel) -> torch.Tensor:  # Flax HWIO -> PyTorch OIHW
    return torch.from_numpy(np.array(kernel)).permute(3, 2, 0, 1).contiguous()


def t(x) -> torch.Tensor:
    return torch.from_numpy(np.array(x))


def hwc_to_chw(h: int, w: int, c: int) -> torch.Tensor:
    """perm with chw_vector = hwc_vector[perm]: PyTorch's flatten of (c, h, w) from Flax's flatten of (h, w, c)."""
    return torch.arange(h * w * c).view(h, w, c).permute(2, 0, 1).reshape(-1)


def linear(prefix: str, params: dict, noisy: bool, rows: torch.Tensor | None = None) -> dict:
    """A reference Dense / NoisyNetwork ((in, out) kernel) as our nn.Linear / NoisyLinear ((out, in) weight); rows
    reorders the inputs."""
    kernel, bias = ("kernel_mu", "bias_mu") if noisy else ("kernel", "bias")
    w = t(params[f"{prefix}/{kernel}"])
    sd = {"weight_mu" if noisy else "weight": (w if rows is None else w[rows]).T.contiguous()}
    sd["bias_mu" if noisy else "bias"] = t(params[f"{prefix}/{bias}"])
    if noisy:
        s = t(params[f"{prefix}/kernel_sigma"])
        sd["weight_sigma"] = (s if rows is None else s[rows]).T.contiguous()
        sd["bias_sigma"] = t(params[f"{prefix}/bias_sigma"])
    return sd


def to_ours(params: dict, cfg: dict, features_shape: tuple[int, int, int]) -> dict:
    """The reference's flat parameter dict ('a/b/c' keys, without 'params/') as a state_dict of our QNetwork."""
    sd = {}
    rainbow = cfg["family"] != "dqn"
    noisy = cfg.get("noisy", False)
    c, h, w = features_shape
    # encoder
    if cfg["encoder"] == "nature":
        prefix = "encoder/" if rainbow else ""
        for i in range(3):
            sd[f"encoder.convs.{i}.weight"] = conv(params[f"{prefix}Conv_{i}/kernel"])
            sd[f"encoder.convs.{i}.bias"] = t(params[f"{prefix}Conv_{i}/bias"])
    else:
        for s in range(3):
            ref = f"encoder/_stacks_{s}/Conv_"
            ours = [f"encoder.convs.{s}"] + [f"encoder.blocks.{s}.{b}.conv{j}" for b in (0, 1) for j in (0, 1)]
            for k, name in enumerate(ours):
                sd[f"{name}.weight"] = conv(params[f"{ref}{k}/kernel"])
                sd[f"{name}.bias"] = t(params[f"{ref}{k}/bias"])
    # penultimate layer
    perm = hwc_to_chw(h, w, c)
    dense = "NoisyNetwork_" if noisy else "Dense_"
    heads = iter(f"{dense}{i}" for i in range(4))  # the order in which the reference creates them
    head_rows = None
    if cfg["moe"] == "none":
        layer = next(heads)
        for k, v in linear(layer, params, noisy, rows=perm).items():
            sd[f"dense.{k}"] = v
    else:
        token_perm = perm if cfg.get("tokenization", "perconv") == "persamp" else slice(None)
        if cfg["moe"] == "softmoe":
            sd["moe.phi"] = t(params["SoftMoE_0/phi_weights"])[token_perm]
            sd["moe.scalar"] = t(params["SoftMoE_0/scalar"])
        else:
            sd["moe.router"] = t(params["MoE_0/router/Dense_0/kernel"])
        first = "kernel_mu" if noisy else "kernel"
        sd["moe.experts.w1"] = t(params[f"ExpertModel_0/net/{first}"])[:, token_perm]
        sd["moe.experts.b1"] = t(params[f"ExpertModel_0/net/{first.replace('kernel', 'bias')}"])
        if noisy:
            sd["moe.experts.w1_sigma"] = t(params["ExpertModel_0/net/kernel_sigma"])[:, token_perm]
            sd["moe.experts.b1_sigma"] = t(params["ExpertModel_0/net/bias_sigma"])
        sd["moe.experts.w2"] = t(params["ExpertModel_0/Dense_0/kernel"])[:, :, token_perm]
        sd["moe.experts.b2"] = t(params["ExpertModel_0/Dense_0/bias"])[:, token_perm]
        if cfg.get("tokenization", "perconv") == "persamp":
            head_rows = perm
    # heads
    if not rainbow:
        layer = next(heads)
        sd["head.weight"] = t(params[f"{layer}/kernel"])[head_rows if head_rows is not None else slice(None)].T
        sd["head.bias"] = t(params[f"{layer}/bias"])
    else:
        for name in ("advantage", "value") if cfg.get("dueling", True) else ("head",):
            for k, v in linear(next(heads), params, noisy, rows=head_rows).items():
                sd[f"{name}.{k}"] = v
    return sd


# ----------------------------------------------------------------------------------------------------------------------
# The configurations
# ----------------------------------------------------------------------------------------------------------------------
def configurations() -> list[dict]:
    rainbow = dict(family="rainbow", noisy=True, dueling=True, num_atoms=51)
    nature4, impala8 = dict(encoder="nature", num_experts=4), dict(encoder="impala", num_experts=8)
    # fmt: off
    return [
        dict(name="DER.gin: Rainbow, Nature CNN, Soft MoE 4 experts", **rainbow, **nature4, moe="softmoe"),
        dict(name="DER baseline: Rainbow, Nature CNN, no MoE", **rainbow, **nature4, moe="none"),
        dict(name="Rainbow (full_rainbow.gin's agent), the reference's Impala, Soft MoE 8 experts (the gin: 4)",
             **rainbow, **impala8, moe="softmoe"),
        dict(name="Rainbow, Impala, no MoE", **rainbow, **impala8, moe="none"),
        dict(name="Rainbow, Impala, widened baseline x8 (scale_hidden_layer)", **rainbow, **impala8, moe="none",
             width_multiplier=8),
        dict(name="Rainbow, Impala, Top1-MoE 8 experts", **rainbow, **impala8, moe="top1"),
        dict(name="Rainbow, Impala, Soft MoE, PerFeat tokens", **rainbow, **impala8, moe="softmoe",
             tokenization="perfeat"),
        dict(name="Rainbow, Nature CNN, Soft MoE, PerSamp token", **rainbow, **nature4, moe="softmoe",
             tokenization="persamp"),
        dict(name="Rainbow, Impala, Soft MoE, normalised (--moe-normalize)", **rainbow, **impala8, moe="softmoe",
             normalize=True),
        dict(name="DrQ(eps): scalar Q, dueling, no noise, Nature CNN, Soft MoE 4 experts", family="rainbow",
             noisy=False, dueling=True, num_atoms=1, **nature4, moe="softmoe"),
        dict(name="CQL: scalar Q, no dueling, Impala, Soft MoE 8 experts", family="cql", noisy=False, dueling=False,
             num_atoms=1, **impala8, moe="softmoe"),
        dict(name="CQL+C51: dueling, 51 atoms, Impala, Soft MoE 8 experts", family="cql", noisy=False, dueling=True,
             num_atoms=51, **impala8, moe="softmoe"),
        dict(name="DQN (dqn_impala.gin): Impala, Soft MoE 8 experts", family="dqn", **impala8, moe="softmoe"),
        dict(name="DQN: Impala, no MoE", family="dqn", **impala8, moe="none"),
        dict(name="DQN: Nature CNN, Soft MoE 8 experts", family="dqn", encoder="nature", num_experts=8, moe="softmoe"),
        dict(name="DQN: Nature CNN, Top1-MoE 8 experts", family="dqn", encoder="nature", num_experts=8, moe="top1"),
        dict(name="DQN: Nature CNN, widened baseline x4", family="dqn", **nature4, moe="none", width_multiplier=4),
    ]
    # fmt: on


REF_ROUTING = {"perconv": "PER_PIXEL", "perfeat": "PER_FEATUREMAP", "persamp": "PER_SAMPLE"}
REF_MOE = {"softmoe": "SOFTMOE", "top1": "MOE", "none": "BASELINE"}


def reference_network(networks, cfg: dict, num_actions: int):
    kw = dict(
        num_actions=num_actions,
        num_experts=cfg.get("num_experts", 8),
        moe_type=REF_MOE[cfg["moe"]],
        routing_type=REF_ROUTING.get(cfg.get("tokenization"), "PER_PIXEL"),
        scale_hidden_layer=cfg.get("width_multiplier", 1) > 1,
    )
    if cfg["family"] == "dqn":
        return (networks.ImpalaMoE if cfg["encoder"] == "impala" else networks.NatureDQNMoE)(**kw)
    return networks.FullRainbowMoENetwork(
        **kw,
        num_atoms=cfg["num_atoms"],
        noisy=cfg["noisy"],
        dueling=cfg["dueling"],
        distributional=cfg["num_atoms"] > 1,
        encoder_type="IMPALA" if cfg["encoder"] == "impala" else "CNN",
        nn_scale=1,  # the class default 1.0 makes Flax >= 0.8 reject float channel counts
    )


def our_network(cfg: dict, num_actions: int):
    kw = dict(
        encoder=cfg["encoder"],
        moe=cfg["moe"],
        num_experts=cfg.get("num_experts", 8),
        tokenization=cfg.get("tokenization", "perconv"),
        moe_normalize=cfg.get("normalize", False),
        width_multiplier=cfg.get("width_multiplier", 1),
    )
    if cfg["family"] != "dqn":
        kw |= dict(num_atoms=cfg["num_atoms"], dueling=cfg["dueling"])
    if cfg["family"] == "rainbow":
        kw |= dict(noisy=cfg["noisy"])
    if kw["moe"] == "none":
        kw |= dict(num_experts=None, tokenization=None)
    script = {"dqn": dqn_softmoe, "cql": cql_softmoe, "rainbow": rainbow_softmoe}[cfg["family"]]
    return script.build_network(script.fill_defaults(script.Args(**kw)), num_actions)  # QNetwork from its Network


def flatten(params) -> dict:
    import flax

    return flax.traverse_util.flatten_dict(params["params"], sep="/")


def loaded_network(flat: dict, cfg: dict, num_actions: int):
    """Our network for cfg holding the reference's parameters (every one of ours filled, none left over), noise off."""
    net = our_network(cfg, num_actions)
    net.eval()  # the noise off
    with torch.no_grad():
        features = tuple(net.encoder(torch.zeros(1, 4, 84, 84))[0].shape)
    missing, unexpected = net.load_state_dict(to_ours(flat, cfg, features), strict=False)
    missing = [k for k in missing if k != "support"]
    if missing or unexpected:
        sys.exit(f"error: parameter mapping incomplete for {cfg['name']}: missing {missing}, extra {unexpected}")
    return net


def reference_apply(networks, cfg, num_actions, key, states_hwc):
    """Initialise the reference network (key) and apply it, vmapped, to states (B, 84, 84, 4) in eval mode.

    Returns its flat parameters, Q and logits with every noise off, and Q as the reference itself evaluates: its
    ExpertModel is built without `eval_mode`, so the experts' NoisyNet noise stays on in eval mode (None where there
    are no noisy experts). "Every noise off" zeroes the experts' sigmas for that one pass."""
    import flax
    import gin
    import jax
    import jax.numpy as jnp

    gin.clear_config()
    gin.bind_parameter("SoftMoE.normalization", cfg.get("normalize", False))
    net = reference_network(networks, cfg, num_actions)
    x = jnp.asarray(states_hwc)
    if cfg["family"] == "dqn":
        params = net.init(key, x[0], key=key)
        out = jax.vmap(lambda s: net.apply(params, s, key=key))(x)
        return flatten(params), np.asarray(out.q_values), None, None
    support = jnp.linspace(-10.0, 10.0, cfg["num_atoms"])
    params = net.init(key, x[0], support, eval_mode=True, key=key)

    def apply(p):
        return jax.vmap(lambda s: net.apply(p, s, support, eval_mode=True, key=key))(x)

    flat = flatten(params)
    q_expert_noise = None
    if cfg["noisy"] and cfg["moe"] != "none":
        q_expert_noise = np.asarray(apply(params).q_values)
        quiet = {
            k: (jnp.zeros_like(v) if k.startswith("ExpertModel_0/net/") and "sigma" in k else v)
            for k, v in flat.items()
        }
        params = {"params": flax.traverse_util.unflatten_dict(quiet, sep="/")}
    out = apply(params)
    return flat, np.asarray(out.q_values), np.asarray(out.logits), q_expert_noise


UPDATE_CONFIGS = [
    ("DER.gin network, noise off: C51, 10-step double-DQN target, Soft MoE 4 experts", "rainbow", "der", "softmoe"),
    ("DER baseline, noise off", "rainbow", "der", "none"),
    ("DrQ(eps) without augmentation: scalar Q, Huber loss, Soft MoE 4 experts", "rainbow", "drq-eps", "softmoe"),
    ("CQL: Huber TD + 0.1 CQL penalty, 1-step target, Soft MoE 4 experts", "cql", "cql", "softmoe"),
    ("CQL+C51: C51 TD + 0.1 penalty on expected Q, 3-step double-DQN, Soft MoE 4", "cql", "cql-c51", "softmoe"),
    ("DQN (dqn.gin's loss): squared TD error, 1-step target, Soft MoE 4 (the gin: 8)", "dqn", "dqn", "softmoe"),
    ("DQN: Top1-MoE 4 experts", "dqn", "dqn", "top1"),
    ("DQN: no MoE", "dqn", "dqn", "none"),
]


def update_batch(states: np.ndarray, num_actions: int) -> dict[str, np.ndarray]:
    """The states, next states rolled by one, random actions, rewards in {-1, 0, 1}, every fourth transition
    terminal, IS weights in (0.1, 1]."""
    rng = np.random.default_rng(0)
    B = len(states)
    return {
        "states": states,
        "next_states": np.roll(states, 1, axis=0),
        "actions": rng.integers(num_actions, size=B),
        "rewards": rng.integers(-1, 2, size=B).astype(np.float32),
        "terminals": (np.arange(B) % 4 == 3).astype(np.float32),
        "weights": rng.uniform(0.1, 1.0, size=B).astype(np.float32),
    }


def update_setup(name: str, family: str, agent_name: str, moe: str) -> tuple:
    """Our Args for one UPDATE_CONFIGS row (Nature CNN, 4 experts, noise and augmentation off) and its configuration."""
    common = dict(encoder="nature", moe=moe, num_experts=4)
    if family == "rainbow":
        args = rainbow_softmoe.fill_defaults(
            rainbow_softmoe.preset_args(agent_name, **common, noisy=False, data_augmentation=False)
        )
    elif family == "cql":
        args = cql_softmoe.fill_defaults(cql_softmoe.agent_args(agent_name, **common))
    else:
        args = dqn_softmoe.fill_defaults(dqn_softmoe.Args(**common))
    dueling, num_atoms = getattr(args, "dueling", False), getattr(args, "num_atoms", 1)
    cfg = dict(name=name, family=family, noisy=False, dueling=dueling, num_atoms=num_atoms,
               encoder="nature", moe=moe, num_experts=4, tokenization="perconv")  # fmt: skip
    return args, cfg


def reference_update(networks, agents, cfg: dict, args, batch: dict, num_actions: int) -> tuple:
    """Online and target networks from two reference initialisations (keys 0 and 1) and one step of the reference's
    jitted train() on the batch. Returns online, target and updated parameters, the loss and its parts."""
    import gin
    import jax
    import jax.numpy as jnp
    import optax

    x, next_x = (jnp.asarray(batch[k].transpose(0, 2, 3, 1)) for k in ("states", "next_states"))
    actions, rewards, terminals = (jnp.asarray(batch[k]) for k in ("actions", "rewards", "terminals"))
    family, num_atoms = cfg["family"], cfg["num_atoms"]
    gin.clear_config()
    net = reference_network(networks, cfg, num_actions)
    support = jnp.linspace(-10.0, 10.0, num_atoms)
    init = (support,) if family != "dqn" else ()
    kwargs = dict(eval_mode=True) if family != "dqn" else {}
    online = net.init(jax.random.PRNGKey(0), x[0], *init, **kwargs, key=jax.random.PRNGKey(0))
    target = net.init(jax.random.PRNGKey(1), x[0], *init, **kwargs, key=jax.random.PRNGKey(0))
    optimizer = optax.adam(args.learning_rate, eps=args.adam_eps)
    gamma_n, distributional, key = args.gamma**args.n_step, num_atoms > 1, jax.random.PRNGKey(2)
    if family == "dqn":
        out = agents["dqn"].train(
            net, online, target, optimizer, optimizer.init(online), x, actions, next_x, rewards, terminals,
            gamma_n, key, False, False, loss_type="mse",
        )  # fmt: skip
        return online, target, out["online_params"], float(out["td_loss"]), {}
    if family == "rainbow":
        out = agents["rainbow"].train(
            net, online, target, optimizer, optimizer.init(online), x, actions, next_x, rewards, terminals,
            jnp.asarray(batch["weights"]), support, gamma_n, args.double, distributional, False, key, False, False,
        )  # fmt: skip
        parts = {"per_sample_loss": np.asarray(out["td_loss"])}
        return online, target, out["online_params"], float(out["mean_td_loss"]), parts
    _, new_params, loss, (td, penalty), _ = agents["offline"].train(
        net, online, target, optimizer, optimizer.init(online), x, actions, next_x, rewards, terminals,
        support, gamma_n, args.double, distributional, key, bc_coefficient=args.cql_coef,
    )  # fmt: skip
    return online, target, new_params, float(loss), {"td_loss": float(td), "cql_penalty": float(penalty)}


def one_update(networks, agents, states: np.ndarray, num_actions: int) -> list[dict]:
    """The reference's jitted train() (full_rainbow_moe_agent's; offline_rainbow_agent's for CQL; dqn_moe_agent's for
    DQN; each with its own target computation) against our rainbow_loss / cql_loss / dqn_loss followed by torch Adam,
    on update_batch and the Nature CNN (the cheapest). Compares the losses and the parameters after the step. The
    noise is off on both sides: the two draw it from different generators."""
    batch = update_batch(states, num_actions)
    rows = []
    for name, family, agent_name, moe in UPDATE_CONFIGS:
        args, cfg = update_setup(name, family, agent_name, moe)
        online, target, new_params, loss_ref, parts_ref = reference_update(
            networks, agents, cfg, args, batch, num_actions
        )
        q_net, target_net = (loaded_network(flatten(p), cfg, num_actions) for p in (online, target))
        before = {k: v.clone() for k, v in q_net.state_dict().items()}
        adam = torch.optim.Adam(q_net.parameters(), lr=args.learning_rate, eps=args.adam_eps)
        tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
        tensors["actions"] = tensors["actions"].long()
        tensors["states"], tensors["next_states"] = {"obs": tensors["states"]}, {"obs": tensors["next_states"]}
        losses = {"rainbow": rainbow_softmoe.rainbow_loss, "cql": cql_softmoe.cql_loss, "dqn": dqn_softmoe.dqn_loss}
        loss_fn = losses[family]
        loss, metrics = loss_fn(q_net, target_net, tensors, args)
        adam.zero_grad()
        loss.backward()
        adam.step()
        after_ref = loaded_network(flatten(new_params), cfg, num_actions).state_dict()
        diffs = {
            k: float(((v - before[k]) - (after_ref[k] - before[k])).abs().max()) for k, v in q_net.state_dict().items()
        }
        worst = max(diffs, key=diffs.get)
        step_diff = diffs[worst]
        step_size = max(float((after_ref[k] - before[k]).abs().max()) for k in before)
        row = {"config": name, "loss_ours": float(loss.detach()), "loss_reference": loss_ref}
        if family == "rainbow":
            ours = metrics["per_sample_loss"].detach().numpy()
            row["max_abs_per_sample_loss_diff"] = float(np.abs(ours - parts_ref["per_sample_loss"]).max())
            detail = f"max|d per-sample loss| {row['max_abs_per_sample_loss_diff']:.2g}"
        elif family == "cql":
            for k in ("td_loss", "cql_penalty"):
                row[f"{k}_ours"], row[f"{k}_reference"] = float(metrics[k]), parts_ref[k]
            detail = (
                f"TD {row['td_loss_ours']:.6f} / {row['td_loss_reference']:.6f}, "
                f"penalty {row['cql_penalty_ours']:.6f} / {row['cql_penalty_reference']:.6f}"
            )
        else:
            detail = "(mean squared TD error)"
        row |= {"largest_parameter_change": step_size, "max_abs_parameter_change_diff": step_diff, "in": worst}
        rows.append(row)
        print(
            f"{name:<82} loss ours {row['loss_ours']:.6f} reference {row['loss_reference']:.6f}  {detail}  "
            f"max|d step| {step_diff:.2g} in {worst} (largest step {step_size:.2g})"
        )
    return rows


def same_weights(networks, states: np.ndarray, num_actions: int) -> list[dict]:
    """Part 1: every configuration, the reference's parameters in both networks, Q and logits on the same states."""
    import jax

    states_hwc = states.transpose(0, 2, 3, 1)
    rows = []
    for cfg in configurations():
        flat, q_ref, logits_ref, q_ref_noisy = reference_apply(
            networks, cfg, num_actions, jax.random.PRNGKey(0), states_hwc
        )
        ours = loaded_network(flat, cfg, num_actions)
        with torch.no_grad():
            q, aux = ours({"obs": torch.from_numpy(states)}, return_aux=True)
        row = {
            "config": cfg["name"],
            "parameters": sum(v.size for v in flat.values()),
            "max_abs_q": float(np.abs(q_ref).max()),
            "max_abs_q_diff": float(np.abs(q.numpy() - q_ref).max()),
            "same_greedy_action": float((q.numpy().argmax(1) == q_ref.argmax(1)).mean()),
        }
        if logits_ref is not None:
            logits = aux["logits"].numpy()
            row["max_abs_logit_diff"] = float(np.abs(logits - logits_ref.reshape(logits.shape)).max())
        if q_ref_noisy is not None:  # the reference's own eval mode, its experts' noise on
            row["max_abs_q_diff_reference_eval_mode"] = float(np.abs(q.numpy() - q_ref_noisy).max())
            row["same_greedy_action_reference_eval_mode"] = float((q.numpy().argmax(1) == q_ref_noisy.argmax(1)).mean())
        rows.append(row)
        print(
            f"{cfg['name']:<76} {row['parameters']:>11,} params  max|Q| {row['max_abs_q']:.3g}  "
            f"max|dQ| {row['max_abs_q_diff']:.2g}"
            + (f"  max|dlogit| {row['max_abs_logit_diff']:.2g}" if "max_abs_logit_diff" in row else "")
            + f"  same argmax {row['same_greedy_action']:.0%}"
        )
        if q_ref_noisy is not None:
            print(
                f"{'   (the reference evaluating with its experts noise on)':<76} {'':>18} "
                f"max|dQ| {row['max_abs_q_diff_reference_eval_mode']:.2g}  "
                f"same argmax {row['same_greedy_action_reference_eval_mode']:.0%}"
            )

    return rows


def initialisations(networks, states: np.ndarray, num_actions: int, seeds: int) -> list[dict]:
    """Part 2: each library's own initialisation of the Atari-100k networks, tensor by tensor, and its routing."""
    import jax

    states_hwc = states.transpose(0, 2, 3, 1)
    rows = []
    for cfg in (configurations()[0], configurations()[2]):
        per_tensor, entropy = {}, {"reference": [], "ours": []}
        for seed in range(seeds):
            flat, *_ = reference_apply(networks, cfg, num_actions, jax.random.PRNGKey(seed), states_hwc[:1])
            torch.manual_seed(seed)
            ours = our_network(cfg, num_actions)
            ours.eval()  # the noise off
            theirs = loaded_network(flat, cfg, num_actions)
            for name, p in ours.state_dict().items():
                if name == "support":
                    continue
                stats = per_tensor.setdefault(name, {"ours": [], "reference": []})
                stats["ours"].append(float(p.float().pow(2).mean().sqrt()))
                other = theirs.state_dict()[name]
                stats["reference"].append(float(other.float().pow(2).mean().sqrt()))
            for who, net in (("ours", ours), ("reference", theirs)):
                with torch.no_grad():
                    _, aux = net({"obs": torch.from_numpy(states)}, return_aux=True)
                d = aux["dispatch"]  # (B, m, n, p)
                ent = -(d * d.clamp_min(1e-30).log()).sum(1) / math.log(d.shape[1])
                entropy[who].append(float(ent.mean()))
        print(f"{cfg['name']}")
        tensors = []
        for name, s in per_tensor.items():
            o, r = np.mean(s["ours"]), np.mean(s["reference"])
            tensors.append({"tensor": name, "rms_ours": o, "rms_reference": r, "ratio": o / r if r else float("nan")})
            print(f"  {name:<32} rms ours {o:.4g}  reference {r:.4g}  ratio {tensors[-1]['ratio']:.3f}")
        e_o, e_r = np.array(entropy["ours"]), np.array(entropy["reference"])
        print(
            f"  dispatch entropy / log m at init: ours {e_o.mean():.6f} (min {e_o.min():.6f}), "
            f"reference {e_r.mean():.6f} (min {e_r.min():.6f})"
        )
        rows.append(
            {
                "config": cfg["name"],
                "tensors": tensors,
                "dispatch_entropy_ours": entropy["ours"],
                "dispatch_entropy_reference": entropy["reference"],
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dopamine-dir", required=True, help="a checkout of github.com/google/dopamine")
    parser.add_argument("--init-seeds", type=int, default=8, help="seeds per library for the initialisation part")
    parser.add_argument("--parts", default="123", help="which parts to run, e.g. 3 for the update check alone")
    parser.add_argument("--out", default=None, help="default: results/reference_check/output.json, for all parts")
    args = parser.parse_args()
    if not args.parts or set(args.parts) - set("123"):
        parser.error(f"--parts takes digits of 1, 2 and 3, got {args.parts!r}")
    if args.init_seeds < 1:
        parser.error(f"--init-seeds must be at least 1, got {args.init_seeds}")
    if args.out is None and set(args.parts) != set("123"):  # the committed output holds all three parts
        parser.error("--parts without all of 1, 2 and 3 needs --out (the default is the committed full report)")
    args.out = args.out or os.path.join(ROOT, "results", "reference_check", "output.json")
    networks, agents = import_reference(args.dopamine_dir)
    torch.set_num_threads(1)
    states = np.concatenate([atari_states("Boxing", 16, 0), atari_states("Breakout", 16, 0)])  # (32, 4, 84, 84)
    num_actions = 18
    report = {"states": "16 Boxing + 16 Breakout stacks, random play"}
    if "1" in args.parts:
        print("== 1. Same weights, same states: our network against the reference (noise off)")
        report["equivalence"] = same_weights(networks, states, num_actions)
    if "2" in args.parts:
        print(f"\n== 2. Each library's own initialisation ({args.init_seeds} seeds each), Atari-100k networks")
        report["initialisation"] = initialisations(networks, states, num_actions, args.init_seeds)
    if "3" in args.parts:
        print(
            "\n== 3. One update on the same batch: rainbow_loss / cql_loss / dqn_loss + torch Adam against the "
            "reference's train()"
        )
        report["update"] = one_update(networks, agents, states, num_actions)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
