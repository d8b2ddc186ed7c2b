"""report.py and suites.py on hand-made summary.json and table1.json files: the tables, rliable's IQM against a hand
computation, the paper's number beside ours, Table 1 from settle.py's table1.json ahead of reduced runs, superseded
folders left out, no interval for too few runs, comparisons that never mix budgets, protocols, agents or folders, and
the one-line errors on bad input."""

import json
import os

import numpy as np
import pytest

import report
import suites


def write_run(root, name, summary, episodes=None):
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f)
    if episodes is not None:
        with open(os.path.join(d, "episodes.csv"), "w") as f:
            f.write("global_step,return,length\n" + "".join(f"{s},{r},10\n" for s, r in episodes))


def dqn_summary(exp, game, seed, score, moe="softmoe"):
    args = {"exp_name": exp, "seed": seed, "env_id": f"ALE/{game}-v5", "replay_ratio": 0.25, "moe": moe,
            "encoder": "nature", "num_experts": 8, "width_multiplier": 1, "total_timesteps": 1000}  # fmt: skip
    return {"args": args, "game": game, "complete": True, "global_step": 1000, "human_normalized_score": score}


@pytest.fixture
def moe_runs(tmp_path):
    """moe-fig7-cnn, variant dqn-softmoe-e8: 3 games x 4 seeds with the scores 0..11; dqn-none: 3 games x 4 seeds."""
    root = str(tmp_path / "runs")
    k = 0
    for game in ("Pong", "Breakout", "Boxing"):
        for seed in (1, 2, 3, 4):
            curve = [(100 * i, float(i + seed)) for i in range(1, 6)]
            write_run(
                root, f"{game}_soft_{seed}", dqn_summary("moe-fig7-cnn.dqn-softmoe-e8", game, seed, float(k)), curve
            )
            write_run(
                root, f"{game}_none_{seed}", dqn_summary("moe-fig7-cnn.dqn-none", game, seed, 0.1 * k, "none"), curve
            )
            k += 1
    return root


def test_iqm_matches_hand_computation(moe_runs, tmp_path):
    runs = report.find_summaries([moe_runs])
    assert len(runs) == 24
    text = "\n".join(report.moe_tables(runs, str(tmp_path / "out"), reps=200, plots=False))
    # 12 scores 0..11: the IQM drops the lowest and highest 3 and averages 3..8 = 5.5
    row = next(line for line in text.splitlines() if line.startswith("| dqn-softmoe-e8 "))
    assert "| 5.500 |" in row and "| 3×4 |" in row
    row = next(line for line in text.splitlines() if line.startswith("| dqn-none "))
    assert "| 0.550 |" in row
    lo, hi = (float(x) for x in row.split("[")[1].split("]")[0].split(","))
    assert lo <= 0.55 <= hi
    assert "Obando-Ceron et al. 2024, Fig. 7" in text  # the paper's source beside ours


def test_report_writes_markdown_and_plots(moe_runs, tmp_path):
    out = str(tmp_path / "out")
    assert report.main([moe_runs, "--out", out, "--reps", "100"]) == 0
    md = open(os.path.join(out, "report.md")).read()
    assert "moe-fig7-cnn" in md
    for png in ("moe_iqm.png", "moe_curves.png", "moe_profiles.png"):
        assert os.path.getsize(os.path.join(out, png)) > 1000


def test_elfwing_tables_put_the_paper_beside_ours(tmp_path):
    root = str(tmp_path / "runs")
    sarsa = {"args": {"exp_name": "result", "seed": 1, "env_id": "ALE/Boxing-v5", "tau_k": 0.0005, "activations": "x"},
             "game": "Boxing", "episodes": 500, "final_mean_score": 20.0, "best_mean_score": 40.0, "random_score": 0.1,
             "dqn_score": 71.8, "complete": True}  # fmt: skip
    write_run(root, "boxing1", sarsa)
    write_run(root, "boxing2", sarsa | {"args": sarsa["args"] | {"seed": 2}, "final_mean_score": 30.0})
    tetris = {"args": {"exp_name": "t1", "seed": 1, "env_id": "envs/SZTetris-v0", "network": "shallow",
                       "activation": ["dsilu"], "holes_scale": 33.0, "total_episodes": 1000},
              "final_score_per_run": [200.0, 220.0], "final_score_sd_episodes": 70.0, "final_score_best_run": 220.0,
              "final_score_best_run_sd_episodes": 60.0, "episodes_per_run": [1000, 1000], "complete": True}  # fmt: skip
    write_run(root, "tetris", tetris)
    runs = report.find_summaries([root])
    t2 = report.elfwing_table2(runs)
    row = next(line for line in t2.splitlines() if line.startswith("| Boxing"))
    # mean of the two runs' final means, the paper's 36 and 92 beside, DQN-normalised (25 - 0.1) / (71.8 - 0.1)
    assert "| 25.0 | 36 | 40.0 | 92 |" in row and f"{100 * 24.9 / 71.7:.0f}%" in row and "| 2 / 2 |" in row
    assert "218% / 78%" in t2
    t1 = report.elfwing_table1(runs)
    row = next(line for line in t1.splitlines() if line.startswith("| shallow dsilu"))
    assert "210.0 ± 70.0" in row and "263 ± 80" in row and "220.0 ± 60.0" in row and "1,000 / 1,000 / 200,000" in row


def table1_json(runs):
    """A table1.json in settle.py's schema (results/tetris_table1_paper/settle.py), `runs` runs per activation."""
    acts = {}
    for i, (act, mean, paper) in enumerate((("dsilu", 250.0, 263), ("sigmoid", 225.0, 232), ("silu", 212.0, 214),
                                            ("relu", 200.0, 191))):  # fmt: skip
        acts[act] = dict(runs=runs, mean=mean, median=mean - 1, sd_over_runs=30.0 + i, ci95=[mean - 10, mean + 10],
                         sd_episodes=75.0, best_run=mean + 60, paper_mean=paper, paper_sd=70, paper_best=300,
                         run_means=[mean] * runs)  # fmt: skip
    tests = [dict(a="dsilu", b="relu", difference=50.0, welch_z=6.1, permutation_p=1e-5, holm_p=5e-5,
                  verdict="settled: dsilu > relu (the paper's order)"),
             dict(a="sigmoid", b="silu", difference=13.0, welch_z=1.6, permutation_p=0.11, holm_p=0.44,
                  verdict=f"not settled at {runs} runs")]  # fmt: skip
    return dict(at_episode=200_000, sources=["state.npz: network inits 1-30"], activations=acts, tests=tests,
                alpha=0.05, resamples=10_000, permutations=100_000)  # fmt: skip


def test_table1_leads_with_the_settled_result_and_leaves_out_superseded_runs(tmp_path):
    """table1.json's full-budget rows and tests come first, with the run count read from the file; runs of a folder
    whose README says it is superseded are named at the end, not tabled, and runs of table1.json's own folder are
    counted under it; other reduced runs follow Table 1."""
    root = tmp_path / "results"
    (root / "paper").mkdir(parents=True)
    with open(root / "paper" / "table1.json", "w") as f:
        json.dump(table1_json(30), f)
    tetris = {"args": {"exp_name": "t1", "seed": 1, "env_id": "envs/SZTetris-v0", "network": "shallow",
                       "activation": ["dsilu"], "holes_scale": 33.0},
              "final_score_per_run": [100.0, 120.0], "final_score_sd_episodes": 50.0, "final_score_best_run": 120.0,
              "final_score_best_run_sd_episodes": 40.0, "episodes_per_run": [3000, 3000], "complete": True}  # fmt: skip
    write_run(str(root / "reduced"), "run", tetris | {"args": tetris["args"] | {"exp_name": "old_reduced"}})
    (root / "reduced" / "README.md").write_text("# Reduced\n\nSuperseded by [paper](../paper/README.md).\n")
    write_run(str(root / "check"), "run", tetris | {"args": tetris["args"] | {"exp_name": "timing_check"}})
    (root / "paper" / "README.md").write_text("# Table 1 at the paper's budget\n")
    write_run(str(root / "paper" / "runs"), "half", tetris | {"args": tetris["args"] | {"exp_name": "runs11_20"}})
    (root / "check" / "README.md").write_text("# A check at 3,000 episodes\n")
    out = str(tmp_path / "out")
    assert report.main([str(root), "--out", out, "--no-plots"]) == 0
    md = open(os.path.join(out, "report.md")).read()
    head = "### Elfwing et al. Table 1: stochastic SZ-Tetris, shallow networks, 30 runs per activation at 200,000"
    assert head in md and md.index(head) < md.index("### Other runs of Table 1's rows")
    row = next(line for line in md.splitlines() if line.startswith("| shallow dsilu | 30 |"))
    assert "**250.0** (240.0–260.0)" in row and "263 ± 70" in row
    assert "| dsilu – relu | +50.0 | 6.10 |" in md and "settled: dsilu > relu (the paper's order)" in md
    assert "not settled at 30 runs" in md and "(1 of 2 settled)" in md
    assert "timing_check" in md.split("### Other runs")[1]  # a reduced run that nothing supersedes: after Table 1
    assert "runs11_20" not in md and "(1 summary.json under " in md  # a run of the result: counted, not tabled
    assert "old_reduced" not in md  # superseded: left out of the tables ...
    assert "reduced (1 summaries): Superseded by paper." in md.split("### Left out: superseded")[1]  # ... and named
    with open(os.path.join(root, "paper", "table1.json"), "w") as f:
        json.dump(table1_json(10), f)  # the run count comes from the file
    assert report.main([str(root), "--out", out, "--no-plots", "--include-superseded"]) == 0
    md = open(os.path.join(out, "report.md")).read()
    assert "10 runs per activation at 200,000 episodes" in md and "old_reduced" in md


def drq_summary(exp, seed, train, evaluation, moe="softmoe", encoder="impala", steps=100_000, eval_returns=None):
    """A rainbow_softmoe.py --preset drq-eps summary on Breakout (random 1.7, human 30.5)."""
    args = {"preset": "drq-eps", "exp_name": exp, "seed": seed, "env_id": "ALE/Breakout-v5", "protocol": "atari100k",
            "total_timesteps": 100_000, "encoder": encoder, "moe": moe, "num_experts": 8, "eval_episodes": 100,
            "replay_ratio": 1.0}  # fmt: skip
    hns = lambda x: (x - 1.7) / 28.8  # noqa: E731
    s = {"args": args, "game": "Breakout", "complete": steps == 100_000, "global_step": steps,
         "mean_return_last_100": train, "human_normalized_score": hns(train)}  # fmt: skip
    if evaluation is not None:
        returns = eval_returns or [evaluation] * 90 + [evaluation + 10] * 10
        mean = float(np.mean(returns))
        s["evaluations"] = [{"global_step": steps, "episodes": len(returns), "returns": returns, "mean_return": mean,
                             "human_normalized_score": hns(mean)}]  # fmt: skip
    return s


def test_a_two_seed_pair_has_no_interval_and_is_scored_on_training_when_its_evaluation_is_one_game(tmp_path):
    """The Impala pair's shape: 1 game x 2 seeds per arm, evaluations that repeat one return: the IQM without a CI,
    games x seeds written, the measure the training return, the evaluation beside it; a third seed still running is
    not scored."""
    root = str(tmp_path / "freeze")
    for seed, (soft, base) in enumerate(((35.2, 16.8), (26.9, 15.0)), start=1):
        write_run(root, f"soft_s{seed}", drq_summary(f"soft_s{seed}", seed, soft, 2 * soft))
        write_run(root, f"none_s{seed}", drq_summary(f"none_s{seed}", seed, base, base + 4, moe="none"))
    write_run(root, "soft_s3", drq_summary("soft_s3", 3, 5.0, None, steps=3589))
    out = str(tmp_path / "out")
    assert report.main([root, "--out", out, "--reps", "100"]) == 0
    md = open(os.path.join(out, "report.md")).read()
    assert "Scope: 1 of the paper's 26 games (Breakout), 2 of its 5 seeds" in md
    assert "mean return of the last 100 training episodes" in md and "about one trajectory per seed" in md
    row = next(line for line in md.splitlines() if line.startswith("| Soft MoE, 8 experts | "))
    iqm = np.mean([(35.2 - 1.7) / 28.8, (26.9 - 1.7) / 28.8])
    assert f"| {iqm:.3f} | – (2 runs) | 1×2 |" in row
    row = next(line for line in md.splitlines() if line.startswith("| Soft MoE, 8 experts | Breakout |"))
    assert "35.2 (s1), 26.9 (s2)" in row and "| 71.4, 54.8 |" in row  # training per seed; evaluation beside
    assert "Soft MoE, 8 experts Breakout seed 3 (incomplete: 3,589 of 100,000 agent steps)" in md
    assert os.path.getsize(os.path.join(out, "moe_iqm.png")) > 1000
    # with evaluations that vary (no return in 3/4 of the episodes) and 5 runs per arm: the evaluation, with a CI
    root = str(tmp_path / "varied")
    for seed in range(1, 6):
        for moe in ("softmoe", "none"):
            ev = [float(seed + i % 7) for i in range(100)]  # its most common return: 15 of 100 episodes
            write_run(root, f"{moe}{seed}", drq_summary(f"{moe}{seed}", seed, 10.0 + seed, 0.0, moe, eval_returns=ev))
    (c,) = report.comparisons(report.find_summaries([root]))
    report.score_comparison(c, reps=100)
    assert c["measure"] == "evaluation" and all(lo is not None for _, lo, _ in c["est"].values())


def test_an_experiment_that_fixed_its_measure_is_scored_by_it_with_the_other_measure_beside(tmp_path):
    """A folder whose aggregate.json fixes "evaluation" (as atari100k_26games' test does) is scored on the evaluation
    even where each evaluation repeats one game, with the training return beside it; without that file the same runs
    fall to the training return; a damaged aggregate.json, or one naming another measure, stops the report in one
    line."""
    root = tmp_path / "fixed"
    for seed in (1, 2):
        write_run(str(root), f"soft_s{seed}", drq_summary(f"soft_s{seed}", seed, 3.0 + seed, 10.0 * seed))
        write_run(str(root), f"none_s{seed}", drq_summary(f"none_s{seed}", seed, 5.0 + seed, 20.0 * seed, "none"))
    (root / "README.md").write_text("# An experiment with a fixed test\n")
    (c,) = report.comparisons(report.find_summaries([str(root)]))
    assert report.choose_measure(c)[0] == "training"  # every evaluation repeats one return in 90% of its episodes
    (root / "aggregate.json").write_text(json.dumps({"measure": "evaluation", "verdict": "incomplete"}))
    report.score_comparison(c, reps=100)
    assert c["measure"] == "evaluation" and "test fixed" in c["why"] and "in 4 of 4 runs" in c["why"]
    iqm = np.mean([(x - 1.7) / 28.8 for x in (11.0, 21.0)])  # the mean of each 90 + 10 evaluation: 10 + 1, 20 + 1
    assert c["est"]["Soft MoE, 8 experts"][0] == pytest.approx(iqm)
    table = report.per_game(c)
    assert "training per seed (last 100 episodes, or all if fewer)" in table
    row = next(line for line in table.splitlines() if line.startswith("| baseline | Breakout |"))
    assert "21.0 (s1), 41.0 (s2)" in row and "| 6.0, 7.0 |" in row  # evaluation scored; training beside
    (root / "aggregate.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"^error: .*aggregate.json is not a readable aggregate.json"):
        report.choose_measure(c)
    (root / "aggregate.json").write_text(json.dumps({"measure": "eval"}))
    with pytest.raises(SystemExit, match=r"names the measure 'eval'; it must be \"evaluation\" or \"training\""):
        report.choose_measure(c)


def test_runs_of_other_budgets_protocols_agents_or_folders_never_share_a_comparison(tmp_path):
    root = str(tmp_path / "runs")
    for seed in (1, 2):
        write_run(root, f"a{seed}", dqn_summary("result", "Pong", seed, 0.1))
        write_run(root, f"b{seed}", dqn_summary("result", "Pong", seed, 0.2, moe="none"))  # same exp_name, other net
        long = dqn_summary("result", "Pong", seed, 0.3)
        long["args"] = long["args"] | {"total_timesteps": 2000, "exp_name": "long"}
        write_run(root, f"c{seed}", long)
        nature = dqn_summary("result", "Pong", seed, 0.4)
        nature["args"] = nature["args"] | {"protocol": "nature", "exp_name": "nature"}
        write_run(root, f"d{seed}", nature)
        write_run(root, f"e{seed}", drq_summary(f"drq{seed}", seed, 10.0, None))
        write_run(str(tmp_path / "runs" / "other_study"), f"f{seed}", dqn_summary("other", "Pong", seed, 0.5))
        (tmp_path / "runs" / "other_study" / "README.md").write_text("# Another experiment\n")
        write_run(root, f"g{seed}", dqn_summary("boxing", "Boxing", seed, 0.6))
    cs = report.comparisons(report.find_summaries([root]))
    keys = [(c["origin"], c["agent"], c["protocol"], c["budget"], c["games"]) for c in cs]
    assert len(keys) == len(set(keys)) == 6  # 1,000 vs 2,000 steps, nature protocol, DrQ, other folder, Boxing
    for c in cs:
        rs = [r for vrs in c["variants"].values() for r in vrs]
        assert len({(report.budget_asked(r), report.protocol_of(r), report.agent_of(r)) for r in rs}) == 1
        assert len({report.experiment_dir(r) for r in rs}) == 1
        assert all({report.game_of(r) for r in vrs} == set(c["games"]) for vrs in c["variants"].values())
    (pair,) = [c for c in cs if c["budget"] == (1000, "agent steps") and c["protocol"] == "dopamine protocol"
               and c["games"] == ("Pong",) and "other_study" not in c["origin"]]  # fmt: skip
    assert sorted(pair["variants"]) == ["Soft MoE, 8 experts", "baseline"]  # one exp_name, two networks: both kept
    assert all(len(v) == 2 for v in pair["variants"].values())


def test_paper_numbers_have_sources():
    for key, entry in report.PAPER.items():
        if not key.startswith("_"):
            assert "source" in entry or all("source" in v for v in entry.values()), key
    assert len(report.PAPER["drq_eps_atari100k"]["games"]) == 26
    assert set(report.PAPER["drq_eps_atari100k"]["games"]) == set(suites.GAMES_26)


def test_suite_status_lists_finished_failed_and_missing(moe_runs, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    # the fixture's runs ask 1,000 agent steps: the tasks too (the last --total-timesteps counts)
    tasks = suites.expand(
        "moe-fig7-cnn", "smoke", seeds=[1], games=["Pong", "Qbert"], extra=["--total-timesteps", "1000"]
    )
    os.makedirs(tmp_path / "runs" / "suites")
    with open(tmp_path / "runs" / "suites" / "moe-fig7-cnn.json", "w") as f:
        json.dump({"budget": "smoke", "how": "test", "tasks": [vars(t) | {"exp_name": t.exp_name} for t in tasks]}, f)
    failed = next(t for t in tasks if t.game == "Qbert")
    os.makedirs(tmp_path / os.path.dirname(failed.log), exist_ok=True)
    with open(tmp_path / failed.log, "w") as f:
        f.write("Traceback\nValueError: boom\n")
    text = report.task_status("moe-fig7-cnn", report.find_summaries([moe_runs]))
    assert "| Pong | dqn-softmoe-e8 | 1 | complete |" in text
    assert f"| Qbert | {failed.variant} | 1 | failed | ValueError: boom |" in text
    assert "missing" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no-such-suite"], "neither a suite"),
        (["EMPTY"], "nothing to report"),
        (["EMPTY", "--reps", "0"], "--reps must be at least 1, got 0"),
        (["EMPTY", "--reps", "-5"], "--reps must be at least 1, got -5"),
    ],
)
def test_report_bad_input(argv, message, tmp_path):
    argv = [str(tmp_path) if a == "EMPTY" else a for a in argv]
    with pytest.raises(SystemExit, match=message):
        report.main(argv + ["--out", str(tmp_path / "out")])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["moe-fig99"], "unknown suite 'moe-fig99'"),
        (["moe-fig1", "--budget", "huge"], "unknown budget 'huge'"),
        (["moe-fig1", "--games", "Pong Tetris"], "unknown game 'Tetris'"),
        (["moe-fig1", "--seeds", "one"], "--seeds takes integers"),
    ],
)
def test_suites_bad_input(argv, message):
    with pytest.raises(SystemExit, match=message):
        suites.main(argv)


def test_slurm_without_sbatch_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SystemExit, match="--slurm needs sbatch on PATH"):
        suites.main(["moe-fig1", "--budget", "smoke", "--slurm"])


def test_suites_expand_every_figure():
    for name in suites.SUITES:
        tasks = suites.expand(name, "paper")
        assert tasks and len({(t.game, t.variant, t.seed) for t in tasks}) == len(tasks)
        assert all(t.exp_name.startswith(name + ".") and "--exp-name" in t.argv for t in tasks)
    fig1 = suites.expand("moe-fig1", "paper")
    assert len(fig1) == 20 * 16 * 5  # 20 games x (DQN, Rainbow) x (1, 2, 4, 8 experts + widths x1..x8) x 5 seeds
    assert len(suites.expand("atari100k", "reduced", seeds=[1], games=["Pong"])) == 4
    assert np.all([t.game == "Breakout" for t in suites.expand("moe-fig1", "smoke")])


def test_suites_take_options_before_the_double_dash(capsys, monkeypatch):
    """`SUITE --budget paper --dry-run -- --device cuda`: the options parse and the flags after -- reach every task."""
    monkeypatch.chdir(suites.ROOT)  # main() changes to the repository root; the fixture restores the directory after
    assert (
        suites.main(["atari100k", "--budget", "paper", "--games", "Pong", "--dry-run", "--", "--device", "cuda"]) == 0
    )
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("+ ")]
    assert len(commands) == 4 * 5  # 4 variants x 5 seeds at the paper budget, one game
    assert all("--device cuda) >" in line for line in commands)  # the last flags, before the log redirect


def test_reduced_atari100k_runs_the_der_gin_network():
    """The reduced budget is the README's CPU network: Nature CNN, and 4 experts for Soft MoE (DER.gin)."""
    for t in suites.expand("atari100k", "reduced", seeds=[1], games=["Pong"]):
        assert t.argv[t.argv.index("--encoder") + 1] == "nature"
        moe = t.argv[t.argv.index("--moe") + 1]
        assert ("--num-experts" in t.argv) == (moe != "none")
        if moe != "none":
            assert t.argv[t.argv.index("--num-experts") + 1] == "4"
    assert all("--num-experts" not in t.argv for t in suites.expand("atari100k", "paper", games=["Pong"]))


def test_elfwing_suites_expand_at_every_budget_with_the_papers_episodes():
    for name in suites.ELFWING_SUITES:
        for budget in suites.BUDGETS:
            tasks = suites.expand(name, budget)
            assert tasks and all(t.exp_name.startswith(name + ".") and "--exp-name" in t.argv for t in tasks)
    (shallow, *deep) = suites.expand("tetris-table1", "paper")
    assert shallow.argv[shallow.argv.index("--total-episodes") + 1] == "200000" and len(deep) == 3
    assert all(d.argv[d.argv.index("--num-runs") + 1] == "5" for d in deep)
    assert len(suites.expand("atari-table2", "paper")) == 12 * 2  # 12 games, 2 runs each
    (ten,) = suites.expand("tetris-10x10", "paper")
    assert ten.argv[ten.argv.index("--total-episodes") + 1] == "400000"


def test_a_table3_task_evaluates_the_checkpoint_its_own_training_wrote(tmp_path):
    """The follow-up command finds the newest run directory of the task's game, experiment and seed."""
    (task,) = suites.expand("tetris-table3", "smoke", seeds=[3])
    assert "benchmark/tetris_eval.py --checkpoint" in task.then and "--run best" in task.then
    import subprocess

    runs = tmp_path / "runs"
    exp = "SZTetris-v0__tetris-table3.dsilu__shallow-dsilu"
    for name in (f"{exp}__3__100", f"{exp}__3__200", f"{exp}__30__300", "SZTetris-v0__other__shallow-dsilu__3__400"):
        (runs / name).mkdir(parents=True)
        os.utime(runs / name, (int(name.split("__")[-1]),) * 2)
    found = task.then.split("--checkpoint ")[1].split(" --run")[0]
    out = subprocess.run(f"echo {found}", shell=True, cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert out == f"runs/{exp}__3__200/td_lambda_tetris.pt"


def test_slurm_dry_run_prints_the_job_script_it_would_submit(capsys, monkeypatch):
    monkeypatch.chdir(suites.ROOT)
    assert suites.main(["atari-table2", "--budget", "paper", "--dry-run", "--slurm", "--time", "2-00:00:00"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n+ ") == 24 and "#SBATCH --array=0-23" in out and "#SBATCH --time=2-00:00:00" in out
    assert 'eval "$line"' in out and not os.path.exists(
        os.path.join(suites.ROOT, "runs", "slurm", "atari-table2-STAMP")
    )


def test_one_name_two_configurations_are_two_variants(tmp_path):
    """Runs that differ in an argument the variant's name does not show (here the replay ratio) are not pooled."""
    root = str(tmp_path / "runs")
    for seed in (1, 2):
        write_run(root, f"a{seed}", dqn_summary("x", "Pong", seed, 0.1))
        other = dqn_summary("y", "Pong", seed, 0.2)
        other["args"] = other["args"] | {"replay_ratio": 1.0}
        write_run(root, f"b{seed}", other)
    (c,) = report.comparisons(report.find_summaries([root]))
    assert sorted(c["variants"]) == [
        "Soft MoE, 8 experts (replay_ratio=0.25)",
        "Soft MoE, 8 experts (replay_ratio=1.0)",
    ]


def tetris_summary(exp, finals, episodes, total, complete, seed=1, checkpoint=None, resume=None):
    """A td_lambda_tetris.py summary of shallow dSiLU runs."""
    args = {"exp_name": exp, "seed": seed, "env_id": "envs/SZTetris-v0", "network": "shallow",
            "activation": ["dsilu"], "holes_scale": 33.0, "total_episodes": total, "resume": resume}  # fmt: skip
    s = {"args": args, "final_score_per_run": finals, "final_score_sd_episodes": 50.0, "complete": complete,
         "final_score_best_run": max(finals), "episodes_per_run": [episodes] * len(finals)}  # fmt: skip
    return s | ({"checkpoint": checkpoint} if checkpoint else {})


def test_table1_counts_a_resumed_run_once_and_gives_each_budget_its_row(tmp_path):
    """A resume writes a new run folder: only its last segment counts. An incomplete run beside a complete one of the
    same row is left out and said so; a run of another budget is another row."""
    root = str(tmp_path / "runs")
    first = "runs/SZTetris-v0__t1__shallow-dsilu__1__100/td_lambda_tetris.pt"
    write_run(root, "seg1", tetris_summary("t1", [100.0, 120.0], 1000, 2000, False, checkpoint=first))
    second = "runs/SZTetris-v0__t1__shallow-dsilu__1__200/td_lambda_tetris.pt"
    write_run(root, "seg2", tetris_summary("t1", [200.0, 220.0], 2000, 2000, True, checkpoint=second, resume=first))
    write_run(root, "stopped", tetris_summary("t1", [50.0, 60.0], 700, 2000, False, seed=2))
    write_run(root, "short", tetris_summary("t1", [80.0, 90.0], 500, 500, True))
    t1 = report.elfwing_table1(report.find_summaries([root]))
    rows = [line for line in t1.splitlines() if line.startswith("| shallow dsilu | t1 |")]
    assert len(rows) == 2
    assert "| 85.0 ± 50.0 |" in rows[0] and "| 500 / 500 / 200,000 | 2 / 10 | yes |" in rows[0]
    assert "| 210.0 ± 50.0 |" in rows[1] and "| 2,000 / 2,000 / 200,000 | 2 / 10 |" in rows[1]
    assert rows[1].endswith("| yes (1 incomplete summary.json left out) |")


def test_table2_counts_a_resumed_run_once_splits_budgets_and_says_what_is_incomplete(tmp_path):
    """A segment resumed under another name counts once, under its first name; an evaluation of a checkpoint
    (sarsa_analysis.py) supersedes nothing; the mean / median line says how many of its games are incomplete."""
    root = str(tmp_path / "runs")
    args = {"exp_name": "a", "seed": 1, "env_id": "ALE/Boxing-v5", "tau_k": 0.0005, "activations": "silu-dsilu",
            "total_episodes": 200_000}  # fmt: skip
    sarsa = {"args": args, "game": "Boxing", "episodes": 500, "final_mean_score": 10.0, "best_mean_score": 12.0,
             "random_score": 0.0, "dqn_score": 100.0, "complete": False}  # fmt: skip
    first = "runs/Boxing__a__silu-dsilu__1__100/sarsa_lambda_silu_atari.pt"
    write_run(root, "seg1", sarsa | {"checkpoint": first})
    second = "runs/Boxing__a_seg2__silu-dsilu__1__200/sarsa_lambda_silu_atari.pt"
    seg2 = sarsa | {"args": args | {"exp_name": "a_seg2", "resume": "/elsewhere/" + first}, "episodes": 900,
                    "final_mean_score": 20.0, "checkpoint": second}  # fmt: skip
    write_run(root, "seg2", seg2)
    evaluation = sarsa | {"args": args | {"resume": second}, "eval": {"softmax": {"mean_score": 5.0}}}
    write_run(root, "eval", evaluation)
    write_run(root, "short", sarsa | {"args": args | {"total_episodes": 2000}, "episodes": 2000,
                                      "final_mean_score": 30.0, "complete": True})  # fmt: skip
    t2 = report.elfwing_table2(report.find_summaries([root]))
    rows = [line for line in t2.splitlines() if line.startswith("| Boxing |")]
    assert len(rows) == 2
    assert rows[0].startswith("| Boxing | a | 30.0 |") and rows[0].endswith("| 2,000 / 2,000 / 200,000 | 1 / 2 | yes |")
    assert rows[1].startswith("| Boxing | a (resumed as a_seg2) | 20.0 |")
    assert rows[1].endswith("| 900 / 200,000 / 200,000 | 1 / 2 | no |")
    assert "| a, 200,000 episodes asked | 1 | no (1 of 1 games incomplete) | 20% / 20% |" in t2
    assert "| a, 2,000 episodes asked | 1 | yes | 30% / 30% |" in t2


def test_two_configurations_under_one_name_and_seed_stay_apart_and_a_resume_counts_once(tmp_path):
    """Runs of one experiment name and seed that differ in the learning rate are two variants, not one run's
    segments; a segment that another run resumed (under another name) is not scored beside it."""
    root = str(tmp_path / "runs")
    for seed in (1, 2):
        for lr in (1e-3, 1e-4):
            s = dqn_summary("x", "Pong", seed, lr)
            write_run(root, f"s{seed}_{lr}", s | {"args": s["args"] | {"learning_rate": lr}})
    first = "runs/Pong__x__softmoe-nature__3__100/dqn_softmoe.pt"
    s = dqn_summary("x", "Pong", 3, 0.5)
    write_run(root, "seg1", s | {"args": s["args"] | {"learning_rate": 1e-3}, "checkpoint": first, "complete": False,
                                 "global_step": 500})  # fmt: skip
    args = s["args"] | {"learning_rate": 1e-3, "exp_name": "x_resumed", "resume": "/elsewhere/" + first}
    write_run(root, "seg2", s | {"args": args, "human_normalized_score": 0.7})
    (c,) = report.comparisons(report.find_summaries([root]))
    variants = {name: sorted(report.score_of(r, "training")[0] for r in rs) for name, rs in c["variants"].items()}
    assert variants == {
        "Soft MoE, 8 experts (learning_rate=0.0001)": [1e-4, 1e-4],
        "Soft MoE, 8 experts (learning_rate=0.001)": [1e-3, 1e-3, 0.7],
    }


def cql_summary(seed, checkpoints, score):
    args = {"exp_name": "cql", "seed": seed, "env_id": "ALE/Breakout-v5", "dataset_dir": "data", "agent": "cql",
            "moe": "none", "encoder": "nature", "num_iterations": 5, "steps_per_iteration": 1000, "data_percent": 100,
            "checkpoints": checkpoints}  # fmt: skip
    return {"args": args, "game": "Breakout", "complete": True, "updates": 5000, "eval_human_normalized_score": score}


def test_cql_runs_on_other_dataset_files_are_other_variants(tmp_path):
    root = str(tmp_path / "runs")
    for seed in (1, 2):
        write_run(root, f"a{seed}", cql_summary(seed, "0,1", 0.1))
        write_run(root, f"b{seed}", cql_summary(seed, "40-49", 0.2))
    (c,) = report.comparisons(report.find_summaries([root]))
    assert sorted(c["variants"]) == ['baseline (checkpoints="0,1")', 'baseline (checkpoints="40-49")']


def test_unreadable_files_are_named_in_the_report(tmp_path):
    root = tmp_path / "results"
    write_run(str(root), "good", dqn_summary("x", "Pong", 1, 0.1))
    write_run(str(root), "cut", {})
    (root / "cut" / "summary.json").write_text('{"args": {"exp_name": "x", ')
    (root / "paper").mkdir()
    (root / "paper" / "table1.json").write_text('{"activations": ')
    out = str(tmp_path / "out")
    assert report.main([str(root), "--out", out, "--no-plots"]) == 0
    md = open(os.path.join(out, "report.md")).read()
    for path in (root / "cut" / "summary.json", root / "paper" / "table1.json"):
        assert f"skipped (unreadable): {path} (" in md
    with pytest.raises(SystemExit, match="nothing to report: .* 1 unreadable, e.g. .*cut/summary.json"):
        report.main([str(root / "cut"), "--out", out])


def test_suite_status_takes_neither_an_evaluation_nor_a_run_of_another_budget_for_a_task(tmp_path, monkeypatch):
    """sarsa_analysis.py's summary carries the training's experiment name and its own --seed; a run of the reduced
    budget is not the smoke task's run, however new."""
    monkeypatch.setattr(report, "ROOT", str(tmp_path))
    (task,) = suites.expand("atari-table3", "smoke", seeds=[1])
    os.makedirs(tmp_path / "runs" / "suites")
    with open(tmp_path / "runs" / "suites" / "atari-table3.json", "w") as f:
        json.dump({"budget": "smoke", "how": "test", "tasks": [vars(task) | {"exp_name": task.exp_name}]}, f)
    args = {"exp_name": task.exp_name, "seed": 1, "env_id": "ALE/Breakout-v5", "tau_k": 0.0005,
            "activations": "silu-dsilu", "total_episodes": 2}  # fmt: skip
    root = str(tmp_path / "runs")
    write_run(root, "eval", {"args": args, "game": "Breakout", "complete": True, "eval": {}, "final_mean_score": 1.0})
    reduced = {"args": args | {"total_episodes": 20_000}, "game": "Breakout", "complete": True}
    write_run(root, "reduced", reduced)
    text = report.task_status("atari-table3", report.find_summaries([root]))
    assert "| Breakout | silu-dsilu | 1 | missing |" in text
    write_run(root, "smoke", {"args": args, "game": "Breakout", "complete": True})
    text = report.task_status("atari-table3", report.find_summaries([root]))
    assert "| Breakout | silu-dsilu | 1 | complete | runs/smoke |" in text


def test_a_checkout_inside_a_results_folder_is_not_read(tmp_path):
    """A results queue runs its code from git worktrees under its work/ folder; each is a copy of the repository,
    results included, and the report must read the experiment's own runs once, not the copies'."""
    root = str(tmp_path / "results" / "experiment")
    write_run(root, "run_s1", dqn_summary("x.dqn-softmoe-e8", "Pong", 1, 0.5))
    copy = os.path.join(root, "work", "code-abc123")
    write_run(os.path.join(copy, "results", "experiment"), "run_s1", dqn_summary("x.dqn-softmoe-e8", "Pong", 1, 0.5))
    with open(os.path.join(copy, "results", "experiment", "table1.json"), "w") as f:
        json.dump(table1_json(10), f)
    assert len(report.find_summaries([str(tmp_path)])) == 2  # a plain folder: both read
    with open(os.path.join(copy, ".git"), "w") as f:
        f.write("gitdir: /elsewhere/.git/worktrees/code-abc123\n")  # what `git worktree add` writes
    (run,) = report.find_summaries([str(tmp_path)])
    assert run["_path"] == os.path.join(root, "run_s1", "summary.json")
    assert report.find_table1([str(tmp_path)]) == []
