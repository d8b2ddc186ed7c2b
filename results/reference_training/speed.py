"""One update and one acting pass of the reference's DER.gin agent and of rainbow_softmoe.py --preset der with the same
network, in one process, one after the other, each on one thread (XLA's multi-threaded Eigen off, torch one thread):
the speed row of README.md, measured in one sitting.

    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false taskset -c 0 .refvenv/bin/python -W ignore \\
        results/reference_training/speed.py --dopamine-dir ../dopamine [--updates 20] [--out speed_<cpu>.json]

taskset pins both codes to one core: XLA spreads an update over every core it may use. `--threads 2`, unpinned and
without XLA_FLAGS, times each code on both cores instead (torch two threads, XLA's multi-threaded Eigen on): what one
run alone on the machine gets.

Both learn from 32-transition minibatches of random frames (the update's cost does not depend on the pixels); the
reference samples from its own replay, ours from FrameReplay. Prints and writes speed.json (or --out) beside this file.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "algos")]


LOADED = {}


def reference(dopamine_dir: str, moe_type: str, updates: int) -> dict:
    import dopamine_reference
    import jax

    if dopamine_dir not in LOADED:  # the reference's modules register with gin once per process
        LOADED[dopamine_dir] = dopamine_reference.load(dopamine_dir)
    ref = LOADED[dopamine_dir]
    ref.gin.clear_config()
    bindings = dopamine_reference.GIN_REPLAY + [f"FullRainbowMoENetwork.moe_type = '{moe_type}'"]
    ref.run_experiment.load_gin_configs([ref.der_gin], bindings)
    agent = ref.agent_module.Atari100kRainbowMoEAgent(num_actions=4, seed=1)
    rng = np.random.default_rng(0)
    for _ in range(200):
        agent._store_transition(rng.integers(0, 255, (84, 84), dtype=np.uint8), rng.integers(4), 0.0, False)
    agent._training_step_update()  # compiles
    jax.block_until_ready(agent.online_params)
    start = time.perf_counter()
    for _ in range(updates):
        agent._training_step_update()  # samples, trains, sets the priorities
    jax.block_until_ready(agent.online_params)
    update = (time.perf_counter() - start) / updates
    agent.eval_mode, agent.state = False, np.zeros((1, 84, 84, 4))
    act = ref.agent_module.base_100k_rainbow.select_action

    def acting():
        agent._rng, action = act(
            agent.network_def, agent.online_params, agent.preprocess_fn(agent.state), agent._rng, agent.num_actions,
            agent.eval_mode, agent.epsilon_eval, agent.epsilon_train, agent.epsilon_decay_period, agent.training_steps,
            agent.min_replay_history, agent.epsilon_fn, agent._support,
        )  # fmt: skip
        return np.asarray(action)

    acting()
    start = time.perf_counter()
    for _ in range(50):
        acting()
    return {"update_seconds": update, "acting_seconds": (time.perf_counter() - start) / 50}


def ours(moe: str, updates: int, threads: int = 1) -> dict:
    import torch

    import rainbow_softmoe as R

    torch.set_num_threads(threads)
    experts = {"num_experts": 4} if moe == "softmoe" else {}
    args = R.fill_defaults(R.preset_args("der", encoder="nature", moe=moe, **experts))
    torch.manual_seed(0)
    q_net = R.build_network(args, 4).to(memory_format=torch.channels_last)
    target_net = R.build_network(args, 4).to(memory_format=torch.channels_last).requires_grad_(False)
    optimizer = R.make_optimizer(q_net, args)
    replay, rng = R.FrameReplay(1000, 1, prioritized=True), np.random.default_rng(0)
    for t in range(600):
        replay.add(
            frames=rng.integers(0, 256, (1, 84, 84), dtype=np.uint8), actions=np.array([t % 4]),
            rewards=np.array([float(t % 7 == 0)]), terminals=np.array([t % 90 == 89]), valid=np.ones(1, bool),
            history=np.array([min(t % 90, 3)]),
        )  # fmt: skip

    def update():
        batch = replay.sample(32, rng, args.n_step, args.gamma)
        metrics = R.train_step(q_net, target_net, optimizer, R.to_tensors(batch, "cpu"), args)
        replay.update_priorities(batch, metrics["per_sample_loss"])

    update()
    start = time.perf_counter()
    for _ in range(updates):
        update()
    seconds = (time.perf_counter() - start) / updates
    inputs = {"obs": rng.integers(0, 256, (1, 4, 84, 84), dtype=np.uint8)}
    R.select_actions(q_net, inputs, 0.0, rng, 4, "cpu")
    start = time.perf_counter()
    for _ in range(50):
        R.select_actions(q_net, inputs, 0.0, rng, 4, "cpu")
    return {"update_seconds": seconds, "acting_seconds": (time.perf_counter() - start) / 50}


def cpu_model() -> str:
    """The CPU's model name, family, model and widest vector extension (Linux), since speeds compare only on one CPU
    and one model name ("AMD EPYC") can stand for CPUs of different speeds."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        flags = fields["flags"].split()
        vector = next((v for v in ("avx512f", "avx2", "avx") if v in flags), "none")
        return f"{fields['model name']} (family {fields['cpu family']}, model {fields['model']}; {vector})"
    except (OSError, KeyError):
        return platform.processor() or platform.machine()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dopamine-dir", required=True)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch's threads (the reference's follow XLA_FLAGS)")
    p.add_argument("--out", default="speed.json", help="file name beside this script (one per CPU measured)")
    cli = p.parse_args()
    rows = []
    for arm, moe_type, moe in (("softmoe", "SOFTMOE", "softmoe"), ("baseline", "BASELINE", "none")):
        for code in ("ours", "dopamine"):
            if code == "ours":
                timed = ours(moe, cli.updates, cli.threads)
            else:
                timed = reference(cli.dopamine_dir, moe_type, cli.updates)
            rows.append({"code": code, "arm": arm, **timed})
            update, acting = timed["update_seconds"], 1000 * timed["acting_seconds"]
            print(f"{code:8} {arm:8} update {update:.3f} s, acting {acting:.1f} ms", flush=True)
    out = {
        "machine": platform.processor() or platform.machine(),
        "cpu": cpu_model(),
        "updates": cli.updates,
        "torch_threads": cli.threads,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "rows": rows,
    }
    with open(os.path.join(HERE, cli.out), "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
