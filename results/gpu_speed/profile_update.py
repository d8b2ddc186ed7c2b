"""Where a step of dqn_softmoe.py and rainbow_softmoe.py goes on a GPU: each part of the loop timed alone (with a
synchronisation after it) and a whole update without intermediate synchronisations, on a replay memory of 10,000 random
rows, plus torch.profiler's count of kernels per update.

    python results/gpu_speed/profile_update.py --device cuda --reps 200 --network "nature none"
"""

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch
import tyro

ROOT = Path(__file__).resolve().parents[2]


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "algos" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def timed(fn, reps, device):
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / reps


def profile(script: str, encoder: str, moe: str, device, reps: int):
    m = load(script)
    argv = ["--encoder", encoder, "--moe", moe, "--buffer-size", "10000"]
    args = m.fill_defaults(m.parse_args(argv) if hasattr(m, "parse_args") else tyro.cli(m.Args, args=argv))
    if script == "dqn_softmoe":
        args.target_network_frequency = 1000
    rng = np.random.default_rng(0)
    A = 4
    q_net = m.build_network(args, A).to(device, memory_format=torch.channels_last)
    target_net = m.build_network(args, A).to(device, memory_format=torch.channels_last)
    target_net.load_state_dict(q_net.state_dict())
    target_net.requires_grad_(False)
    opt = torch.optim.Adam(q_net.parameters(), lr=1e-4, fused=True)
    kw = {"prioritized": not args.uniform_replay} if script == "rainbow_softmoe" else {}
    replay = m.FrameReplay(10000, 1, **kw)
    for t in range(10000):
        frame = rng.integers(0, 256, (1, 84, 84), dtype=np.uint8)
        replay.add(frames=frame, actions=np.array([t % A]), rewards=np.array([float(t % 7 == 0)]),
                   terminals=np.array([t % 500 == 499]), valid=np.ones(1, bool),
                   history=np.array([min(t % 500, 3)]))  # fmt: skip
    obs = rng.integers(0, 256, (1, 4, 84, 84), dtype=np.uint8)
    loss_fn = m.rainbow_loss if script == "rainbow_softmoe" else m.dqn_loss
    sample = lambda: replay.sample(32, rng, args.n_step, args.gamma)  # noqa: E731
    batch = sample()
    tensors = m.to_tensors(batch, device)

    def act():
        m.select_actions(q_net, obs, 0.0, rng, A, device)

    def forward():
        return loss_fn(q_net, target_net, tensors, args)

    def forward_backward():
        loss, _ = forward()
        opt.zero_grad(set_to_none=True)
        loss.backward()

    def update():
        b = sample()
        loss, metrics = loss_fn(q_net, target_net, m.to_tensors(b, device), args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if hasattr(replay, "update_priorities"):
            replay.update_priorities(b, metrics["per_sample_loss"])

    rows = {
        "act (1 state, argmax to the host)": timed(act, reps, device),
        "replay.sample (host)": timed(sample, reps, device),
        "to_tensors (host to device)": timed(lambda: m.to_tensors(batch, device), reps, device),
        "loss forward": timed(forward, reps, device),
        "loss forward + backward": timed(forward_backward, reps, device),
        "optimizer.step": timed(opt.step, reps, device),
        "whole update (sample .. priorities)": timed(update, reps, device),
    }
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(10):
            update()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = sum(e.count for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    print(f"\n## {script} --encoder {encoder} --moe {moe} on {device} ({reps} reps, ms per call)")
    for k, v in rows.items():
        print(f"{k:40s} {v:8.2f}")
    print(f"kernels per update (profiler, 10 updates): {kernels / 10:.0f}; launch calls per update {launches / 10:.0f}")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--network", nargs="+", default=["nature none", "nature softmoe"])
    p.add_argument("--scripts", nargs="+", default=["dqn_softmoe", "rainbow_softmoe"])
    a = p.parse_args()
    for script in a.scripts:
        for network in a.network:
            profile(script, *network.split(), torch.device(a.device), a.reps)
