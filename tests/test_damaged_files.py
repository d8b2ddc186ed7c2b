"""A damaged checkpoint, snapshot or pack (bytes flipped inside its tensor data, the zip's headers whole) is refused in
one line naming the file, by envs.damaged_member's CRC-32 check, in every tool that loads one. The five training
scripts' --resume is checked in their own test files, on checkpoints they wrote."""

import os
import sys

import numpy as np
import pytest
import torch

import compact_checkpoint
import moe_analysis
import replay_to_dataset
import tetris_eval
from damage import flip_bytes
from envs import damaged_member

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "results", "tetris_table1_paper"))
import milestone  # noqa: E402
import settle  # noqa: E402

CRC = r"is damaged \(.+ fails its CRC-32 check\); restore it from a copy"


def test_torch_load_takes_flipped_bytes_that_the_crc_check_names(tmp_path):
    weights = torch.randn(20_000)
    torch.save({"q_net": {"w": weights}}, tmp_path / "ok.pt")
    flipped = flip_bytes(tmp_path / "ok.pt", tmp_path / "flipped.pt")
    loaded = torch.load(flipped, weights_only=True)["q_net"]["w"]  # no error: the hazard the check exists for
    assert not torch.equal(loaded, weights)
    assert damaged_member(tmp_path / "ok.pt") is None
    assert damaged_member(flipped).endswith("/data/0")
    np.savez(tmp_path / "pack.npz", scores=np.arange(50_000.0))
    assert damaged_member(flip_bytes(tmp_path / "pack.npz", tmp_path / "bad.npz")) == "scores.npy"
    for name, data in (("empty.pt", b""), ("random.pt", os.urandom(4096))):  # not a zip: the loaders' own errors
        (tmp_path / name).write_bytes(data)
        assert damaged_member(tmp_path / name) is None
    assert damaged_member(tmp_path / "missing.pt") is None


def test_every_tool_refuses_a_damaged_file_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"format": "x", "w": torch.randn(20_000)}, tmp_path / "ok.pt")
    bad = flip_bytes(tmp_path / "ok.pt", tmp_path / "bad.pt")
    np.savez(tmp_path / "pack.npz", scores=np.arange(50_000.0))
    bad_pack = flip_bytes(tmp_path / "pack.npz", tmp_path / "bad_pack.npz")
    calls = [
        lambda: compact_checkpoint.load(bad),
        lambda: moe_analysis.check_snapshot(bad),
        lambda: tetris_eval.load(tetris_eval.Args(checkpoint=bad)),
        lambda: milestone.pack(bad, str(tmp_path / "out.npz")),
        lambda: milestone.unpack(bad_pack, str(tmp_path / "out.pt")),
        lambda: settle.blocks(bad_pack),
        lambda: settle.blocks(bad),
    ]
    for call in calls:
        with pytest.raises(SystemExit, match=CRC) as err:
            call()
        assert "\n" not in str(err.value)
    monkeypatch.setattr("sys.argv", ["replay_to_dataset.py", bad, "--out", str(tmp_path / "data")])
    with pytest.raises(SystemExit, match=CRC):
        replay_to_dataset.main()
    assert not (tmp_path / "data").exists() and not (tmp_path / "out.npz").exists()
