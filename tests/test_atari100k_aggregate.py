"""results/atari100k_26games/aggregate.py, the test fixed for §5.2's 26-game claim: the IQM is rliable's 25%-trimmed
mean, the bootstrap pairs each game's two arms, the probability of improvement counts ties as half, the verdict reads
the IQM difference's CI only at 26 games, and runs.csv takes finished runs only."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                                "atari100k_26games"))  # fmt: skip
import aggregate  # noqa: E402


def rows(baseline, softmoe, games=aggregate.GAMES_26, seed=1):
    """runs.csv rows of one seed: each game's human-normalised evaluation per arm."""
    out = []
    for game, b, s in zip(games, baseline, softmoe, strict=True):
        out += [{"game": game, "arm": "baseline", "seed": seed, "eval_human_normalized": float(b)},
                {"game": game, "arm": "softmoe", "seed": seed, "eval_human_normalized": float(s)}]  # fmt: skip
    return out


def test_iqm_is_the_mean_of_the_middle_half_as_rliable_trims():
    # 26 scores: trim int(0.25 * 26) = 6 from each end (scipy's trim_mean, which rliable calls), keep ranks 6..19
    x = np.random.default_rng(0).permutation(np.arange(26.0))
    assert aggregate.iqm(x) == pytest.approx(np.arange(6, 20).mean())
    # 8 scores: 2 from each end, whatever the order
    assert aggregate.iqm(np.array([100.0, -5, 3, 1, 2, 4, 0, 7])) == pytest.approx((1 + 2 + 3 + 4) / 4)


def test_probability_of_improvement_counts_ties_as_half():
    a, b = np.array([2.0, 1.0, 1.0, 0.0]), np.array([1.0, 1.0, 3.0, 0.0])
    assert aggregate.improvement(a, b) == pytest.approx((1 + 0.5 + 0 + 0.5) / 4)


def test_identical_arms_give_no_detectable_difference():
    scores = np.random.default_rng(1).lognormal(0, 1, 26)
    out = aggregate.aggregate(rows(scores, scores))
    for name in ("iqm", "median", "mean"):
        assert out[name]["difference"] == 0.0 and out[name]["difference_ci"] == [0.0, 0.0]
    assert out["probability_of_improvement"]["softmoe_over_baseline"] == 0.5
    assert out["verdict"].startswith("no detectable difference")


def test_bootstrap_pairs_each_games_two_arms():
    # Soft MoE = baseline + 0.1 on every game, scores spread over 0..10: only a bootstrap that resamples games with both
    # arms together gives the IQM difference the CI [0.1, 0.1]; resampling the arms apart would span several units
    baseline = np.random.default_rng(2).uniform(0, 10, 26)
    out = aggregate.aggregate(rows(baseline, baseline + 0.1))
    assert out["iqm"]["difference"] == pytest.approx(0.1)
    assert out["iqm"]["difference_ci"] == pytest.approx([0.1, 0.1])
    assert out["iqm"]["baseline_ci"][1] - out["iqm"]["baseline_ci"][0] > 1.0  # each arm's own CI is wide
    assert out["probability_of_improvement"] == {"softmoe_over_baseline": 1.0, "ci": [1.0, 1.0]}
    assert out["verdict"].startswith("Soft MoE above the baseline")
    assert aggregate.aggregate(rows(baseline + 0.1, baseline))["verdict"].startswith("Soft MoE below the baseline")


def test_the_verdict_waits_for_all_26_games_and_seed_1():
    baseline = np.arange(26.0)
    out = aggregate.aggregate(rows(baseline[:25], baseline[:25] + 1, games=aggregate.GAMES_26[:25]))
    assert out["games_complete"] == 25 and out["verdict"].startswith("incomplete: 25 of 26")
    assert aggregate.aggregate(rows(baseline, baseline + 1, seed=2))["verdict"].startswith("incomplete: 0 of 26")
    per_game = aggregate.aggregate(rows(baseline, baseline[::-1]))["per_game"]
    assert [g["sign"] for g in per_game] == [1] * 13 + [-1] * 13


def test_runs_reads_finished_runs_only(tmp_path, monkeypatch):
    summary = {"game": "Pong", "args": {"moe": "softmoe", "seed": 1}, "global_step": 100_000,
               "mean_return_last_100": -20.5, "eval_mean_return": -19.0, "eval_human_normalized_score": 0.05,
               "sps": 2.77, "code": {"commit": "32aa045f6a7e"}, "complete": True}  # fmt: skip
    for name, complete in (("der_Pong_softmoe_s1", True), ("der_Pong_none_s1", False)):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "summary.json").write_text(json.dumps(summary | {"complete": complete}))
    monkeypatch.setattr(aggregate, "HERE", str(tmp_path))
    (row,) = aggregate.runs()
    assert row == {"code": "ours", "game": "Pong", "arm": "softmoe", "seed": 1, "agent_steps": 100_000,
                   "train_return_last_100": -20.5, "eval_mean_return": -19.0, "eval_human_normalized": 0.05,
                   "der_2019": -19.3, "steps_per_second": 2.77, "commit": "32aa045"}  # fmt: skip
    assert set(row) == set(aggregate.COLUMNS)


def test_steps_per_second_spans_every_segment_of_a_run(tmp_path, monkeypatch):
    """A run resumed at 100k only to evaluate: its last segment trains 0 steps in 2,520 s."""
    summary = {"game": "Breakout", "args": {"moe": "softmoe", "seed": 1}, "global_step": 100_000,
               "mean_return_last_100": 1.85, "eval_mean_return": 9.21, "eval_human_normalized_score": 0.26,
               "sps": 0.0, "code": {"commit": "137126d6fb48"}, "complete": True}  # fmt: skip
    segments = {"a": {"start_step": 0, "global_step": 41_843, "wall_time": 6_632.0},
                "b": {"start_step": 41_843, "global_step": 100_000, "wall_time": 9_494.0},
                "c": {"start_step": 100_000, "global_step": 100_000, "wall_time": 2_520.0}}  # fmt: skip
    os.makedirs(tmp_path / "der_Breakout_softmoe_s1")
    (tmp_path / "der_Breakout_softmoe_s1" / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "der_Breakout_softmoe_s1" / "segments.json").write_text(json.dumps(segments))
    monkeypatch.setattr(aggregate, "HERE", str(tmp_path))
    (row,) = aggregate.runs()
    assert row["steps_per_second"] == round(100_000 / (6_632 + 9_494 + 2_520), 2) == 5.36
