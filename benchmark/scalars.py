"""Every tensorboard scalar of one or more run directories (a run's resumed segments) as one CSV: tag, step, value.

    python benchmark/scalars.py runs/<run>[ runs/<resumed run> ...] --out scalars.csv [--base earlier.csv] [--upto N]

The CSV is what results/ keep of a run's curves (event files are not committed). Where segments overlap, the later
segment's value of a (tag, step) wins, and a segment that records its start (summary.json's start_step, as the
scripts write it) drops what earlier segments logged after that step: a resumed run redoes those steps. --base: a
CSV of the run's earlier segments (written by this script on another machine), which the event files override.
--upto: only steps up to N (a checkpoint's step: what a run resumed from it will log again is left out).
"""

import argparse
import csv
import glob
import json
import os

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def segment_start(run_dir: str) -> int | None:
    """The step a segment started from (its summary.json's start_step: 0, or the checkpoint it resumed), if known."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f).get("start_step")


def read_scalars(run_dirs: list[str], base: dict | None = None) -> dict[tuple[str, int], float]:
    """Every scalar of the segments, over `base` (the values of earlier segments). A resumed segment redoes the steps
    after the checkpoint it started from, so what earlier segments logged after that step was discarded with them:
    it is dropped, not only overwritten where both logged the same step."""
    values, started = dict(base or {}), set()
    # in the order written: an event file's name holds its start time (a fresh clone gives every file one mtime)
    files = sorted((f for d in run_dirs for f in glob.glob(os.path.join(d, "events.out.tfevents.*"))),
                   key=lambda f: float(os.path.basename(f).split(".")[3]))  # fmt: skip
    for path in files:
        run_dir = os.path.dirname(path)
        if run_dir not in started:
            started.add(run_dir)
            start = segment_start(run_dir)
            if start is not None:
                values = {key: v for key, v in values.items() if key[1] <= start}
        events = EventAccumulator(path, size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            for event in events.Scalars(tag):
                values[(tag, event.step)] = event.value
    return values


def read_csv(path: str) -> dict[tuple[str, int], float]:
    with open(path, newline="") as f:
        return {(row["tag"], int(row["step"])): float(row["value"]) for row in csv.DictReader(f)}


def write_csv(values: dict[tuple[str, int], float], path: str) -> None:
    """The scalars as this script's CSV: tag, step, value (6 significant digits), sorted by tag and step."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tag", "step", "value"])
        for (tag, step), value in sorted(values.items()):
            writer.writerow([tag, step, f"{value:.6g}"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (or event files' folders), oldest segment first")
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", help="CSV of earlier segments, overridden where the event files have a value")
    parser.add_argument("--upto", type=int, help="keep the values of steps <= UPTO only")
    cli = parser.parse_args()
    if missing := [d for d in cli.runs if not os.path.isdir(d)]:  # (a folder without event files is a segment that
        raise SystemExit(f"error: {missing[0]!r}: no such run directory")  # logged nothing, e.g. an unpacked one)
    if cli.base and not os.path.isfile(cli.base):
        raise SystemExit(f"error: --base {cli.base!r}: no such file")
    values = read_scalars(cli.runs, read_csv(cli.base) if cli.base else None)
    values = {key: v for key, v in values.items() if cli.upto is None or key[1] <= cli.upto}
    if not values:
        raise SystemExit(f"error: no tensorboard scalars under {', '.join(cli.runs)}")
    write_csv(values, cli.out)
    print(f"{cli.out}: {len(values):,} values, {len({t for t, _ in values})} tags")


if __name__ == "__main__":
    main()
