"""benchmark/sarsa_analysis.py: Table 3 (softmax against epsilon-greedy) and Fig. 7 (Q(s_t, a_t) against R_t) on a
checkpoint of algos/sarsa_lambda_silu_atari.py: the returns and value errors by hand, the selection rules, a run on a
small Breakout checkpoint, and the one-line errors."""

import json
import os
import sys

import numpy as np
import pytest
import torch

import sarsa_lambda_silu_atari as sarsa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import sarsa_analysis as analysis  # noqa: E402


def test_discounted_returns_and_value_errors_by_hand():
    np.testing.assert_allclose(analysis.discounted_returns(np.array([1.0, 0.0, 1.0]), 0.5), [1.25, 0.5, 1.0])
    diff, abs_diff = analysis.value_estimation_errors(np.array([1.25, 1.5, 0.0]), np.array([1.0, 0.0, 1.0]), 0.5)
    assert diff == pytest.approx(0.0) and abs_diff == pytest.approx(2 / 3)  # R = (1.25, 0.5, 1): diffs 0, 1, -1


def test_selection_rules_default_softmax_to_the_final_temperature():
    assert analysis.parse_selection("softmax", 0.0123) == ("softmax", 0.0123)
    assert analysis.parse_selection("softmax:0.5", 0.0123) == ("softmax", 0.5)
    assert analysis.parse_selection("epsilon:0.05", 0.0123) == ("epsilon", 0.05)
    for bad in ("greedy", "epsilon", "epsilon:x"):
        with pytest.raises(ValueError):
            analysis.parse_selection(bad, 1.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Two Breakout episodes on two environments (at most 100 agent steps each), saved."""
    root = tmp_path_factory.mktemp("checkpoint")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        summary = sarsa.main(sarsa.Args(env_id="ALE/Breakout-v5", max_episode_frames=400, total_episodes=2, num_envs=2,
                                        tau_k=0.01, save_model=True, log_every_seconds=1000.0))  # fmt: skip
    finally:
        os.chdir(cwd)
    return str(root / summary["checkpoint"])


def analyse(**kw):
    kw.setdefault("eval_episodes", 2)
    kw.setdefault("eval_selections", ("softmax", "epsilon:0", "epsilon:0.05"))
    return analysis.main(analysis.Args(**kw))


def test_table_3_and_fig_7_on_a_checkpoint_with_the_checkpoints_protocol_and_temperature(
    checkpoint, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    summary = analyse(checkpoint=checkpoint, num_envs=2)
    final_tau = sarsa.temperature(2, 0.5, 0.01)  # the checkpoint's tau_k, not the default
    assert summary["final_temperature"] == pytest.approx(final_tau)
    assert list(summary["eval"]) == [f"softmax:{final_tau:g}", "epsilon:0", "epsilon:0.05"]
    assert summary["args"]["max_episode_frames"] == 400 and summary["args"]["num_envs"] == 2
    for result in summary["eval"].values():
        assert result["episodes"] == 2 and 0 < result["mean_length"] <= 100
    assert summary["eval"]["epsilon:0"]["exploratory_actions_per_episode"] == 0  # greedy never explores
    assert summary["eval"]["epsilon:0.05"]["dqn_normalized"] == pytest.approx(
        (summary["eval"]["epsilon:0.05"]["mean_score"] - 1.7) / (401.2 - 1.7)
    )
    value = summary["value_analysis"]  # from the first rule's episodes
    assert value["episodes"] == 2 and value["plotted_episode"]["T"] <= 100
    run_dir = tmp_path / "runs" / summary["run_name"]
    for name in ("summary.json", "value_analysis.csv", "value_trajectory.csv", "value_analysis.png"):
        assert (run_dir / name).exists(), name
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["eval"] == summary["eval"] and saved["game"] == "Breakout" and "tau_k" in saved["args"]


def test_the_same_checkpoint_and_seed_give_the_same_numbers(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = (analyse(checkpoint=checkpoint, eval_selections=("softmax", "epsilon:0.5"), seed=7) for _ in range(2))
    assert a["eval"] == b["eval"] and a["value_analysis"] == b["value_analysis"]
    c = analyse(checkpoint=checkpoint, eval_selections=("softmax", "epsilon:0.5"), seed=8)
    assert c["eval"] != a["eval"]  # the seed sets the emulators' no-op starts and the action choices


def test_evaluation_does_not_change_the_checkpoint(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = torch.load(checkpoint, weights_only=True)["theta"]
    analyse(checkpoint=checkpoint, eval_selections=("epsilon:0.05",))
    assert torch.equal(torch.load(checkpoint, weights_only=True)["theta"], before)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(eval_selections=("greedy",)), "bad --eval-selections entry 'greedy'"),
        (dict(eval_selections=("epsilon:2",)), "epsilon must lie in [0, 1]"),
        (dict(eval_episodes=0), "--eval-episodes and --num-envs must be at least 1"),
        (dict(checkpoint="missing.pt"), "--checkpoint 'missing.pt': no such file"),
    ],
)
def test_bad_input_fails_with_one_line_before_anything_is_written(checkpoint, tmp_path, monkeypatch, kw, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        analyse(**{"checkpoint": checkpoint, **kw})
    assert str(err.value).startswith("error: ") and message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_file_that_is_not_a_checkpoint_fails_with_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit, match=r"^error: --checkpoint 'other.pt' is not a readable checkpoint"):
        analyse(checkpoint="other.pt")
