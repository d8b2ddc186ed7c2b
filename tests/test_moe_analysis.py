"""benchmark/moe_analysis.py: Fig. 10's statistics by hand, the NTK against per-sample gradients, and the analysis of
the snapshots a real run writes (the same numbers as on the run's networks at that step; snapshots leave the run
unchanged)."""

import glob
import math
import os
import re

import numpy as np
import pytest
import torch

import dqn_softmoe as dqn
from benchmark import moe_analysis as analysis


def qnet(num_actions, encoder="impala", moe="softmoe", num_experts=None, tokenization=None, **kw):
    """The script's QNetwork for these options (the reference's defaults for the rest, as main() fills them)."""
    args = dqn.fill_defaults(
        dqn.Args(encoder=encoder, moe=moe, num_experts=num_experts, tokenization=tokenization, **kw)
    )
    return dqn.build_network(args, num_actions)


def random_batch(size: int = 8, num_actions: int = 3) -> dict:
    return {
        "states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "next_states": {"obs": torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8)},
        "actions": torch.randint(0, num_actions, (size,)),
        "rewards": torch.randn(size),
        "terminals": (torch.rand(size) < 0.3).float(),
    }


def test_analysis_metrics_on_hand_made_inputs():
    hidden = torch.tensor([[1.0, 0.0, 2.0, 0.0], [3.0, 0.0, 1.0, 0.0]])  # units 1 and 3 never fire
    assert analysis.dormant_fraction(hidden) == 0.5
    moe_hidden = torch.zeros(2, 3, 4, 5)
    moe_hidden[:, 1, :, 2] = 1.0  # unit 2 fires in one expert: alive once averaged over experts and slots
    assert analysis.dormant_fraction(moe_hidden) == pytest.approx(0.8)
    assert analysis.srank(torch.eye(6), 0.01) == 6
    assert analysis.srank(torch.diag(torch.tensor([100.0, 0.5, 0.1])), 0.01) == 1  # 100 / 100.6 >= 0.99
    assert analysis.srank(torch.diag(torch.tensor([100.0, 2.0, 0.1])), 0.01) == 2  # 100 / 102.1 < 0.99 <= 102 / 102.1
    assert analysis.threshold_rank(torch.diag(torch.tensor([100.0, 2.0, 0.5])), 0.01) == 2
    features = torch.tensor([[1.0, 0.0], [3.0, 2.0]])  # variances (1, 1)
    assert analysis.feature_norm(features) == pytest.approx(math.sqrt(2))


def test_routing_statistics_are_1_for_average_pooling_and_0_for_one_token_per_slot():
    B, m, n, p, d = 2, 4, 2, 2, 3
    tokens = torch.randn(B, m, d)
    uniform = torch.full((B, m, n, p), 1.0 / m), torch.full((B, m, n, p), 1.0 / (n * p))
    same_output = tokens.mean(1, keepdim=True).expand(B, m, d)  # what uniform routing gives every position
    aux = {"dispatch": uniform[0], "combine": uniform[1], "tokens": tokens, "head_input": same_output.flatten(1)}
    out = analysis.routing_statistics(aux)
    assert out["routing_dispatch_entropy"] == pytest.approx(1.0) and out["routing_combine_entropy"] == pytest.approx(
        1.0
    )
    assert out["token_diversity_out"] == pytest.approx(0.0, abs=1e-7)
    one_hot = torch.eye(m).view(1, m, n, p).expand(B, m, n, p)  # slot j reads token j only, token j reads slot j only
    aux = {"dispatch": one_hot, "combine": one_hot, "tokens": tokens, "head_input": tokens.flatten(1)}
    out = analysis.routing_statistics(aux)
    assert out["routing_dispatch_entropy"] == 0.0 and out["routing_combine_entropy"] == 0.0
    # diversity by hand: sum_d Var_m(x) / mean_m |x_m|^2 for each sample, averaged over the batch
    by_hand = np.mean([t.var(0, unbiased=False).sum().item() / (t**2).sum(1).mean().item() for t in tokens])
    assert out["token_diversity_in"] == pytest.approx(by_hand, rel=1e-5) == out["token_diversity_out"]


def test_soft_moe_starts_as_average_pooling_on_the_nature_cnn():
    """Phi's lecun_normal init against the encoder's small tokens gives logits of ~0.01: at initialisation every slot
    averages all 121 tokens (the routing statistics' reason to exist; see the README's Atari 100k results)."""
    torch.manual_seed(3)
    net = qnet(4, "nature", moe="softmoe", num_experts=4)
    _, aux = net({"obs": torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)}, return_aux=True)
    out = analysis.routing_statistics({k: v.detach() for k, v in aux.items()})
    assert out["routing_dispatch_entropy"] > 0.999 and out["routing_combine_entropy"] > 0.999
    assert out["token_diversity_out"] < 1e-3 * out["token_diversity_in"]


def test_empirical_ntk_is_the_gram_matrix_of_per_sample_gradients_in_any_number_of_passes():
    torch.manual_seed(8)
    net = qnet(3, "nature", moe="softmoe", num_experts=2, tokenization="perfeat", expert_width=8)
    states, actions, targets = (
        torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8),
        torch.tensor([0, 1, 2, 0]),
        torch.randn(4),
    )
    params = list(net.parameters())

    def per_sample_loss(i):
        return (targets[i] - net({"obs": states[i : i + 1]})[0, actions[i]]) ** 2

    one_pass = analysis.empirical_ntk(per_sample_loss, params, 4)
    many_passes = analysis.empirical_ntk(per_sample_loss, params, 4, memory_bytes=4 * 4 * 30_000)
    torch.testing.assert_close(one_pass, many_passes, rtol=1e-5, atol=1e-6 * float(one_pass.abs().max()))
    grads = torch.autograd.grad(per_sample_loss(1), params, allow_unused=True)
    norm2 = sum(float((g**2).sum()) for g in grads if g is not None)
    assert one_pass[1, 1].item() == pytest.approx(norm2, rel=1e-4)
    assert torch.allclose(one_pass, one_pass.T) and torch.linalg.eigvalsh(one_pass).min() > -1e-6 * one_pass.max()


def test_network_analysis_uses_the_training_loss_and_names_what_it_measures():
    torch.manual_seed(10)
    args = dqn.fill_defaults(dqn.Args(encoder="nature", num_experts=2, expert_width=8, tokenization="perfeat"))
    q_net, target_net = dqn.build_network(args, 3), dqn.build_network(args, 3)
    batch = random_batch(6)
    out = analysis.network_analysis(q_net, target_net, batch, args, dqn.dqn_loss)
    loss, metrics = dqn.dqn_loss(q_net, target_net, batch, args)
    assert out["td_loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    head_input, hidden = metrics["aux"]["head_input"].detach(), metrics["aux"]["hidden"].detach()
    assert head_input.shape == (6, 64 * 121) and hidden.shape == (6, 2, 32, 8)
    assert out["srank_head_input"] == analysis.srank(head_input) and out["srank_expert_hidden"] == analysis.srank(
        hidden.reshape(6, -1)
    )
    assert out["feature_norm_head_input"] == pytest.approx(analysis.feature_norm(head_input))
    assert out["feature_norm_expert_hidden"] == pytest.approx(analysis.feature_norm(hidden.flatten(1, -2)))
    assert out["routing_dispatch_entropy"] == pytest.approx(
        analysis.routing_statistics(metrics["aux"])["routing_dispatch_entropy"]
    )
    base = dqn.fill_defaults(dqn.Args(encoder="nature", moe="none"))
    out = analysis.network_analysis(dqn.build_network(base, 3), dqn.build_network(base, 3), batch, base, dqn.dqn_loss)
    assert "srank_head_input" in out and "srank_expert_hidden" not in out  # the dense layer is the head's input


def run(tmp_path, monkeypatch, **kw):
    monkeypatch.chdir(tmp_path)
    kw = dict(env_id="ALE/Breakout-v5", buffer_size=2000, log_every_seconds=1000.0, total_timesteps=300,
              learning_starts=200, save_model=True) | kw  # fmt: skip
    summary = dqn.main(dqn.Args(**kw))
    return summary, torch.load(summary["checkpoint"], weights_only=True)


def test_a_run_ending_on_a_multiple_of_snapshot_every_snapshots_its_final_network(tmp_path, monkeypatch):
    kw = dict(encoder="nature", num_experts=2, expert_width=16, snapshot_every=150)
    summary, ckpt = run(tmp_path, monkeypatch, total_timesteps=300, **kw)
    run_dir = os.path.dirname(summary["checkpoint"])
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "snapshots", "*.pt")))
    assert names == ["dqn_softmoe_201.pt", "dqn_softmoe_300.pt"]  # the loop ends at 300 before its learning step
    snap = torch.load(os.path.join(run_dir, "snapshots", names[-1]), weights_only=True)
    assert all(torch.equal(snap["q_net"][k], ckpt["q_net"][k]) for k in ckpt["q_net"])


@pytest.mark.parametrize("moe", ["softmoe", "top1"])
def test_a_snapshot_gives_the_statistics_of_the_runs_networks_at_that_step(tmp_path, monkeypatch, moe):
    """The run's last snapshot (step 300) comes after that step's updates and none follow it before the run ends at
    301: the snapshot's analysis equals that of the final checkpoint's networks on the snapshot's transitions."""
    kw = dict(encoder="nature", moe=moe, num_experts=2, expert_width=16, tokenization="perfeat", snapshot_every=100)
    summary, ckpt = run(tmp_path, monkeypatch, total_timesteps=301, **kw)
    run_dir = os.path.dirname(summary["checkpoint"])
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "snapshots", "*.pt")))
    assert names == ["dqn_softmoe_201.pt", "dqn_softmoe_300.pt"]  # learning starts after step 200
    snap = torch.load(os.path.join(run_dir, "snapshots", names[-1]), weights_only=True)
    assert snap["script"] == "dqn_softmoe" and snap["global_step"] == 300 and snap["args"]["moe"] == moe
    assert all(torch.equal(snap["q_net"][k], ckpt["q_net"][k]) for k in ckpt["q_net"])
    assert snap["probe"]["states"]["obs"].shape == (32, 4, 84, 84)
    out = analysis.analyse_snapshot(os.path.join(run_dir, "snapshots", names[-1]))
    args = dqn.fill_defaults(dqn.Args(**kw))
    nets = [dqn.build_network(args, 4).to(memory_format=torch.channels_last) for _ in range(2)]
    nets[0].load_state_dict(ckpt["q_net"])
    nets[1].load_state_dict(ckpt["target_net"])
    nets[1].requires_grad_(False)
    [net.eval() for net in nets]
    batch = {k: v for k, v in snap["probe"].items()}
    torch.set_rng_state(snap["torch_rng"])
    assert out == {"global_step": 300} | analysis.network_analysis(*nets, batch, args, dqn.dqn_loss)
    for key in ("dormant_percentage", "srank_expert_hidden", "entk_srank_0.01", "expert_load_max"):
        assert math.isfinite(out[key]), key
    assert ("routing_dispatch_entropy" in out) == (moe == "softmoe") and ("dropped_token_fraction" in out) == (
        moe == "top1"
    )
    monkeypatch.setattr("sys.argv", ["moe_analysis.py", run_dir])
    analysis.main()
    with open(os.path.join(run_dir, "analysis.csv")) as f:
        rows = f.read().splitlines()
    assert rows[0].startswith("global_step,") and [r.split(",")[0] for r in rows[1:]] == ["201", "300"]


def test_snapshots_leave_the_training_run_unchanged(tmp_path, monkeypatch):
    kw = dict(encoder="nature", moe="top1", num_experts=2, expert_width=16, load_balance_coef=1.0)  # draws noise
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain, plain_ckpt = run(tmp_path / "a", monkeypatch, snapshot_every=0, **kw)
    snapped, snapped_ckpt = run(tmp_path / "b", monkeypatch, snapshot_every=50, **kw)
    assert glob.glob(os.path.join(os.path.dirname(snapped["checkpoint"]), "snapshots", "*.pt"))
    assert plain["updates"] == snapped["updates"] > 0 and plain_ckpt["episodes"] == snapped_ckpt["episodes"]
    assert all(torch.equal(plain_ckpt["q_net"][k], snapped_ckpt["q_net"][k]) for k in plain_ckpt["q_net"])
    assert torch.equal(plain_ckpt["torch_rng"], snapped_ckpt["torch_rng"])


def test_bad_input_is_one_line_before_any_analysis(tmp_path, monkeypatch):
    snapshots = tmp_path / "run" / "snapshots"
    snapshots.mkdir(parents=True)
    torch.save({"format": "dqn_softmoe/2", "q_net": {}}, tmp_path / "dqn_softmoe.pt")
    (snapshots / "dqn_softmoe_100.pt").write_bytes(b"a snapshot cut short")
    cases = [
        ([str(tmp_path / "dqn_softmoe.pt")], "is not a snapshot (a checkpoint?"),
        ([str(tmp_path / "run")], "dqn_softmoe_100.pt' is not a readable snapshot"),
        ([str(tmp_path / "run"), "--ntk-memory-mb", "0"], "--ntk-memory-mb must be at least 1"),
    ]
    for argv, message in cases:
        monkeypatch.setattr("sys.argv", ["moe_analysis.py", *argv])
        with pytest.raises(SystemExit, match=re.escape(message)):
            analysis.main()
    (snapshots / "copy of it.pt").write_bytes(b"")
    monkeypatch.setattr("sys.argv", ["moe_analysis.py", str(tmp_path / "run")])
    with pytest.raises(SystemExit, match="is not named <script>_<step>.pt"):
        analysis.main()
    assert not (tmp_path / "run" / "analysis.csv").exists()
