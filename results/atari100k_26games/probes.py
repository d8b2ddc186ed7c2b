"""The probe states of every snapshot of a run, kept in one small file once the snapshots are gone.

    python results/atari100k_26games/probes.py OUT.npz work/runs/<segment> [work/runs/<segment> ...]

A snapshot (rainbow_softmoe.py --snapshot-every) holds the networks and 32 replay transitions drawn at its step, the
probe that benchmark/moe_analysis.py measures the routing on. The snapshots stay in work/ (git-ignored: ~18 MB each
for Soft MoE with the DER.gin network), so a fresh machine loses them. results/reference_training/compare.py measures
the reference's Soft MoE on our probe at the step of the look; with this file (the probes' stacked frames, uint8,
one array per step, named "<step>"; ~0.1 MB a probe compressed) and the run's analysis.csv (ours' statistics on the same
probes), that look needs no snapshot. queue.sh writes it for the runs of Breakout seed 1, the comparison's runs.
"""

import glob
import os
import sys

import numpy as np
import torch


def probe_states(snapshot_path: str) -> tuple[int, np.ndarray]:
    """The step of a snapshot and its probe's states (32, 4, 84, 84) uint8."""
    snap = torch.load(snapshot_path, map_location="cpu", weights_only=True)
    states = snap["probe"]["states"]
    states = states["obs"] if isinstance(states, dict) else states  # the network's input mapping, or the bare stacks
    return snap["global_step"], states.numpy()


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__.split("\n\n")[1].strip())
    out, runs = sys.argv[1], sys.argv[2:]
    probes = {}
    for run in runs:
        for path in glob.glob(os.path.join(run, "snapshots", "*.pt")):
            step, states = probe_states(path)
            probes[str(step)] = states
    if not probes:
        raise SystemExit(f"error: no snapshot in {', '.join(runs)}")
    np.savez_compressed(out, **probes)
    print(f"{out}: the probes of steps {', '.join(sorted(probes, key=int))}")


if __name__ == "__main__":
    main()
