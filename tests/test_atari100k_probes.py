"""results/atari100k_26games/probes.py: every snapshot's probe states of a run's segments, byte for byte, under its
step, whether the probe holds the network's input mapping or the bare stacks; no snapshot is a one-line error."""

import os
import subprocess
import sys

import numpy as np
import torch

PROBES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "atari100k_26games",
                      "probes.py")  # fmt: skip


def snapshot(path, step: int, states: torch.Tensor, mapping: bool):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    probe = {"states": {"obs": states} if mapping else states, "actions": torch.zeros(len(states), dtype=torch.long)}
    torch.save({"global_step": step, "probe": probe, "q_net": {}}, path)


def test_probes_keep_each_snapshots_states_under_its_step(tmp_path):
    rng = np.random.default_rng(0)
    frames = {step: torch.from_numpy(rng.integers(0, 256, (32, 4, 84, 84), dtype=np.uint8)) for step in (10, 20, 30)}
    snapshot(tmp_path / "a" / "snapshots" / "s_10.pt", 10, frames[10], mapping=True)
    snapshot(tmp_path / "a" / "snapshots" / "s_20.pt", 20, frames[20], mapping=False)
    snapshot(tmp_path / "b" / "snapshots" / "s_30.pt", 30, frames[30], mapping=True)
    out = tmp_path / "probes.npz"
    subprocess.run([sys.executable, PROBES, str(out), str(tmp_path / "a"), str(tmp_path / "b")], check=True,
                   capture_output=True)  # fmt: skip
    with np.load(out) as kept:
        assert sorted(kept, key=int) == ["10", "20", "30"]
        for step, states in frames.items():
            assert kept[str(step)].dtype == np.uint8 and np.array_equal(kept[str(step)], states.numpy())


def test_a_run_without_snapshots_is_refused_in_one_line(tmp_path):
    (tmp_path / "a").mkdir()
    done = subprocess.run([sys.executable, PROBES, str(tmp_path / "out.npz"), str(tmp_path / "a")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1 and done.stderr.strip().startswith("error: no snapshot in")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.npz").exists()
