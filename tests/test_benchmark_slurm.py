"""benchmark.sh SUITE --slurm against a real SLURM (slurmctld + slurmd; docs/benchmark.md, "SLURM job arrays", sets
one up on a single machine): submit a smoke suite as one job array, wait for it, check every task's summary.json and
that the report lists them. Slow; skipped where sbatch is not on PATH."""

import json
import os
import shutil
import subprocess
import time

import pytest

import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = "moe-fig8-random-phi"  # 3 tasks at the smoke budget


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch is not on PATH: no SLURM client on this machine")
def test_slurm_job_array_runs_every_task(tmp_path):
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        pytest.skip("sbatch exists but no slurmctld answers (sinfo failed)")
    out = subprocess.run(["bash", "benchmark.sh", SUITE, "--budget", "smoke", "--slurm"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), out.stdout
    deadline = time.time() + 1800
    while time.time() < deadline:
        queue = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout
        if not queue.strip():
            break
        time.sleep(5)
    else:
        pytest.fail(f"job {job_id} still queued or running after 30 minutes")
    with open(os.path.join(ROOT, "runs", "suites", f"{SUITE}.json")) as f:
        manifest = json.load(f)
    assert manifest["job_id"] == job_id and len(manifest["tasks"]) == 3
    runs = report.find_summaries([os.path.join(ROOT, "runs")])
    for task in manifest["tasks"]:
        found = [s for s in runs if s["args"]["exp_name"] == task["exp_name"] and s["args"]["seed"] == task["seed"]
                 and s.get("game") == task["game"] and os.path.getmtime(s["_path"]) >= manifest["time"]]  # fmt: skip
        assert found, f"no summary.json for {task['exp_name']} (log: {task['log']})"
        assert found[0]["complete"], found[0]["_path"]
    assert report.main([SUITE, "--out", str(tmp_path), "--no-plots", "--reps", "100"]) == 0
    text = open(tmp_path / "report.md").read()
    assert f"job {job_id}" in text and "3 complete" in text
    for task in manifest["tasks"]:
        assert f"| {task['game']} | {task['variant']} | {task['seed']} | complete |" in text
