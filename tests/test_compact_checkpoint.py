"""benchmark/compact_checkpoint.py: a checkpoint packed without its frames unpacks to the same checkpoint and replay
memory, frames played again from the emulator included, and a run resumed from it goes on exactly as from the
original."""

import os

import numpy as np
import pytest
import torch

import rainbow_softmoe as rb
from benchmark import compact_checkpoint as cc

SMALL = dict(env_id="ALE/Breakout-v5", encoder="nature", num_experts=2, expert_width=32, buffer_size=3000,
             batch_size=8, log_every_seconds=1000.0, snapshot_every=0, eval_episodes=0, learning_starts=500,
             save_model=True, checkpoint_replay=True)  # fmt: skip


def run(preset, **kw):
    return rb.main(rb.preset_args(preset, **SMALL, **kw))


def replay_of(checkpoint: str) -> dict:
    ckpt = torch.load(checkpoint, weights_only=True)
    with np.load(os.path.join(os.path.dirname(checkpoint), ckpt["replay"])) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("preset", [pytest.param("drq-eps", marks=pytest.mark.slow), "full-rainbow"])
def test_an_unpacked_checkpoint_is_the_original_and_resumes_the_same(tmp_path, monkeypatch, preset):
    monkeypatch.chdir(tmp_path)
    first = run(preset, total_timesteps=400)["checkpoint"]
    second = run(preset, total_timesteps=500, resume=first)["checkpoint"]  # two segments: the emulator reset twice
    cc.pack(second, "packed")
    assert not any("frames" in name for name in np.load("packed/replay.npz").files)
    cc.unpack("packed", "restored/rainbow_softmoe.pt")
    original, restored = replay_of(second), replay_of("restored/rainbow_softmoe.pt")
    assert sorted(original) == sorted(restored)
    for name in original:
        np.testing.assert_array_equal(original[name], restored[name], err_msg=name)
    ckpt, back = (torch.load(f, map_location="cpu", weights_only=True) for f in (second, "restored/rainbow_softmoe.pt"))
    assert original["pointers"][1] > 500 and len(ckpt["episodes"]) >= 1  # no-op starts and reset steps are rows too
    assert back["segment_starts"][0] == 0 and len(back["segment_starts"]) == 2
    for key in ("q_net", "target_net"):
        assert all(torch.equal(v, back[key][k]) for k, v in ckpt[key].items())
    assert back["numpy_rng"] == ckpt["numpy_rng"] and torch.equal(back["torch_rng"], ckpt["torch_rng"])
    assert back["episodes"] == ckpt["episodes"] and back["updates"] == ckpt["updates"]
    a = run(preset, total_timesteps=530, resume=second)["checkpoint"]
    b = run(preset, total_timesteps=530, resume="restored/rainbow_softmoe.pt")["checkpoint"]
    cc.pack(b, "packed_again")  # the chain now runs through the unpacked checkpoint
    cc.unpack("packed_again", "restored_again/rainbow_softmoe.pt")
    again = torch.load("restored_again/rainbow_softmoe.pt", weights_only=True)
    assert again["segment_starts"] == [*back["segment_starts"], back["replay_rows"]]
    original, restored = replay_of(a), replay_of("restored_again/rainbow_softmoe.pt")
    assert all(np.array_equal(original[name], restored[name]) for name in original)
    a, b = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert all(torch.equal(v, b["q_net"][k]) for k, v in a["q_net"].items())
    assert a["episodes"] == b["episodes"]


def test_a_pack_that_the_emulator_does_not_play_again_is_a_one_line_error(tmp_path, monkeypatch):
    """An action changed in the packed memory changes the frames after it: unpack stops at the first row whose reward
    or flags differ, or at the frames' hash, and writes nothing; so does a replay.npz of another pack."""
    monkeypatch.chdir(tmp_path)
    cc.pack(run("drq-eps", total_timesteps=200)["checkpoint"], "packed")
    with np.load("packed/replay.npz") as data:
        arrays = {k: data[k] for k in data.files}
    row = int(np.flatnonzero(arrays["valid"][:, 0])[40])
    arrays["actions"][row] = (arrays["actions"][row] + 1) % 4
    np.savez_compressed("packed/replay.npz", **arrays)
    with pytest.raises(SystemExit, match=r"^error: (replay row [\d,]+ \(\w+\) differs|the frames played again differ)"):
        cc.unpack("packed", "restored/rainbow_softmoe.pt")
    arrays["packed_step"] = arrays["packed_step"] - 10
    np.savez_compressed("packed/replay.npz", **arrays)
    with pytest.raises(SystemExit, match="its state.pt and replay.npz come from different packs; pack again$"):
        cc.unpack("packed", "restored/rainbow_softmoe.pt")
    assert not os.path.exists("restored")


def test_unpack_never_overwrites_a_checkpoint_and_pack_never_overwrites_another_runs_pack(tmp_path):
    existing = tmp_path / "run" / "rainbow_softmoe.pt"
    existing.parent.mkdir()
    existing.write_bytes(b"a live run's checkpoint")
    with pytest.raises(SystemExit, match="exists; unpack to a new path"):
        cc.unpack(str(tmp_path / "packed"), str(existing))
    assert existing.read_bytes() == b"a live run's checkpoint"
    run = {"exp_name": "impala8_none_s1", "env_id": "ALE/Breakout-v5", "seed": 1}
    torch.save({"format": cc.FORMAT, "replay": "r.npz", "global_step": 900, "args": run}, tmp_path / "ckpt.pt")
    (tmp_path / "packed").mkdir()
    torch.save({"format": cc.FORMAT, "global_step": 500, "args": run | {"seed": 2}}, tmp_path / "packed" / cc.STATE)
    with pytest.raises(SystemExit, match=r"holds the pack of another run \(impala8_none_s1, ALE/Breakout-v5, 2\)"):
        cc.pack(str(tmp_path / "ckpt.pt"), str(tmp_path / "packed"))
