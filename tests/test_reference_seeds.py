"""The reading of results/reference_training/seeds.py: the reference's and ours' Soft MoE - baseline at seeds 1-3."""

import importlib.util
import os
import sys

import pytest

pytest.importorskip("matplotlib")
HERE = os.path.join(os.path.dirname(__file__), "..", "results", "reference_training", "seeds.py")
spec = importlib.util.spec_from_file_location("reference_seeds", HERE)
seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seeds)


def test_the_codes_differ_only_if_every_reference_seed_is_positive_and_every_ours_negative():
    differ = {"dopamine": {1: 0.52, 2: 0.1, 3: 3.0}, "ours": {1: -2.92, 2: -0.01, 3: -5.0}}
    assert seeds.rule(differ).startswith("the codes differ")
    for code, seed, gap in (("dopamine", 2, -0.1), ("ours", 3, 0.4), ("dopamine", 3, 0.0)):
        mixed = {c: dict(g) for c, g in differ.items()}
        mixed[code][seed] = gap
        assert seeds.rule(mixed) == "3 seeds do not separate the two codes' gaps on Breakout"


def test_no_reading_before_every_seed_of_both_codes_has_a_gap():
    assert seeds.rule({"dopamine": {1: 0.52, 2: 1.0, 3: 1.0}, "ours": {1: -2.92, 2: -1.0}}).startswith("no reading")


def test_the_design_gives_at_best_a_tenth_with_seed_1_known():
    """Under the null the six gaps (the reference's seeds 1-3, ours' 1-3) are exchangeable: of the orders in which
    the reference's seed 1 is above ours' seed 1, as it is, a tenth put every reference gap above every ours'."""
    from itertools import permutations

    known = complete = 0
    for rank in permutations(range(6)):  # rank[0:3] the reference's seeds 1-3, rank[3:6] ours'
        if rank[0] > rank[3]:
            known += 1
            complete += min(rank[:3]) > max(rank[3:])
    assert complete / known == pytest.approx(0.1)


def test_keep_waits_for_the_evaluation_then_adds_the_row_beside_seed_1s(tmp_path, monkeypatch):
    monkeypatch.setattr(seeds, "HERE", str(tmp_path))
    monkeypatch.setattr(sys.modules["compare"], "HERE", str(tmp_path))  # write_runs' runs.csv
    work = tmp_path / "work" / "dopamine_Breakout_softmoe_s2"
    (work / "checkpoints").mkdir(parents=True)
    log = [
        "INFO:absl:Starting iteration 0",
        "INFO:absl:Steps executed: 500 Episode length: 500 Return: 1.0",
        "INFO:absl:Starting iteration 49",
        "INFO:absl:Steps executed: 1500 Episode length: 1500 Return: 4.0",
    ]
    (work / "train_log.txt").write_text("\n".join(log) + "\n")
    header = "code,game,arm,seed,agent_steps,train_return_last_100,eval_mean_return,steps_per_second,commit\n"
    (tmp_path / "runs.csv").write_text(header + "dopamine,Breakout,softmoe,1,100000,2.75,2.98,4.3,5873f54+d099b35\n")
    assert seeds.keep("softmoe", 2) is None  # no evaluation at 100k yet
    (work / "train_log.txt").write_text("\n".join(log + ["INFO:absl:Average undiscounted return per evaluation "
                                                         "episode: 3.5"]) + "\n")  # fmt: skip
    assert seeds.keep("softmoe", 2) == str(tmp_path / "seeds" / "dopamine_Breakout_softmoe_s2.json")
    rows = (tmp_path / "runs.csv").read_text().splitlines()
    assert rows[1] == "dopamine,Breakout,softmoe,1,100000,2.75,2.98,4.3,5873f54+d099b35"
    assert rows[2].startswith("dopamine,Breakout,softmoe,2,100000,2.5,3.5,,5873f54+")
    assert seeds.reference_run("softmoe", 2)["episodes"] == [[500, 1.0], [99_500, 4.0]]
