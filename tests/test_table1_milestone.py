"""results/tetris_table1_paper/milestone.py: a packed run unpacks to a checkpoint that packs back to the same state,
the learner bit for bit and every 1,000-episode block's sums of score, squared score and length."""

import os
import sys

import numpy as np
import pytest
import torch

import td_lambda_tetris as td

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                                "tetris_table1_paper"))  # fmt: skip
import milestone  # noqa: E402


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """A real checkpoint of a short batched run, its history replaced by 3,500 episodes per run of known scores: a
    pack sums blocks 0 and 1 and keeps episodes 2,000-3,499 raw."""
    monkeypatch.chdir(tmp_path)
    path = td.main(td.Args(total_episodes=3, num_runs=2, activation=("dsilu", "relu"), hidden=4, save_model=True,
                           log_every_seconds=1000.0))["checkpoint"]  # fmt: skip
    ckpt = torch.load(path, weights_only=True)
    rng = np.random.default_rng(0)
    runs, episodes = len(ckpt["episodes"]), 3500
    ckpt["episodes"] = torch.full((runs,), episodes)
    ckpt["scores"] = torch.from_numpy(rng.poisson(rng.uniform(1, 300, (runs, 1)), (runs, episodes)).astype(np.float32))
    ckpt["lengths"] = torch.from_numpy(rng.integers(5, 900, (runs, episodes)))
    torch.save(ckpt, path)
    return path, ckpt


def test_pack_unpack_pack_keeps_the_learner_and_every_blocks_sums(checkpoint, tmp_path):
    path, ckpt = checkpoint
    milestone.pack(path, str(tmp_path / "a.npz"))
    milestone.unpack(str(tmp_path / "a.npz"), str(tmp_path / "a.pt"))
    milestone.pack(str(tmp_path / "a.pt"), str(tmp_path / "b.npz"))
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    scores = ckpt["scores"].double().numpy()[:, :2000].reshape(-1, 2, 1000)  # the two summed blocks of every run
    assert a["block_sums"].shape == (3, 4, 2) and a["tail_start"].tolist() == [2000] * 4
    np.testing.assert_allclose(a["block_sums"][0], scores.sum(2))
    np.testing.assert_allclose(a["block_sums"][1], (scores**2).sum(2))
    np.testing.assert_allclose(b["block_sums"][:2], a["block_sums"][:2], rtol=1e-6)  # the sd survives the cycle
    np.testing.assert_array_equal(b["block_sums"][2], a["block_sums"][2])  # placements per block, exactly
    for name in a.files:
        if name != "block_sums":
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    unpacked = torch.load(tmp_path / "a.pt", weights_only=True)
    for name, tensor in ckpt["params"].items():
        torch.testing.assert_close(unpacked["params"][name], tensor, rtol=1e-6, atol=1e-7, msg=name)
    block = unpacked["scores"][:, :2000].double().view(-1, 2, 1000)  # inside a summed block: its mean +- its sd
    np.testing.assert_allclose(block.std(2, unbiased=False).numpy(), scores.std(2), rtol=1e-5)
    np.testing.assert_allclose(block.mean(2).numpy(), scores.mean(2), rtol=1e-6)
