"""Did a change of the scripts change what they compute? Runs an OLD and a NEW checkout of algos/ side by side on fixed
seeds and compares what each writes, bit for bit: the checkpoints tensor by tensor (networks, target networks, Adam's
moments and step counts, counters, generator states, episode lists, evaluations), the replay memory files array by
array, and the episode, score and evaluation files. Timings (summary.json's wall time, rates, an evaluation's
seconds) are left out.

    git worktree add /tmp/at-old <commit>       # the code before the change
    python benchmark/same_behaviour.py --old /tmp/at-old [--new .] [--only dqn,rainbow,...] [--keep DIR] [--jobs 2]
    git worktree remove /tmp/at-old

Every check is a named configuration (`--list` shows them with their flags). Each runs `algos/<script>.py` of either
checkout as a subprocess, with this checkout's .venv python (or the running one), OMP_NUM_THREADS=1 and no
PYTHONPATH, in a fresh folder per side, so that the two sides' runs/ never mix; paths the scripts record (--resume,
--dataset-dir) are relative and the same on both sides. A "+resume" check copies the checkpoint that the OLD side wrote
(and its replay memory) into a fresh folder of each side and goes on from it for a few more steps with the OLD and
the NEW code. The CQL checks read a small dataset in the DQN Replay Dataset's format, made once from a short
dqn_softmoe.py run by benchmark/replay_to_dataset.py (both of the OLD checkout), as tests/test_cql_softmoe.py does.

A check PASSes when both sides ran and every compared value is identical; otherwise it FAILs, naming each differing
key with its largest difference. Exit status 1 if any check failed. `--ignore PATTERN` leaves out keys (fnmatch on
'key/subkey/...', e.g. 'args/*' when a flag was added on purpose).
"""

import argparse
import csv
import fnmatch
import glob
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_IGNORE = ("evaluations/*/seconds",)  # wall time of one evaluation (rainbow_softmoe.py, cql_softmoe.py)
SIDES = ("old", "new")


# ----------------------------------------------------------------------------------------------------------------------
# The configurations
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    name: str  # group/variant; --only takes groups or whole names
    script: str  # algos/<script>.py
    flags: tuple[str, ...]
    outputs: tuple[str, ...]  # globs inside the run folder; "file.json#key" compares that key of a JSON file
    resume: tuple[str, ...] = ()  # flags that raise the budget for the resume check (none: no resume check)
    dataset: bool = False  # runs in a folder that holds the offline dataset as data/
    note_if: str = ""  # a log line worth reporting (e.g. a compile that fell back to eager)


ATARI = ("--env-id", "ALE/Breakout-v5", "--device", "cpu", "--seed", "3", "--log-every-seconds", "1000")
# 200 agent steps, updates from step 80 every 4th step: 30 updates; episodes (and evaluation games) of at most 50 agent
# steps, so that a resume of 50+ steps ends an episode too
ONLINE = ATARI + ("--total-timesteps", "200", "--learning-starts", "80", "--buffer-size", "1000",
                  "--target-network-frequency", "50", "--max-episode-frames", "200", "--save-model",
                  "--checkpoint-replay", "--snapshot-every", "0")  # fmt: skip
# the 100k presets update every step: 40 updates from step 60 of 100; two evaluation games at the end
PRESET_100K = ("--total-timesteps", "100", "--learning-starts", "60", "--target-network-frequency", "20",
               "--eval-episodes", "2")  # fmt: skip
ONLINE_OUT = ("*.pt", "*_replay_*.npz", "episodes.csv")
OFFLINE = ATARI + ("--dataset-dir", "data", "--data-percent", "100", "--num-iterations", "2",
                   "--steps-per-iteration", "15", "--target-network-frequency", "10", "--eval-episodes", "2",
                   "--max-episode-frames", "200", "--save-model")  # fmt: skip
SARSA = ATARI + ("--max-episode-frames", "400", "--save-model")
TETRIS = ("--device", "cpu", "--seed", "3", "--log-every-seconds", "1000", "--save-model")
TETRIS_OUT = ("*.pt", "**/episodes.npz", "learning_curve.csv")

CHECKS = (
    Check("dqn/softmoe-nature", "dqn_softmoe", ONLINE + ("--encoder", "nature", "--moe", "softmoe"), ONLINE_OUT,
          resume=("--total-timesteps", "260")),
    Check("dqn/top1-nature", "dqn_softmoe", ONLINE + ("--encoder", "nature", "--moe", "top1",
                                                      "--load-balance-coef", "0.01"), ONLINE_OUT),
    Check("dqn/none-nature", "dqn_softmoe", ONLINE + ("--encoder", "nature", "--moe", "none"), ONLINE_OUT),
    Check("dqn/softmoe-impala", "dqn_softmoe", ONLINE + ("--encoder", "impala", "--moe", "softmoe",
                                                         "--batch-size", "8"), ONLINE_OUT),
    Check("rainbow/der-softmoe-nature", "rainbow_softmoe",
          ONLINE + ("--preset", "der", "--encoder", "nature", "--moe", "softmoe", "--num-experts", "4",
                    "--batch-size", "16") + PRESET_100K,
          ONLINE_OUT + ("summary.json#evaluations",), resume=("--total-timesteps", "155")),
    Check("rainbow/der-none-nature", "rainbow_softmoe",
          ONLINE + ("--preset", "der", "--encoder", "nature", "--moe", "none", "--batch-size", "16") + PRESET_100K,
          ONLINE_OUT + ("summary.json#evaluations",)),
    Check("rainbow/drq-eps-softmoe-impala", "rainbow_softmoe",
          ONLINE + ("--preset", "drq-eps", "--encoder", "impala", "--moe", "softmoe", "--batch-size", "8")
          + PRESET_100K + ("--total-timesteps", "90", "--target-network-frequency", "1"),
          ONLINE_OUT + ("summary.json#evaluations",)),
    Check("rainbow/full-rainbow-softmoe-nature", "rainbow_softmoe",
          ONLINE + ("--encoder", "nature", "--moe", "softmoe", "--batch-size", "16"), ONLINE_OUT),
    Check("cql/cql-softmoe-impala", "cql_softmoe",
          OFFLINE + ("--agent", "cql", "--encoder", "impala", "--moe", "softmoe", "--batch-size", "8"),
          ("*.pt", "eval_curve.csv", "summary.json#evaluations"), resume=("--num-iterations", "3"), dataset=True),
    Check("cql/cql-c51-top1-nature", "cql_softmoe", OFFLINE + ("--agent", "cql-c51", "--encoder", "nature",
                                                               "--moe", "top1"),
          ("*.pt", "eval_curve.csv", "summary.json#evaluations"), dataset=True),
    Check("sarsa/1-env", "sarsa_lambda_silu_atari", SARSA + ("--num-envs", "1", "--total-episodes", "3"),
          ("*.pt", "episodes.csv", "learning_curve.csv"), resume=("--total-episodes", "4")),
    Check("sarsa/3-envs", "sarsa_lambda_silu_atari", SARSA + ("--num-envs", "3", "--total-episodes", "4"),
          ("*.pt", "episodes.csv", "learning_curve.csv")),
    Check("tetris/shallow-eager", "td_lambda_tetris",
          TETRIS + ("--total-episodes", "30", "--num-runs", "2", "--activation", "dsilu", "relu"), TETRIS_OUT,
          resume=("--total-episodes", "40")),
    Check("tetris/shallow-compile", "td_lambda_tetris", TETRIS + ("--compile", "--total-episodes", "30",
                                                                  "--num-runs", "2"),
          TETRIS_OUT, note_if="running eagerly"),
    Check("tetris/10x10", "td_lambda_tetris", TETRIS + ("--env-id", "envs/Tetris10x10-v0", "--total-episodes", "5"),
          TETRIS_OUT),
    Check("tetris/deep", "td_lambda_tetris", TETRIS + ("--network", "deep", "--total-episodes", "3"), TETRIS_OUT),
)  # fmt: skip


def with_flags(*parts: tuple[str, ...]) -> list[str]:
    """The flags of `parts` in order, a later `--flag values...` replacing an earlier one of the same name in place."""
    merged: dict[str, list[str]] = {}
    name = None
    for token in (t for part in parts for t in part):
        if token.startswith("--"):
            name = token
            merged[name] = []  # a repeated flag keeps its first place, with the later values
        else:
            merged[name].append(token)
    return [t for name, values in merged.items() for t in (name, *values)]


# ----------------------------------------------------------------------------------------------------------------------
# Comparing what the two sides wrote
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Comparison:
    ignore: tuple[str, ...]
    differences: list = field(default_factory=list)  # (where, message, largest |difference| or None)
    counts: dict = field(default_factory=lambda: {"files": 0, "arrays": 0, "values": 0})

    def differ(self, where: str, message: str, size: float | None = None):
        self.differences.append((where, message, size))

    def ignored(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.ignore)

    def values(self, a, b, where: str, key: str = ""):
        """Recursively: dicts key by key, lists element by element, tensors and arrays bit for bit, numbers exactly."""
        if key and self.ignored(key):
            return
        label = f"{where}: {key}" if key else where
        if isinstance(a, torch.Tensor | np.ndarray) or isinstance(b, torch.Tensor | np.ndarray):
            self.arrays(a, b, label)
        elif isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                sub = f"{key}/{k}" if key else str(k)
                if self.ignored(sub):
                    continue
                if k not in b or k not in a:
                    self.differ(f"{where}: {sub}", f"only in {'old' if k in a else 'new'}")
                else:
                    self.values(a[k], b[k], where, sub)
        elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
            if len(a) != len(b):
                self.differ(label, f"length {len(a)} (old) vs {len(b)} (new)")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                self.values(x, y, where, f"{key}/{i}")
        elif is_number(a) and is_number(b):
            self.counts["values"] += 1
            if not (a == b or (math.isnan(a) and math.isnan(b))):
                self.differ(label, f"{a!r} (old) vs {b!r} (new)", abs(float(a) - float(b)))
        else:
            self.counts["values"] += 1
            if type(a) is not type(b) or a != b:
                self.differ(label, f"{short(a)} (old) vs {short(b)} (new)")

    def arrays(self, a, b, label: str):
        self.counts["arrays"] += 1
        try:
            a, b = as_numpy(a), as_numpy(b)
        except TypeError as err:
            self.differ(label, str(err))
            return
        if a.dtype != b.dtype or a.shape != b.shape:
            self.differ(label, f"{a.dtype} {list(a.shape)} (old) vs {b.dtype} {list(b.shape)} (new)")
            return
        if a.tobytes() == b.tobytes():
            return
        if a.dtype.kind not in "biuf":
            self.differ(label, f"{a.dtype} arrays differ")
            return
        bits = f"u{a.dtype.itemsize}" if a.dtype.kind != "b" else "u1"
        unequal = a.reshape(-1).view(bits) != b.reshape(-1).view(bits)
        x, y = a.reshape(-1)[unequal].astype(np.float64), b.reshape(-1)[unequal].astype(np.float64)
        gap = np.abs(x - y)
        gap[np.isnan(gap)] = np.inf  # NaN against a number (or another NaN's bits)
        largest = float(gap.max())
        self.differ(label, f"{int(unequal.sum()):,} of {a.size:,} elements differ, max |diff| {largest:.3g} "
                           f"({a.dtype} {list(a.shape)})", largest)  # fmt: skip

    def files(self, old_dir: str, new_dir: str, pattern: str):
        """The files `pattern` names in the old side's run folder against the new side's."""
        pattern, _, json_key = pattern.partition("#")
        found = [sorted(os.path.relpath(p, d) for p in glob.glob(os.path.join(d, pattern), recursive=True))
                 for d in (old_dir, new_dir)]  # fmt: skip
        if not found[0] and not found[1]:
            self.differ(pattern, "no such file on either side (nothing to compare)")
        for name in sorted(set(found[0]) ^ set(found[1])):
            self.differ(name, f"written only by the {'old' if name in found[0] else 'new'} code")
        for name in sorted(set(found[0]) & set(found[1])):
            self.counts["files"] += 1
            old, new = os.path.join(old_dir, name), os.path.join(new_dir, name)
            try:
                if name.endswith(".pt"):
                    a, b = (torch.load(p, map_location="cpu", weights_only=True) for p in (old, new))
                    self.values(a, b, name)
                elif name.endswith(".npz"):
                    with np.load(old, allow_pickle=False) as a, np.load(new, allow_pickle=False) as b:
                        self.values({k: a[k] for k in a.files}, {k: b[k] for k in b.files}, name)
                elif name.endswith(".json"):
                    a, b = (read_json(p) for p in (old, new))
                    if json_key:
                        a, b = {json_key: a.get(json_key)}, {json_key: b.get(json_key)}
                    self.values(a, b, name)
                else:
                    self.text(old, new, name)
            except Exception as err:  # noqa: BLE001  (an unreadable file is a failure of this check, not of the tool)
                self.differ(name, f"could not be compared ({type(err).__name__}: {err})")

    def text(self, old: str, new: str, name: str):
        """CSV and other text line by line; the first differing line, and the largest difference of a numeric cell."""
        a, b = (open(p, newline="").read().splitlines() for p in (old, new))
        self.counts["values"] += 1
        if a == b:
            return
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        largest = None
        for x, y in zip(a, b, strict=False):
            for u, v in zip(*(next(csv.reader(io.StringIO(line))) if line else [] for line in (x, y)), strict=False):
                if u != v and is_float(u) and is_float(v):
                    gap = abs(float(u) - float(v))
                    largest = gap if largest is None or not gap <= largest else largest
        lines = f"{len(a)} vs {len(b)} lines; " if len(a) != len(b) else ""
        show = [repr(lines_[first]) if first < len(lines_) else "(end of file)" for lines_ in (a, b)]
        biggest = f"; largest numeric difference {largest:.3g}" if largest is not None else ""
        self.differ(name, f"{lines}line {first + 1}: {show[0]} (old) vs {show[1]} (new){biggest}", largest)


def as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()  # bfloat16 -> float32 is exact
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{short(x)} is not an array")


def is_number(x) -> bool:
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool)


def is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def short(x) -> str:
    text = repr(x)
    return text if len(text) <= 60 else f"{text[:57]}..."


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------------------------------------------------
# Running the two sides
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Side:
    """One run of one checkout: its folder (the working directory), its run folder under runs/, and how it went."""

    folder: str
    rc: int | None = None
    seconds: float = 0.0
    run_dir: str | None = None

    def log_tail(self, lines: int = 6) -> str:
        with open(os.path.join(self.folder, "log.txt"), errors="replace") as f:
            return "\n".join(f"        | {line}" for line in f.read().splitlines()[-lines:])


class Runner:
    def __init__(self, args):
        self.checkouts = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
        self.python, self.timeout, self.jobs, self.work = args.python, args.timeout, args.jobs, args.work
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}  # fmt: skip

    def run(self, side: str, folder: str, argv: list[str]) -> Side:
        """`python <checkout>/<argv[0]> argv[1:]` in `folder`, its output in folder/log.txt."""
        os.makedirs(folder, exist_ok=True)
        result, t0 = Side(folder), time.time()
        command = [self.python, os.path.join(self.checkouts[side], argv[0]), *argv[1:]]
        with open(os.path.join(folder, "log.txt"), "w") as log:
            log.write(" ".join(command) + "\n")
            log.flush()
            try:
                result.rc = subprocess.run(command, cwd=folder, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, timeout=self.timeout).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                log.write(f"\n(killed after {self.timeout} s)\n")
        result.seconds = time.time() - t0
        runs = sorted(glob.glob(os.path.join(folder, "runs", "*", "")))
        result.run_dir = runs[0] if len(runs) == 1 else None
        return result

    def both(self, folder: str, argv: list[str], prepare=None) -> dict[str, Side]:
        """Both sides of one run, in folder/old and folder/new (at once with --jobs 2); `prepare(side_folder)` first."""

        def one(side):
            where = os.path.join(folder, side)
            os.makedirs(where)
            if prepare:
                prepare(where)
            return self.run(side, where, argv)

        with ThreadPoolExecutor(max_workers=min(self.jobs, 2)) as pool:
            return dict(zip(SIDES, pool.map(one, SIDES), strict=True))

    def dataset(self) -> tuple[str | None, str]:
        """The offline dataset of the CQL checks: a short dqn_softmoe.py run's replay memory written by
        replay_to_dataset.py, both of the OLD checkout (this checkout's converter if the old one has none)."""
        folder = os.path.join(self.work, "dataset")
        dqn = ["algos/dqn_softmoe.py", *ATARI, "--encoder", "nature", "--moe", "none", "--total-timesteps", "500",
               "--learning-starts", "100", "--buffer-size", "1000", "--max-episode-frames", "800", "--save-model",
               "--checkpoint-replay", "--snapshot-every", "0"]  # fmt: skip
        made = self.run("old", folder, dqn)
        if made.rc != 0 or made.run_dir is None:
            return None, f"the dataset's dqn_softmoe.py run failed (exit {made.rc}):\n{made.log_tail()}"
        converter = "benchmark/replay_to_dataset.py"
        where = self.checkouts["old"] if os.path.isfile(os.path.join(self.checkouts["old"], converter)) else ROOT
        command = [self.python, os.path.join(where, converter), os.path.join(made.run_dir, "dqn_softmoe.pt"),
                   "--out", "data", "--rows-per-file", "200"]  # fmt: skip
        out = subprocess.run(command, cwd=folder, env=self.env, capture_output=True, text=True, timeout=self.timeout)
        if out.returncode != 0:
            return None, f"replay_to_dataset.py failed:\n{out.stdout}{out.stderr}"
        return os.path.join(folder, "data"), f"{made.seconds:.0f} s"


def compare_sides(sides: dict[str, Side], check: Check, ignore: tuple[str, ...]) -> Comparison:
    result = Comparison(ignore)
    for side, run in sides.items():
        if run.rc != 0:
            result.differ(f"{side} run", f"exit status {run.rc} ({run.folder}/log.txt):\n{run.log_tail()}")
        elif run.run_dir is None:
            result.differ(f"{side} run", f"no single run folder under {run.folder}/runs")
    if not result.differences:
        for pattern in check.outputs:
            result.files(sides["old"].run_dir, sides["new"].run_dir, pattern)
    return result


def progress_of(run_dir: str, script: str) -> str:
    """The counters of the old side's checkpoint, so that a PASS shows how much was run."""
    try:
        ckpt = torch.load(os.path.join(run_dir, f"{script}.pt"), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001
        return ""
    parts = [f"{k} {int(ckpt[k])}" for k in ("global_step", "updates") if k in ckpt]
    if "episodes" in ckpt:  # a list of (step, return, length), a count, or a count per run
        episodes = ckpt["episodes"]
        count = len(episodes) if isinstance(episodes, list) else torch.as_tensor(episodes).tolist()
        parts.append(f"episodes {count}")
    return ", ".join(parts)


def report(name: str, result: Comparison, seconds: float, extra: str, notes: list[str], shown: int) -> bool:
    passed = not result.differences
    c = result.counts
    if passed:
        what = f"{c['files']} files identical ({c['arrays']} arrays, {c['values']} other values)"
        print(f"PASS  {name:40s} {seconds:5.0f} s  {what}" + (f"; {extra}" if extra else ""), flush=True)
    else:
        parts = {}  # file: top-level key -> (differences, largest |difference|)
        for where, _, size in result.differences:
            file, _, key = where.partition(": ")
            part = f"{file}: {key.split('/')[0]}" if key else file
            count, largest = parts.get(part, (0, None))
            largest = largest if size is None else size if largest is None else max(largest, size)
            parts[part] = (count + 1, largest)
        print(f"FAIL  {name:40s} {seconds:5.0f} s  {len(result.differences)} difference(s)", flush=True)
        for part, (count, largest) in parts.items():
            print(f"        {part}: {count} differ" + ("" if largest is None else f", largest |diff| {largest:.3g}"))
        print("      first differences:")
        for where, message, _ in result.differences[:shown]:
            print(f"        {where}: {message}")
        if len(result.differences) > shown:
            print(f"        ... and {len(result.differences) - shown} more (--show N lists more)")
    for note in notes:
        print(f"      note: {note}")
    return passed


def describe(path: str) -> str:
    """The commit of a checkout, and whether its algos/ or envs/ differ from it."""
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--", "algos", "envs"],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (subprocess.CalledProcessError, FileNotFoundError):
        return f"{path} (not a git checkout)"
    return f"{path} ({head}{', with uncommitted changes in algos/ or envs/' if dirty else ''})"


def same_code(old: str, new: str) -> bool:
    def files(root):
        found = {}
        for sub in ("algos", "envs"):
            for path in sorted(glob.glob(os.path.join(root, sub, "**", "*.py"), recursive=True)):
                with open(path, "rb") as f:
                    found[os.path.relpath(path, root)] = f.read()
        return found

    return files(old) == files(new)


def select(only: str | None) -> list[Check]:
    if not only:
        return list(CHECKS)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if not any(c.name == w or c.name.startswith(f"{w}/") for c in CHECKS)]
    if unknown:
        groups = sorted({c.name.split("/")[0] for c in CHECKS})
        raise SystemExit(f"error: --only {', '.join(unknown)}: no such check; groups {', '.join(groups)}, or --list")
    return [c for c in CHECKS if any(c.name == w or c.name.startswith(f"{w}/") for w in wanted)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))  # fmt: skip
    parser.add_argument("--old", help="checkout of the code before the change (e.g. a git worktree)")
    parser.add_argument("--new", default=ROOT, help="checkout of the code after the change (default: this one)")
    parser.add_argument("--only", help="comma-separated groups (dqn, rainbow, cql, sarsa, tetris) or check names")
    parser.add_argument("--keep", help="keep every run's folder under this new folder (default: a temporary one)")
    parser.add_argument("--jobs", type=int, default=1, choices=(1, 2), help="2: run the two sides at once")
    parser.add_argument("--ignore", action="append", default=[], help="also leave out keys matching this pattern")
    parser.add_argument("--show", type=int, default=12, help="differences listed per failed check")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds one script run may take")
    default_python = os.path.join(ROOT, ".venv", "bin", "python")
    parser.add_argument("--python", default=default_python if os.path.exists(default_python) else sys.executable)
    parser.add_argument("--list", action="store_true", help="print the checks and their flags, run nothing")
    args = parser.parse_args(argv)
    checks = select(args.only)
    if args.list:
        for c in checks:
            resume = f"\n    +resume: {' '.join(c.resume)}" if c.resume else ""
            print(f"{c.name}: algos/{c.script}.py {' '.join(with_flags(c.flags))}{resume}")
        return 0
    if not args.old:
        parser.error("--old is required")
    for side in ("old", "new"):
        if not os.path.isdir(os.path.join(getattr(args, side), "algos")):
            parser.error(f"--{side} {getattr(args, side)!r} has no algos/ folder")
    if args.keep:
        if os.path.exists(args.keep) and os.listdir(args.keep):
            parser.error(f"--keep {args.keep!r} is not empty")
        os.makedirs(args.keep, exist_ok=True)
        args.work = os.path.abspath(args.keep)
    else:
        args.work = tempfile.mkdtemp(prefix="same_behaviour_")
    ignore = DEFAULT_IGNORE + tuple(args.ignore)

    print(f"old: {describe(os.path.abspath(args.old))}\nnew: {describe(os.path.abspath(args.new))}")
    if same_code(args.old, args.new):
        print("note: the two checkouts' algos/ and envs/ are byte for byte the same (a self-check)")
    print(f"runs in {args.work}{'' if args.keep else ' (removed at the end; --keep DIR keeps them)'}; "
          f"python {args.python}; ignoring {', '.join(ignore)}", flush=True)  # fmt: skip
    runner, t_start, results = Runner(args), time.time(), []
    data = None
    if any(c.dataset for c in checks):
        data, message = runner.dataset()
        print(f"dataset for the CQL checks: {message}" if data else f"error: {message}", flush=True)

    def link_dataset(folder):
        os.symlink(data, os.path.join(folder, "data"))

    try:
        for check in checks:
            folder = os.path.join(args.work, check.name.replace("/", "__"))
            if check.dataset and data is None:
                results.append((check.name, report(check.name, Comparison(ignore, [("dataset", "not made", None)]),
                                                   0, "", [], args.show)))  # fmt: skip
                continue
            t0 = time.time()
            sides = runner.both(folder, [f"algos/{check.script}.py", *with_flags(check.flags)],
                                link_dataset if check.dataset else None)  # fmt: skip
            result = compare_sides(sides, check, ignore)
            notes = [f"{side}: the log says '{check.note_if}'" for side, run in sides.items()
                     if check.note_if and check.note_if in run.log_tail(10**6)]  # fmt: skip
            extra = progress_of(sides["old"].run_dir, check.script) if not result.differences else ""
            results.append((check.name, report(check.name, result, time.time() - t0, extra, notes, args.show)))
            if not check.resume:
                continue
            name, t0 = f"{check.name} +resume", time.time()
            start = sides["old"].run_dir and os.path.join(sides["old"].run_dir, f"{check.script}.pt")
            if sides["old"].rc != 0 or not start or not os.path.isfile(start):
                results.append((name, report(name, Comparison(ignore, [("old checkpoint", "missing", None)]), 0, "",
                                             [], args.show)))  # fmt: skip
                continue
            replay = torch.load(start, map_location="cpu", weights_only=True).get("replay")

            def copy_start(where, start=start, replay=replay, check=check):
                os.makedirs(os.path.join(where, "start"))
                shutil.copy2(start, os.path.join(where, "start", f"{check.script}.pt"))
                if replay:  # the replay memory the checkpoint names, beside it
                    shutil.copy2(os.path.join(os.path.dirname(start), replay), os.path.join(where, "start", replay))
                if check.dataset:
                    link_dataset(where)

            flags = with_flags(check.flags, check.resume, ("--resume", f"start/{check.script}.pt"))
            sides = runner.both(f"{folder}__resume", [f"algos/{check.script}.py", *flags], copy_start)
            result = compare_sides(sides, check, ignore)
            extra = progress_of(sides["old"].run_dir, check.script) if not result.differences else ""
            results.append((name, report(name, result, time.time() - t0, extra, [], args.show)))
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    failed = [name for name, ok in results if not ok]
    minutes, seconds = divmod(int(time.time() - t_start), 60)
    print(f"\nsummary: {len(results) - len(failed)} passed, {len(failed)} failed of {len(results)} checks in "
          f"{minutes}m{seconds:02d}s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
