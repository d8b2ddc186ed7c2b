"""What a suite costs at the paper budget: every suite's dry run prints its task count and the compute it needs, and
each figure equals tasks x per-task budget / rate, recomputed here from the papers' budgets (not from suites.py's
cost code) and the measured rates, whose numbers must stand in the files they cite. And a launch that would run
nothing, feed every game one dataset, share a log or overwrite an evaluation, or ignore an option, is one line."""

import os
import re

import pytest

import suites

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SZ = 4_437e6 / (40 * 200_000)  # placements per SZ-Tetris episode: results/tetris_table1_paper, 4,437M over 40 x 200k
TEN = 32_178_835 / 52_397  # per 10x10 episode, the first 9-13k of each run: results/tetris_10x10_reduced/summary.json
PER_TASK = {  # each suite's per-task budgets at the paper budget, from the papers
    "moe-fig1": {50_000_000},  # 200M frames (Obando-Ceron et al. 2024, Fig. 1)
    **{s: {10_000_000} for s in suites.SUITES if s.startswith("moe-") and s != "moe-fig1"},  # 40M frames (App. A)
    "atari100k": {100_000},
    "cql-fig11": {200 * 62_500},  # 200 iterations of 62,500 gradient steps
    "tetris-table1": {40 * 200_000 * SZ, 5 * 200_000 * SZ},  # 4 x 10 shallow runs in one task; 5 runs per deep task
    "tetris-10x10": {5 * 400_000 * TEN},  # a lower bound: episodes lengthen
    "tetris-table3": {10 * 200_000 * SZ},
    "tetris-speed": {100},  # seconds
    "atari-table2": {200_000 * 4_500},  # at most: 18,000 frames per episode, an action every 4
    "atari-table3": {200_000 * 4_500},
    "atari-speed": {100},
}
GROUP = re.compile(r"^  (\d+) x (?:(<=|>=) )?([\d,]+) (agent steps|placements|gradient steps|s) \((.*?)\): (.*)$")
HOURS = re.compile(r"(?:(<=|>=) )?([\d,.]+) (GPU|core)-hours at ([\d,.]+)/s \[([\w-]+)\]")


def close(printed: str, expected: float) -> bool:
    """printed (with thousands separators) is expected rounded to its own number of decimals."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed.replace(",", "")) - expected) <= 0.5 * 10**-decimals + 1e-9


def dry_run(capsys, monkeypatch, *argv) -> str:
    """The output of `suites.py ARGV --dry-run` (the option goes before any --, which would pass it to the tasks)."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    monkeypatch.chdir(ROOT)
    assert suites.main([*argv[:split], "--dry-run", *argv[split:]]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("suite", suites.SUITES)
def test_paper_dry_run_prints_tasks_and_compute(suite, capsys, monkeypatch):
    out = dry_run(capsys, monkeypatch, suite, "--budget", "paper").splitlines()
    n_tasks = int(re.fullmatch(rf"{suite}: (\d+) tasks? at the paper budget", out[0]).group(1))
    assert n_tasks == sum(line.startswith("+ ") for line in out) > 0
    groups = [(m, line) for line in out if (m := GROUP.match(line))]
    assert sum(int(m.group(1)) for m, _ in groups) == n_tasks
    totals = {"GPU": 0.0, "core": 0.0}
    for m, line in groups:
        n, bound, per_task, unit = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        (budget,) = [b for b in PER_TASK[suite] if close(per_task, b)]
        assert bound == {"tetris-10x10": ">=", "atari-table2": "<=", "atari-table3": "<="}.get(suite), line
        if unit == "s":
            assert close(m.group(6).split(" h of wall time")[0], n * budget / 3600), line
            continue
        for hours in HOURS.finditer(m.group(6)):
            _, printed, device, rate, key = hours.groups()
            measured = suites.RATES[key]
            assert measured.device == device and measured.unit == unit and close(rate, measured.per_second), line
            assert close(printed, n * budget / measured.per_second / 3600), line
            totals[device] += n * budget / measured.per_second / 3600
            legend = f"  [{key}] {measured.per_second:,g} {unit}/s on one {device}: {measured.where}, "
            assert any(line.startswith(legend) for line in out), key
        devices = {h.group(3) for h in HOURS.finditer(m.group(6))}
        assert all(f"{d}-hours not measured" in m.group(6) for d in {"GPU", "core"} - devices), line
    (total,) = [line for line in out if line.startswith("  total: ")]
    assert total.startswith(f"  total: {n_tasks} task")
    for device, hours in totals.items():
        found = re.search(rf"([\d,.]+) {device}-hours", total)
        assert (found is not None) == (hours > 0), total
        if found:  # the sum of the rounded group figures, to the total's own rounding
            assert abs(float(found.group(1).replace(",", "")) - hours) <= max(0.5, 1e-3 * hours), total


def test_every_rate_stands_in_the_file_it_cites():
    for key, rate in suites.RATES.items():
        path = os.path.join(ROOT, rate.where)
        assert os.path.exists(path), f"{key}: {rate.where}"
        text = open(path, encoding="utf-8").read()
        assert f"{rate.per_second:,g}" in text or f"{rate.per_second:,.1f}" in text, key
    for length, where in suites.EPISODE_PLACEMENTS.values():
        assert os.path.exists(os.path.join(ROOT, where)) and length > 0


def test_flags_after_the_double_dash_pick_their_rates(capsys, monkeypatch):
    """`-- --cuda-graph` costs the tasks at the rates measured with CUDA graphs; a network variant of a timed
    configuration takes its rate marked stand-in; an untimed replay ratio stays not measured."""
    out = dry_run(capsys, monkeypatch, "atari100k", "--budget", "paper", "--games", "Pong", "--", "--cuda-graph")
    drq = [line for line in out.splitlines() if line.startswith("  5 x 100,000 agent steps (drq-eps")]
    assert len(drq) == 2 and all("[h200-drq-eps-impala-softmoe-graph]" in line for line in drq)
    assert "stand-in: only softmoe-e8 timed" in drq[0] and "stand-in" not in drq[1]  # none first, then softmoe-e8
    out = dry_run(capsys, monkeypatch, "moe-fig4-replay-ratio", "--budget", "paper", "--games", "Pong")
    for line in out.splitlines():
        if GROUP.match(line) and "full-rainbow" in line:
            assert ("[h100-rainbow-impala-softmoe]" in line) == ("replay ratio 0.25;" in line), line
    assert "with -- --cuda-graph: " in out and "[h100-rainbow-impala-softmoe-graph]" in out


def test_only_the_paper_budget_is_costed(capsys, monkeypatch):
    assert "compute at the paper budget" not in dry_run(capsys, monkeypatch, "tetris-table1", "--budget", "reduced")


@pytest.mark.parametrize(
    "suite, budget, game",
    [("atari-table2", "reduced", "Pong"), ("atari-table3", "paper", "Breakout"), ("tetris-table1", "paper", "Pong"),
     ("atari-table2", "smoke", "Asterix"), ("moe-fig1", "paper", "Alien"), ("atari100k", "paper", "Asteroids")],
)  # fmt: skip
def test_a_game_outside_the_suite_is_refused_naming_its_games(suite, budget, game, monkeypatch):
    """It would give no task, yet overwrite the suite's task list (or, with --slurm, build --array=0--1)."""
    monkeypatch.chdir(ROOT)  # main() changes to the repository; a dry run writes nothing
    elfwing = suite in suites.ELFWING_SUITES
    valid = {s.game for s in suites.elfwing_specs(suite, budget)} if elfwing else set(suites.suite_definition(suite)[0])
    with pytest.raises(SystemExit, match=f"error: game '{game}' is not in {suite}") as err:
        suites.main([suite, "--budget", budget, "--games", game, "--dry-run"])
    assert "\n" not in str(err.value) and set(str(err.value).split("(its games: ")[1][:-1].split()) == valid


def test_a_launch_of_no_task_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(suites, "ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(suites, "expand", lambda *a, **k: [])
    with pytest.raises(SystemExit, match="has no task"):
        suites.main(["tetris-table1"])
    assert not (tmp_path / "runs").exists()


def test_a_cql_suite_on_several_games_needs_game_in_its_dataset():
    with pytest.raises(SystemExit, match=r"needs \{game\} in --dataset"):
        suites.expand("cql-fig11", "smoke", games=["Pong", "Breakout"], dataset="data/one")
    tasks = suites.expand("cql-fig11", "smoke", games=["Pong", "Breakout"], dataset="data/{game}")
    datasets = {t.game: t.argv[t.argv.index("--dataset-dir") + 1] for t in tasks}
    assert datasets == {"Pong": "data/Pong", "Breakout": "data/Breakout"}
    assert suites.expand("cql-fig11", "smoke", games=["Pong"], dataset="data/one")  # one game, one dataset


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tetris-table1", "--dataset", "data"], "--dataset is for cql-fig11 only"),
        (["moe-fig1", "--partition", "gpu"], "--partition sets the SLURM job array: it needs --slurm"),
        (["moe-fig1", "--time", "1:00:00"], "--time sets the SLURM"),
        (["moe-fig1", "--gpus-per-task", "1"], "--gpus-per-task sets the SLURM"),
        (["moe-fig1", "--cpus-per-task", "1"], "--cpus-per-task sets the SLURM"),  # the default, given
        (["moe-fig1", "--slurm", "--jobs", "2"], "--jobs runs tasks on this machine"),
        (["moe-fig1", "--seeds", "1 2 1"], "--seeds lists 1 twice"),
        (["moe-fig1", "--games", "Pong Pong"], "--games lists Pong twice"),
    ],
)
def test_an_option_the_launch_would_ignore_is_refused(argv, message, monkeypatch):
    """Each would be dropped silently (or, for a seed or game given twice, make two tasks write one log)."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit, match=message) as err:
        suites.main([*argv, "--dry-run"])
    assert "\n" not in str(err.value)


def test_slurm_options_with_slurm_still_reach_the_job_script(capsys, monkeypatch):
    out = dry_run(capsys, monkeypatch, "tetris-table1", "--slurm", "--partition", "gpu", "--cpus-per-task", "4")
    assert "#SBATCH --partition=gpu" in out and "#SBATCH --cpus-per-task=4" in out
    assert "#SBATCH --cpus-per-task=1" in dry_run(capsys, monkeypatch, "tetris-table1", "--slurm")


def test_the_table3_evaluation_folder_names_its_budget():
    """A smoke run's evaluation must not land in (and be refused by, or replace) the reduced or paper one."""
    folders = {b: suites.expand("tetris-table3", b)[0].then.split("--out ")[1].split()[0] for b in suites.BUDGETS}
    assert folders == {b: f"runs/tetris-table3.dsilu.{b}.s1.eval" for b in suites.BUDGETS}


def test_tetris_seeds_closer_than_the_runs_per_seed_are_refused_as_they_would_share_networks():
    with pytest.raises(SystemExit, match="seeds closer than 10 share networks; use seeds 10 apart, e.g. 1 11"):
        suites.expand("tetris-table1", "reduced", seeds=[1, 2])
    assert len(suites.expand("tetris-table1", "reduced", seeds=[1, 11])) == 8  # 4 rows x 2 seeds
