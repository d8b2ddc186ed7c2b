"""benchmark/scalars.py: the scalars of a run's segments as one CSV, the later value of a (tag, step) winning, on top
of a CSV of segments run elsewhere (--base), and a resumed segment dropping what earlier ones logged after its start."""

import csv
import json
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


def test_a_resumed_segment_drops_what_earlier_segments_logged_after_its_start(tmp_path):
    # base: segments elsewhere, to step 3; a: resumed there from a checkpoint at 2, checkpointed at 4, went on to 6 and
    # stopped; b: resumed from the checkpoint at 4 and logged at other steps (10 s of wall time apart), so a's 5 and 6
    # were discarded with the stop, not overwritten, as was the base's 3
    for segment, start, values in (("a", 2, {4: 2.0, 5: 3.0, 6: 4.0}), ("b", 4, {7: 30.0, 9: 40.0})):
        with SummaryWriter(str(tmp_path / segment)) as writer:
            for step, value in values.items():
                writer.add_scalar("losses/x", value, step)
        (tmp_path / segment / "summary.json").write_text(json.dumps({"start_step": start}))
    (tmp_path / "base.csv").write_text("tag,step,value\nlosses/x,1,0.5\nlosses/x,3,0.7\n")
    out = tmp_path / "out.csv"
    argv = [str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--base", str(tmp_path / "base.csv")]
    subprocess.run([sys.executable, SCALARS, *argv], check=True, capture_output=True)
    rows = {int(r["step"]): float(r["value"]) for r in csv.DictReader(open(out))}
    assert rows == {1: 0.5, 4: 2.0, 7: 30.0, 9: 40.0}


def test_a_mistyped_run_directory_or_base_is_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    cases = [(["runs/typo"], "error: 'runs/typo': no such run directory"),
             ([str(tmp_path / "run"), "--base", "gone.csv"], "error: --base 'gone.csv': no such file")]  # fmt: skip
    for argv, message in cases:
        out = subprocess.run([sys.executable, SCALARS, *argv, "--out", str(tmp_path / "out.csv")], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 1 and out.stderr.strip() == message
    assert not (tmp_path / "out.csv").exists()
