"""results/reference_training/chase.py, the reading fixed before the chase's runs end: Soft MoE - baseline over each
replay's last 100 games, the four cases of the rule, and no final reading before all four runs complete at 100k."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                                "reference_training"))  # fmt: skip
import chase  # noqa: E402


def write_run(folder, episodes, step, complete, evaluation=None):
    """A run folder as rainbow_softmoe.py leaves it: episodes.csv (step at a game's end, return) and summary.json."""
    os.makedirs(folder)
    with open(os.path.join(folder, "episodes.csv"), "w") as f:
        f.write("global_step,return,length\n")
        f.writelines(f"{s},{r},100\n" for s, r in episodes)
    summary = {"global_step": step, "complete": complete, "code": {"commit": "137126d6fb48"}}
    if evaluation is not None:
        summary["evaluations"] = [{"global_step": 100_000, "mean_return": evaluation}]
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Point chase.py at empty committed and work folders; return a writer of one segment per (replay, moe)."""
    replays = {}
    for replay, (pattern, _, _) in chase.REPLAYS.items():
        replays[replay] = (pattern, str(tmp_path / replay / "committed"), str(tmp_path / replay / "work"))
    monkeypatch.setattr(chase, "REPLAYS", replays)

    def segment(replay, moe, episodes, step=100_000, complete=True, evaluation=None):
        pattern, _, work = replays[replay]
        folder = os.path.join(work, f"Breakout__{pattern.format(moe=moe)}__{moe}-nature__1__0")
        write_run(folder, episodes, step, complete, evaluation)

    return segment


def test_the_rule_names_the_replay_only_when_the_reference_replay_gives_plus_and_ours_minus():
    assert chase.rule({"reference": 0.5, "ours": -7.0}) == "the replay is named as the difference, at this seed"
    assert chase.rule({"reference": -0.5, "ours": -7.0}) == "the replay is cleared at this seed"
    assert chase.rule({"reference": -0.5, "ours": 1.0}).startswith("ours' own replay gives the reference's sign")
    assert chase.rule({"reference": 0.5, "ours": 1.0}).startswith("ours' own replay gives the reference's sign")
    assert chase.rule({"reference": 0.0, "ours": -1.0}) == "a gap of exactly 0: none of the rule's cases"
    assert chase.rule({"ours": -1.0}).startswith("no reading yet")


def test_the_gap_is_the_difference_of_the_last_100_games_by_100k(runs):
    # 150 baseline games scoring 1 then 2 (the last 100: 50 ones and 50 twos, mean 1.5); a game after 100k is left out
    baseline = [(600 * i, 1.0 if i <= 100 else 2.0) for i in range(1, 151)] + [(100_500, 50.0)]
    runs("ours", "none", baseline, evaluation=9.0)
    runs("ours", "softmoe", [(1_000 * i, 1.0) for i in range(1, 101)], evaluation=3.0)
    runs("reference", "none", [(2_000 * i, 2.0) for i in range(1, 51)])  # 50 games only: all count
    runs("reference", "softmoe", [(10_000, 0.0), (90_000, 3.0), (99_000, 4.0)])
    result = chase.look()
    assert result["steps"] == 100_000 and result["final"]
    assert result["soft_moe_minus_baseline_last_100"]["ours"] == pytest.approx(1.0 - 1.5)
    assert result["soft_moe_minus_baseline_last_100"]["reference"] == pytest.approx(7 / 3 - 2.0)
    assert result["runs"]["ours/baseline"]["curve"]["last_100_episodes"] == 100
    assert result["runs"]["ours/baseline"]["evaluation"] == 9.0
    # the games ending in (80,000, 100,000]: the baseline's twos at steps 600 x 134 ... 600 x 150 (17), not the one past
    assert result["runs"]["ours/baseline"]["last_20000_steps"] == {"mean": 2.0, "games": 17}
    assert result["runs"]["reference/softmoe"]["last_20000_steps"] == {"mean": 3.5, "games": 2}
    assert result["reading"] == "the replay is named as the difference, at this seed"


def test_a_run_in_progress_or_missing_makes_the_look_interim(runs):
    runs("ours", "none", [(5_000, 1.0), (30_000, 2.0)], step=40_000, complete=False)
    runs("ours", "softmoe", [(8_000, 0.0)], step=20_000, complete=False)
    result = chase.look()
    assert result["steps"] == 20_000 and not result["final"]  # the last step every started run has saved
    assert result["runs"]["reference/baseline"] is None
    assert result["runs"]["ours/baseline"]["curve"]["last_100_mean"] == 1.0  # the game at 30,000 is past S
    assert result["reading"] == "interim: no reading yet: both arms of both replays must have ended games"
    with pytest.raises(SystemExit, match="past step 20,000"):
        chase.look(upto=30_000)
