"""Check the noise_factorised change of dopamine_reference.py: the reference's NoisyNetwork computing
x w_mu + ((x * f(p)) w_sigma) * f(q) gives what the shipped x (w_mu + w_sigma * f(p) f(q)^T) gives, to float32
rounding, and how much faster the agent's update runs with it.

    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false taskset -c 0 .refvenv/bin/python -W ignore \\
        results/reference_training/noise_check.py --dopamine-dir ../dopamine

1. The layer, under vmap with one key per sample as the agent's online pass runs it, at the baseline's shape
   (7,744 -> 512) and an expert's (64 tokens of 64 -> 512), shipped and changed: outputs and the gradients of every
   parameter against a float64 computation of Fortunato et al.'s (8)-(11), written out, from the same draws.
2. The agent: Atari100kRainbowMoEAgent (DER.gin), both arms, shipped and changed, each in its own process from the
   same seed on the same 200 random transitions; the parameters after each of --updates updates, and the time an
   update takes.
Writes noise_check.json beside this file.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def layer_check(ref_networks, shapes=((7744,), (64, 64)), features=512, batch=32) -> dict:
    """Largest |layer - formula| of the outputs and of each parameter's gradient (summed over the batch), relative to
    the largest |formula| value: the loaded NoisyNetwork in float32 under vmap with one key per sample, the formula
    (Fortunato et al.'s (8)-(11) and its derivatives, written out) in float64 numpy on the same draws."""
    import jax
    import jax.numpy as jnp

    out = {}
    for shape in shapes:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(batch, *shape)).astype(np.float32)
        g = rng.normal(size=(batch, *shape[:-1], features)).astype(np.float32)  # dL/dy: L = sum(y * g)
        keys = jax.random.split(jax.random.PRNGKey(1), batch)
        params = ref_networks.NoisyNetwork(rng_key=keys[0]).init(jax.random.PRNGKey(2), x[0], features)
        params = jax.tree_util.tree_map(lambda p, r=rng: p + 0.05 * r.normal(size=p.shape).astype(np.float32), params)

        def loss(params, x, key, g):
            return jnp.sum(ref_networks.NoisyNetwork(rng_key=key).apply(params, x, features) * g)

        value, grads = jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0, 0, 0))(params, x, keys, g)
        f = lambda v: np.sign(v) * np.sqrt(np.abs(v))  # noqa: E731
        draws = [jax.random.split(key) for key in keys]  # the layer's own split of its key into p's and q's
        f_p = np.stack([f(np.asarray(jax.random.normal(k[0], [shape[-1], 1]), np.float64))[:, 0] for k in draws])
        f_q = np.stack([f(np.asarray(jax.random.normal(k[1], [1, features]), np.float64))[0] for k in draws])
        P = {k: np.asarray(v, np.float64) for k, v in params["params"].items()}
        x64, g64 = x.astype(np.float64).reshape(batch, -1, shape[-1]), g.astype(np.float64).reshape(batch, -1, features)
        w = P["kernel_mu"] + P["kernel_sigma"] * np.einsum("bi,bo->bio", f_p, f_q)  # (8): a weight per sample
        y = np.einsum("bti,bio->bto", x64, w) + P["bias_mu"] + P["bias_sigma"] * f_q[:, None, :]
        xg = np.einsum("bti,bto->bio", x64, g64)
        exact = {
            "output": (y * g64).sum(axis=(1, 2)),
            "kernel_mu": xg.sum(0),
            "kernel_sigma": (xg * np.einsum("bi,bo->bio", f_p, f_q)).sum(0),
            "bias_mu": g64.sum(axis=(0, 1)),
            "bias_sigma": (g64.sum(1) * f_q).sum(0),
        }
        got = {"output": value, **{k: v.sum(0) for k, v in grads["params"].items()}}
        out["x".join(map(str, shape)) + f"->{features}"] = {
            k: float(np.abs(np.asarray(got[k], np.float64) - v).max() / np.abs(v).max()) for k, v in exact.items()
        }
    return out


def agent_run(dopamine_dir: str, moe_type: str, shipped: bool, updates: int, path: str) -> None:
    """One process: the agent's parameters after each update, and the seconds per update."""
    import dopamine_reference
    import jax

    ref = dopamine_reference.load(dopamine_dir, noise_as_shipped=shipped)
    layer = layer_check(ref.moe_networks.base_networks)
    bindings = dopamine_reference.GIN_REPLAY + [f"FullRainbowMoENetwork.moe_type = '{moe_type}'"]
    ref.run_experiment.load_gin_configs([ref.der_gin], bindings)
    agent = ref.agent_module.Atari100kRainbowMoEAgent(num_actions=4, seed=1)
    rng = np.random.default_rng(0)
    for t in range(200):
        agent._store_transition(rng.integers(0, 255, (84, 84), dtype=np.uint8), t % 4, float(t % 7 == 0), t % 50 == 49)
    params, seconds = [], []
    for _ in range(updates):
        start = time.perf_counter()
        agent._training_step_update()
        jax.block_until_ready(agent.online_params)
        seconds.append(time.perf_counter() - start)
        params.append(np.concatenate([np.ravel(p) for p in jax.tree_util.tree_leaves(agent.online_params)]))
    np.savez(path, params=np.stack(params), seconds=np.array(seconds), layer=json.dumps(layer))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dopamine-dir", required=True)
    p.add_argument("--updates", type=int, default=10)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # moe_type shipped|changed path
    cli = p.parse_args()
    if cli.child:
        moe_type, version, path = cli.child
        return agent_run(cli.dopamine_dir, moe_type, version == "shipped", cli.updates, path)
    result = {"updates": cli.updates, "agent": {}}
    for moe_type in ("SOFTMOE", "BASELINE"):
        runs = {}
        for version in ("shipped", "changed"):
            path = os.path.join("/tmp", f"noise_check_{moe_type}_{version}.npz")
            cmd = [sys.executable, "-W", "ignore", __file__, "--dopamine-dir", cli.dopamine_dir]
            subprocess.run([*cmd, "--updates", str(cli.updates), "--child", moe_type, version, path], check=True)
            runs[version] = np.load(path)
        shipped, changed = runs["shipped"]["params"], runs["changed"]["params"]
        scale = np.abs(shipped[0]).max()
        result["layer"] = {v: json.loads(str(runs[v]["layer"])) for v in runs}
        result["agent"][moe_type] = {
            # the first update compiles: the time is the median of the others
            "seconds_per_update": {v: float(np.median(runs[v]["seconds"][1:])) for v in runs},
            "max_param_difference_after_each_update": [float(d) for d in np.abs(shipped - changed).max(axis=1)],
            "max_param_step_first_update": float(np.abs(shipped[0] - shipped[1]).max()),
            "largest_param": float(scale),
        }
        print(moe_type, json.dumps(result["agent"][moe_type]), flush=True)
    print("layer", json.dumps(result["layer"]))
    with open(os.path.join(HERE, "noise_check.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
