"""benchmark/tetris_eval.py: Table 3 and Fig. 6 from a td_lambda_tetris.py checkpoint (selection rules, which runs are
played, the value analysis, one-line errors)."""

import json
import os
import sys

import numpy as np
import pytest
import torch

import td_lambda_tetris as td

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark"))
import tetris_eval as ev  # noqa: E402


def train(**kw):
    return td.main(td.Args(log_every_seconds=1000.0, save_model=True, **kw))


def evaluate(checkpoint, **kw):
    return ev.main(ev.Args(checkpoint=checkpoint, **kw))


def test_epsilon_greedy_explores_uniformly_among_valid_placements_and_counts_non_greedy_actions():
    torch.manual_seed(0)
    n = 100_000
    values = torch.tensor([[0.1, 0.9, 0.3, 9.0]]).expand(n, 4)
    valid = torch.tensor([[True, True, True, False]]).expand(n, 4)
    greedy_only, explored = ev.select(values, None, valid, torch.rand(n, 5), "epsilon", 0.0)
    assert torch.all(greedy_only == 1) and not explored.any()
    action, explored = ev.select(values, None, valid, torch.rand(n, 5), "epsilon", 0.3)
    freq = torch.bincount(action, minlength=4).double() / n
    assert torch.allclose(freq, torch.tensor([0.1, 0.8, 0.1, 0.0], dtype=torch.float64), atol=0.01)
    assert abs(explored.double().mean().item() - 0.2) < 0.01  # a random pick equal to the greedy one is not exploratory
    action, explored = ev.select(values, torch.full((n,), 0.25), valid, torch.rand(n, 5), "softmax", 0.25)
    assert torch.equal(explored, action != 1)


def test_discounted_returns():
    r = np.array([1.0, 0.0, 2.0])
    assert np.allclose(ev.discounted_returns(r, 0.5), [1 + 0.25 * 2, 0.5 * 2, 2.0])


def test_every_rule_plays_its_episodes_and_the_first_rule_feeds_the_value_analysis(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trained = train(total_episodes=20, num_runs=2)
    out = evaluate(trained["checkpoint"], run="all", episodes=3, selections=("softmax", "epsilon:0.05"),
                   value_analysis_episodes=4, out=str(tmp_path / "eval"))  # fmt: skip
    assert out["eval"]["epsilon:0.05"]["episodes"] == 6 and out["value_analysis"]["episodes"] == 4
    final_tau = float(td.temperature(torch.tensor([20.0]), 0.5, 0.00025))
    assert list(out["eval"]) == [f"softmax:{final_tau:g}", "epsilon:0.05"]  # softmax at the final temperature
    for name in ("summary.json", "value_analysis.csv", "value_analysis.png"):
        assert (tmp_path / "eval" / name).exists()
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["eval_runs"] == [0, 1]


def test_one_activation_of_a_batched_checkpoint_and_the_best_run_are_evaluated_on_their_own_runs(tmp_path, monkeypatch):
    """Table 1's process saves 4 activations x 10 runs in one checkpoint; --activation relu plays rows 10-19 (here 2
    activations x 3 runs, relu = rows 3-5), --run best the one with the highest final mean, --run 2 that run."""
    monkeypatch.chdir(tmp_path)
    trained = train(total_episodes=15, num_runs=3, activation=("dsilu", "relu"), final_window=5)
    best = int(np.argmax(trained["per_activation"]["relu"]["final_score_per_run"]))
    greedy = dict(episodes=2, selections=("epsilon:0",), value_analysis_episodes=2)
    out = evaluate(trained["checkpoint"], activation="relu", run="best", **greedy)
    assert out["eval_runs"] == [best] and out["eval"]["epsilon:0"]["episodes"] == 2
    assert out["value_analysis"]["episodes"] == 2  # two complete episodes of that one run
    assert evaluate(trained["checkpoint"], activation="relu", run="2", **greedy)["eval_runs"] == [2]
    _, params, _, _ = ev.load(ev.Args(checkpoint=trained["checkpoint"], activation="relu"))
    full = torch.load(trained["checkpoint"], weights_only=True)["params"]["W1"]
    assert torch.equal(params["W1"], full[3:6])


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(selections=("greedy",)), "bad --selections"),
        (dict(selections=("epsilon:2",)), "epsilon must lie in"),
        (dict(run="7"), "--run must be"),
        (dict(activation="silu"), "pass --activation one of them"),
        (dict(checkpoint="missing.pt"), "is not a td_lambda_tetris checkpoint"),
        (dict(value_analysis_episodes=-1), "--value-analysis-episodes must be 0"),
        (dict(device="cuda"), "asked for CUDA but torch sees no GPU"),
    ],
)
def test_bad_input_is_one_line(tmp_path, monkeypatch, kw, message):
    monkeypatch.chdir(tmp_path)
    checkpoint = train(total_episodes=2, num_runs=2, activation=("dsilu", "relu"))["checkpoint"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # --device cuda on a machine without a GPU
    with pytest.raises(SystemExit, match=message) as err:
        evaluate(**{"checkpoint": checkpoint, "activation": "dsilu", **kw})
    assert "\n" not in str(err.value)


def test_an_out_folder_that_holds_an_evaluation_is_refused_before_any_work(tmp_path, monkeypatch):
    """A later run (a smoke one) into the folder of an earlier evaluation would replace its plots and summary."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match="already holds an evaluation") as err:  # before the checkpoint is read
        evaluate("missing.pt", out=str(tmp_path / "eval"))
    assert "\n" not in str(err.value) and (tmp_path / "eval" / "summary.json").read_text() == "{}"
    assert sorted(os.listdir(tmp_path / "eval")) == ["summary.json"]


def test_a_checkpoint_from_before_the_reward_timing_flag_is_evaluated_with_next(tmp_path, monkeypatch):
    """td_lambda_tetris.py trained with r(s_{t+1}) before --reward-timing existed; its load_checkpoint assumes 'next'
    for such checkpoints, and the value analysis must compute the rewards as they were trained."""
    monkeypatch.chdir(tmp_path)
    checkpoint = train(total_episodes=2, num_runs=1)["checkpoint"]
    ckpt = torch.load(checkpoint, weights_only=True)
    assert ckpt["args"]["reward_timing"] == "current"
    del ckpt["args"]["reward_timing"]
    torch.save(ckpt, tmp_path / "old.pt")
    assert ev.load(ev.Args(checkpoint=checkpoint))[0].reward_timing == "current"
    assert ev.load(ev.Args(checkpoint=str(tmp_path / "old.pt")))[0].reward_timing == "next"
