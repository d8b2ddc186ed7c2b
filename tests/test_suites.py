"""What a suite costs at the paper budget: every suite's dry run prints its task count and the compute it needs, and
each figure equals tasks x per-task budget / rate, recomputed here from the papers' budgets (not from suites.py's
cost code) and the measured rates, whose numbers must stand in the files they cite."""

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
