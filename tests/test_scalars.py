"""benchmark/scalars.py: the scalars of a run's segments as one CSV, the later value of a (tag, step) winning, on top
of a CSV of segments run elsewhere (--base)."""

import csv
import os
import subprocess
import sys

from torch.utils.tensorboard import SummaryWriter

SCALARS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark", "scalars.py")


def test_event_files_override_the_base_csv_later_segments_earlier_ones_and_upto_cuts_later_steps(tmp_path):
    for segment, values in (("a", {1: 1.0, 2: 2.0}), ("b", {2: 20.0, 3: 30.0})):
        with SummaryWriter(str(tmp_path / segment)) as writer:
            for step, value in values.items():
                writer.add_scalar("charts/x", value, step)
    (tmp_path / "base.csv").write_text("tag,step,value\ncharts/x,0,-1\ncharts/x,1,-10\nanalysis/y,5,0.5\n")
    out = tmp_path / "out.csv"
    subprocess.run([sys.executable, SCALARS, str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out),
                    "--base", str(tmp_path / "base.csv")], check=True, capture_output=True)  # fmt: skip
    rows = {(r["tag"], int(r["step"])): float(r["value"]) for r in csv.DictReader(open(out))}
    assert rows == {("charts/x", 0): -1.0, ("charts/x", 1): 1.0, ("charts/x", 2): 20.0, ("charts/x", 3): 30.0,
                    ("analysis/y", 5): 0.5}  # fmt: skip
    segments = [str(tmp_path / "a"), str(tmp_path / "b")]
    subprocess.run(
        [sys.executable, SCALARS, *segments, "--out", str(out), "--upto", "2"], check=True, capture_output=True
    )
    rows = {(r["tag"], int(r["step"])): float(r["value"]) for r in csv.DictReader(open(out))}
    assert rows == {("charts/x", 1): 1.0, ("charts/x", 2): 20.0}  # what a run resumed at step 2 logs again is left out


def test_a_mistyped_run_directory_or_base_is_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    cases = [(["runs/typo"], "error: 'runs/typo': no such run directory"),
             ([str(tmp_path / "run"), "--base", "gone.csv"], "error: --base 'gone.csv': no such file")]  # fmt: skip
    for argv, message in cases:
        out = subprocess.run([sys.executable, SCALARS, *argv, "--out", str(tmp_path / "out.csv")], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 1 and out.stderr.strip() == message
    assert not (tmp_path / "out.csv").exists()
