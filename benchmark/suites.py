"""The two papers' tables and figures as task lists: one task = one (game, variant, seed) = one command line.

benchmark.sh hands every suite to this file. A suite expands to its tasks at a budget (smoke: seconds per task on a
CPU; reduced: the budget of the repository's results; paper: the paper's), then the tasks are printed (--dry-run),
run here N at a time (--jobs N), or written as one SLURM job array and submitted (--slurm; with --dry-run it prints
the job script instead). Every task writes its run directory to runs/{run_name}/ and its log to
runs/logs/{suite}/{task}.log, wherever it ran, and the launch writes runs/suites/{suite}.json (the task list) so
`benchmark.sh report SUITE` can say which tasks finished, failed or are missing. A task that evaluates what it trained
(tetris-table3, atari-table3) runs the evaluation after the training, in the same task.

    python benchmark/suites.py tetris-table1 --budget paper --dry-run
    python benchmark/suites.py atari100k --budget reduced --games "Pong Boxing" --seeds "1 2" --jobs 2
    python benchmark/suites.py moe-fig1 --budget paper --slurm --partition gpu --time 4-00:00:00 --gpus-per-task 1
"""

import argparse
import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: tasks run from there
# Appendix A of Obando-Ceron et al. 2024
GAMES_20 = """AirRaid Asterix Asteroids Bowling Breakout DemonAttack Freeway Gravitar Jamesbond MontezumaRevenge
  MsPacman Pong PrivateEye Qbert Seaquest SpaceInvaders Venture WizardOfWor YarsRevenge Zaxxon""".split()
GAMES_26 = ("Alien Amidar Assault Asterix BankHeist BattleZone Boxing Breakout ChopperCommand CrazyClimber DemonAttack "
            "Freeway Frostbite Gopher Hero Jamesbond Kangaroo Krull KungFuMaster MsPacman Pong PrivateEye Qbert "
            "RoadRunner Seaquest UpNDown").split()  # fmt: skip
BUDGETS = ("smoke", "reduced", "paper")
DEFAULT_SEEDS = {"smoke": [1], "reduced": [1, 2], "paper": [1, 2, 3, 4, 5]}

# Online agents (dqn_softmoe.py, rainbow_softmoe.py). smoke: a few hundred steps with short episodes so each task
# ends in seconds and still writes scores; reduced: the README's 2M agent steps; paper: 200M frames for Fig. 1 and
# 40M frames (Appendix A: "the interquantile mean after 40 million environment steps") for the others.
SMOKE_ONLINE = """--total-timesteps 200 --learning-starts 100 --buffer-size 1000 --iteration-steps 100
  --max-episode-frames 200 --snapshot-every 0 --write-every-minutes 1000""".split()
SMOKE_100K = SMOKE_ONLINE + ["--eval-episodes", "1"]
BUDGET_FLAGS = {
    "online": {"smoke": SMOKE_ONLINE, "reduced": ["--total-timesteps", "2000000"],
               "paper": ["--total-timesteps", "10000000"]},
    "online-200m": {"smoke": SMOKE_ONLINE, "reduced": ["--total-timesteps", "2000000"],
                    "paper": ["--total-timesteps", "50000000"]},
    # Atari 100k: the presets already hold the paper's 100k budget; reduced = the README's CPU network, the shipped
    # DER.gin's Nature CNN (its Soft MoE with 4 experts: expand adds --num-experts 4 to the MoE variants)
    "atari100k": {"smoke": SMOKE_100K, "reduced": ["--encoder", "nature"], "paper": []},
    # offline: reduced = results/cql_cpu/queue.sh (5 x 1,000 gradient steps, all of a small dataset, Nature CNN)
    "offline": {
        "smoke": ["--num-iterations", "1", "--steps-per-iteration", "20", "--eval-episodes", "1", "--eval-envs", "1",
                  "--max-episode-frames", "400", "--data-percent", "100", "--encoder", "nature"],
        "reduced": ["--num-iterations", "5", "--steps-per-iteration", "1000", "--eval-episodes", "8",
                    "--max-episode-frames", "18000", "--data-percent", "100", "--encoder", "nature"],
        "paper": ["--data-percent", "5"],
    },
}  # fmt: skip
SMOKE_GAMES = ["Breakout"]  # smoke runs one game of every suite (it has random/human scores) unless --games


def moe_variants(algos, experts=(8,), moes=("none", "softmoe", "top1"), extra=()):
    out = []
    for algo in algos:
        for moe in moes:
            for k in experts if moe != "none" else (None,):
                flags = ["--moe", moe] + (["--num-experts", str(k)] if k else []) + list(extra)
                out.append((f"{algo}-{moe}" + (f"-e{k}" if k else ""), algo, flags))
    return out


def suite_definition(name: str):
    """(games, budget kind, [(variant, script key, flags)]) of a suite; None for an unknown suite."""
    if name == "moe-fig1":  # Soft MoE with 1-8 experts against the baseline's penultimate layer widened x1-x8
        variants = []
        for algo in ("dqn", "rainbow"):
            for k in (1, 2, 4, 8):
                variants.append((f"{algo}-softmoe-e{k}", algo, ["--moe", "softmoe", "--num-experts", str(k)]))
                variants.append((f"{algo}-none-x{k}", algo, ["--moe", "none", "--width-multiplier", str(k)]))
        return GAMES_20, "online-200m", variants
    if name == "moe-fig4-replay-ratio":  # our replay ratios; the figure's exact values are not in the paper's text
        variants = []
        for algo in ("dqn", "rainbow"):
            for rr in ("0.25", "0.5", "1", "2"):
                for v, a, f in moe_variants([algo], moes=("none", "softmoe")):
                    variants.append((f"{v}-rr{rr}", a, f + ["--replay-ratio", rr]))
        return GAMES_20, "online", variants
    if name == "moe-fig6-tokenization":
        variants = []
        for tok in ("perconv", "perfeat", "persamp"):
            for v, a, f in moe_variants(["rainbow"], moes=("softmoe", "top1")):
                variants.append((f"{v}-{tok}", a, f + ["--tokenization", tok]))
        return GAMES_20, "online", variants
    if name == "moe-fig7-cnn":
        return GAMES_20, "online", moe_variants(["dqn", "rainbow"], extra=["--encoder", "nature"])
    if name == "moe-fig8-random-phi":
        variants = moe_variants(["rainbow"], moes=("none", "softmoe"))
        variants.append(
            ("rainbow-softmoe-e8-randomphi", "rainbow", ["--moe", "softmoe", "--num-experts", "8", "--random-phi"])
        )
        return GAMES_20, "online", variants
    if name == "moe-fig10-analysis":  # the statistics (dormant neurons, srank, feature norm...) every 250k steps
        return GAMES_20, "online", moe_variants(["dqn", "rainbow"])
    if name == "atari100k":  # §5.2's text-only claim at 100k ("no real difference between the different variants"):
        # no figure, no numbers, no network named; Figs. 12 and 16 are 50M-step runs
        variants = [
            (f"{p}-{moe}", p, ["--preset", p, "--moe", moe]) for p in ("der", "drq-eps") for moe in ("none", "softmoe")
        ]
        return GAMES_26, "atari100k", variants
    if name == "cql-fig11":  # Fig. 11 uses 17 games whose list is not in the paper's text: name them with --games
        variants = [
            (f"{a}-{moe}", a, ["--agent", a, "--moe", moe])
            for a in ("cql", "cql-c51")
            for moe in ("none", "softmoe", "top1")
        ]
        return ["Breakout"], "offline", variants
    return None


SCRIPTS = {"dqn": "algos/dqn_softmoe.py", "rainbow": "algos/rainbow_softmoe.py", "der": "algos/rainbow_softmoe.py",
           "drq-eps": "algos/rainbow_softmoe.py", "cql": "algos/cql_softmoe.py",
           "cql-c51": "algos/cql_softmoe.py"}  # fmt: skip


# Elfwing, Uchibe & Doya 2018: Tetris (td_lambda_tetris.py) and Atari (sarsa_lambda_silu_atari.py)
TABLE2_GAMES = "Alien Amidar Assault Asterix Asteroids Atlantis BankHeist BattleZone BeamRider Bowling Boxing Breakout"
TABLE3_RULES = ["softmax", "epsilon:0", "epsilon:0.001", "epsilon:0.01", "epsilon:0.05"]
ELFWING_SUITES = ("tetris-table1", "tetris-10x10", "tetris-table3", "tetris-speed", "atari-table2", "atari-table3",
                  "atari-speed")  # fmt: skip


@dataclass
class Spec:
    """One Elfwing task before seeds: its game, variant, training flags, an evaluation of the checkpoint it trains
    (script and flags; Table 3) and, for a speed measurement, the seconds after which SIGTERM stops it cleanly."""

    game: str
    variant: str
    flags: list
    evaluate: list | None = None
    seconds: int = 0


def elfwing_specs(name: str, budget: str) -> list[Spec]:
    """paper = the paper's episodes and runs; reduced = the budget of the repository's results (results/*/README.md);
    smoke = seconds on a CPU."""
    smoke = budget == "smoke"
    tetris = {"paper": 200_000, "reduced": 10_000, "smoke": 20}[budget]
    runs = ["--num-runs", "2" if smoke else "10"]
    if name == "tetris-table1":  # the four shallow rows in one batched process, then the deep rows (5 runs each)
        deep = {"paper": 200_000, "reduced": 1000, "smoke": 3}[budget]
        acts = ["--activation", "dsilu", "sigmoid", "silu", "relu"]
        specs = [Spec("SZTetris", "shallow", acts + runs + ["--compile", "--total-episodes", str(tetris)])]
        for act in ("silu-silu", "relu-relu", "silu-dsilu"):
            flags = ["--network", "deep", "--activation", act, "--num-runs", "2" if smoke else "5"]
            specs.append(Spec("SZTetris", f"deep-{act}", flags + ["--total-episodes", str(deep)]))
        return specs
    if name == "tetris-10x10":  # Fig. 4: 250 hidden units and reward exp(-holes / 16.5), the variant's defaults
        episodes = {"paper": 400_000, "reduced": 20_000, "smoke": 5}[budget]
        flags = ["--env-id", "envs/Tetris10x10-v0", "--num-runs", "2" if smoke else "5", "--compile"]
        return [Spec("Tetris10x10", "dsilu", flags + ["--total-episodes", str(episodes)])]
    if name == "tetris-table3":  # Table 3 and Fig. 6 on the best of the trained runs, the paper's "best agent"
        episodes = "3" if smoke else "1000"
        flags = ["--activation", "dsilu", *runs, "--compile", "--total-episodes", str(tetris)]
        evaluate = ["benchmark/tetris_eval.py", "--run", "best", "--episodes", episodes,
                    "--value-analysis-episodes", episodes, "--selections", *TABLE3_RULES]  # fmt: skip
        return [Spec("SZTetris", "dsilu", flags, evaluate)]
    if name == "tetris-speed":  # placements/s at 10 and 40 batched runs, compiled (the rate is in summary.json)
        flags = ["--compile", "--num-runs", "10", "--total-episodes", "100000", "--log-every-seconds", "10"]
        seconds = 20 if smoke else 100
        return [Spec("SZTetris", f"speed-{10 * len(acts)}runs", ["--activation", *acts, *flags], seconds=seconds)
                for acts in (["dsilu"], ["dsilu", "sigmoid", "silu", "relu"])]  # fmt: skip
    games = ["Breakout"] if smoke else TABLE2_GAMES.split()
    sarsa = {"paper": ["--total-episodes", "200000"], "reduced": ["--total-episodes", "2000", "--num-envs", "8"],
             "smoke": ["--total-episodes", "2", "--max-episode-frames", "400"]}[budget]  # fmt: skip
    if name == "atari-table2":  # Table 2 / Fig. 5: SiLU-dSiLU on the 12 games
        return [Spec(game, "silu-dsilu", sarsa) for game in games]
    if name == "atari-table3":  # Table 3's Atari rows and Fig. 7; reduced: the results' tau schedule, compressed 10x
        if budget == "reduced":
            sarsa = ["--total-episodes", "20000", "--num-envs", "8", "--tau-k", "0.005"]
        evaluate = ["benchmark/sarsa_analysis.py", "--eval-episodes", "1" if smoke else "100",
                    "--eval-selections", *TABLE3_RULES]  # fmt: skip
        return [Spec(g, "silu-dsilu", sarsa, evaluate) for g in (["Breakout"] if smoke else ["Asterix", "Asteroids"])]
    if name == "atari-speed":  # agent steps/s at 1 and 8 environments on Asterix
        flags = ["--total-episodes", "100000", "--log-every-seconds", "30"]
        return [Spec("Asterix", f"speed-{n}envs", ["--num-envs", str(n), *flags], seconds=20 if smoke else 100)
                for n in (1, 8)]  # fmt: skip
    raise KeyError(name)


SUITES = ("moe-fig1", "moe-fig4-replay-ratio", "moe-fig6-tokenization", "moe-fig7-cnn", "moe-fig8-random-phi",
          "moe-fig10-analysis", "atari100k", "cql-fig11", *ELFWING_SUITES)  # fmt: skip


@dataclass
class Task:
    suite: str
    game: str
    variant: str
    seed: int
    argv: list
    log: str
    then: str = ""  # a shell command run after argv succeeded (the evaluation of what it trained)
    seconds: int = 0  # a speed measurement: SIGTERM after this long stops the run cleanly

    @property
    def exp_name(self) -> str:
        return f"{self.suite}.{self.variant}"

    def shell(self) -> str:
        """One line that runs the task from the repository root and writes its log."""
        run = shlex.join(self.argv)
        if self.seconds:  # timeout's 124 is the planned end; the run has written its summary.json
            run = f"timeout -s TERM {self.seconds} {run} || [ $? = 124 ]"
        run += f" && {self.then}" if self.then else ""
        return f"mkdir -p {shlex.quote(os.path.dirname(self.log))} && ({run}) > {shlex.quote(self.log)} 2>&1"


def known_games() -> set:
    return set(GAMES_20) | set(GAMES_26) | set(TABLE2_GAMES.split()) | {"RoadRunner"} | set(atari_scores())


def atari_scores() -> dict:
    """benchmark/atari_scores.csv: game -> row (random, human, dqn_nature scores, subsets, sources)."""
    with open(os.path.join(ROOT, "benchmark", "atari_scores.csv"), newline="") as f:
        return {row["game"]: row for row in csv.DictReader(f)}


def expand(suite, budget, seeds=None, games=None, python=None, dataset="results/cql_cpu/work/dataset", extra=()):
    """The suite's tasks. Raises SystemExit with one line on an unknown suite, budget or game."""
    if suite not in SUITES:
        raise SystemExit(f"error: unknown suite '{suite}' (known: {', '.join(SUITES)})")
    if budget not in BUDGETS:
        raise SystemExit(f"error: unknown budget '{budget}' (known: {', '.join(BUDGETS)})")
    if suite in ELFWING_SUITES:
        seeds = seeds or ([1, 2] if suite == "atari-table2" else [1])  # Table 2: two runs per game
        return elfwing_expand(suite, budget, seeds, games, python or sys.executable, extra)
    default_games, kind, variants = suite_definition(suite)
    if games:
        unknown = [g for g in games if g not in known_games()]
        if unknown:
            raise SystemExit(
                f"error: unknown game '{unknown[0]}' (Gymnasium's CamelCase ROM names, e.g. Pong, MsPacman)"
            )
    else:
        games = SMOKE_GAMES if budget == "smoke" else default_games
    seeds = seeds or DEFAULT_SEEDS[budget]
    python = python or sys.executable
    tasks = []
    for game in games:
        for variant, key, flags in variants:
            for seed in seeds:
                exp = f"{suite}.{variant}"
                argv = [python, SCRIPTS[key]]
                if key in ("rainbow",):
                    argv += ["--preset", "full-rainbow"]
                argv += flags + ["--env-id", f"ALE/{game}-v5", "--seed", str(seed), "--exp-name", exp]
                if kind == "offline":
                    argv += ["--dataset-dir", dataset.replace("{game}", game)]
                argv += BUDGET_FLAGS[kind][budget]
                if kind == "atari100k" and budget == "reduced" and "none" not in flags:
                    argv += ["--num-experts", "4"]  # DER.gin's network, as results/atari100k_cpu/queue.sh runs it
                then = ""
                if suite == "moe-fig10-analysis":  # snapshots every 250k steps, then their statistics
                    argv += ["--snapshot-every", "100" if budget == "smoke" else "250000"]
                    found = f'"$(ls -td runs/{game}__{exp}__*__{seed}__*/ | head -n 1)"'
                    then = f"{shlex.join([python, 'benchmark/moe_analysis.py'])} {found}"
                argv += list(extra)
                log = os.path.join("runs", "logs", suite, f"{game}.{variant}.s{seed}.log")
                tasks.append(Task(suite, game, variant, seed, argv, log, then))
    return tasks


def elfwing_expand(suite, budget, seeds, games, python, extra):
    tasks = []
    for spec in elfwing_specs(suite, budget):
        if games and spec.game not in games:
            continue
        tetris = spec.game in ("SZTetris", "Tetris10x10")
        script = ["algos/td_lambda_tetris.py"] if tetris else ["algos/sarsa_lambda_silu_atari.py", "--env-id"]
        for seed in seeds:
            exp = f"{suite}.{spec.variant}"
            argv = [python, *script, *([] if tetris else [f"ALE/{spec.game}-v5"]), *spec.flags, "--seed", str(seed),
                    "--exp-name", exp, *([] if spec.seconds else ["--save-model"]), *extra]  # fmt: skip
            then = ""
            if spec.evaluate:  # the newest checkpoint of this task's run (run names end in the start time)
                checkpoint = "td_lambda_tetris.pt" if tetris else "sarsa_lambda_silu_atari.pt"
                out = ["--out", f"runs/{exp}.s{seed}.eval"] if tetris else ["--exp-name", f"{exp}.eval"]
                run_name = f"{spec.game}-v0__{exp}" if tetris else f"{spec.game}__{exp}"  # the scripts' run names
                found = f'"$(ls -td runs/{run_name}__*__{seed}__*/ | head -n 1){checkpoint}"'
                evaluate = shlex.join(spec.evaluate[1:] + out)
                then = f"{shlex.join([python, spec.evaluate[0]])} --checkpoint {found} {evaluate}"
            log = os.path.join("runs", "logs", suite, f"{spec.game}.{spec.variant}.s{seed}.log")
            tasks.append(Task(suite, spec.game, spec.variant, seed, argv, log, then, spec.seconds))
    return tasks


def write_manifest(tasks, suite, budget, how, job_id=None):
    os.makedirs(os.path.join("runs", "suites"), exist_ok=True)
    path = os.path.join("runs", "suites", f"{suite}.json")
    with open(path, "w") as f:
        json.dump({"suite": suite, "budget": budget, "how": how, "job_id": job_id, "time": time.time(),
                   "tasks": [asdict(t) | {"exp_name": t.exp_name} for t in tasks]}, f, indent=1)  # fmt: skip
    return path


def run_local(tasks, jobs: int) -> int:
    """Run the tasks N at a time on this machine; returns the number that failed."""

    def one(task):
        print(f"+ {task.shell()}", flush=True)
        rc = subprocess.call(task.shell(), shell=True, cwd=ROOT)
        print(
            f"{'done' if rc == 0 else f'FAILED (exit {rc})'}: {task.game} {task.variant} seed {task.seed}", flush=True
        )
        return rc

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return sum(rc != 0 for rc in pool.map(one, tasks))


def sbatch_script(tasks, suite, args, folder: str) -> str:
    """The job array's script: task i runs line i + 1 of {folder}/tasks.txt (one task per line)."""
    options = [f"--job-name={suite}", f"--array=0-{len(tasks) - 1}", f"--output={folder}/slurm-%A_%a.out",
               f"--cpus-per-task={args.cpus_per_task}"]  # fmt: skip
    if args.partition:
        options.append(f"--partition={args.partition}")
    if args.time:
        options.append(f"--time={args.time}")
    if args.gpus_per_task:
        options.append(f"--gpus-per-task={args.gpus_per_task}")
    header = "".join(f"#SBATCH {o}\n" for o in options)
    task_file = shlex.quote(os.path.abspath(os.path.join(folder, "tasks.txt")))
    body = (
        f"cd {shlex.quote(ROOT)}\n"
        f"export OMP_NUM_THREADS=${{SLURM_CPUS_PER_TASK:-1}}\n"
        f'line=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {task_file})\n'
        'echo "task $SLURM_ARRAY_TASK_ID on $(hostname): $line"\n'
        'eval "$line"\n'
    )
    return f"#!/usr/bin/env bash\n# {suite}: {len(tasks)} tasks, one per (game, variant, seed)\n{header}set -u\n{body}"


def write_sbatch(tasks, suite, args) -> str:
    """runs/slurm/{suite}-{stamp}/: tasks.txt and job.sbatch; returns the script's path."""
    folder = os.path.join("runs", "slurm", f"{suite}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tasks.txt"), "w") as f:
        f.write("".join(t.shell() + "\n" for t in tasks))
    path = os.path.join(folder, "job.sbatch")
    with open(path, "w") as f:
        f.write(sbatch_script(tasks, suite, args, folder))
    return path


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        prog="benchmark.sh SUITE",
        epilog="-- FLAGS...: extra flags for every task, after all of the options above",
    )
    p.add_argument("suite")
    p.add_argument("--budget", default="reduced")
    p.add_argument("--seeds", default="", help='e.g. "1 2 3"; default: 1 (smoke), 1 2 (reduced), 1-5 (paper)')
    p.add_argument("--games", default="", help='e.g. "Pong Breakout"; default: the figure\'s games (smoke: the first)')
    p.add_argument("--dataset", default="results/cql_cpu/work/dataset", help="cql-fig11: dataset dir, {game} allowed")
    p.add_argument("--dry-run", action="store_true", help="print every command, run nothing")
    p.add_argument("--jobs", type=int, default=1, help="run the tasks N at a time on this machine")
    p.add_argument(
        "--slurm", action="store_true", help="submit one SLURM job array, one task per (game, variant, seed)"
    )
    p.add_argument("--partition", default="")
    p.add_argument("--time", default="")
    p.add_argument("--gpus-per-task", type=int, default=0)
    p.add_argument("--cpus-per-task", type=int, default=1)
    # everything after "--" goes to every task; split it off before argparse, which would otherwise refuse options
    # given between the suite name and "--" (a trailing nargs="*" positional is filled, empty, with the suite)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    argv, extra = argv[:split], argv[split + 1 :]
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split()]
    except ValueError:
        raise SystemExit(f"error: --seeds takes integers, got '{args.seeds}'") from None
    if args.jobs < 1:
        raise SystemExit(f"error: --jobs must be at least 1, got {args.jobs}")
    python = os.environ.get("PYTHON") or (
        ".venv/bin/python" if os.path.exists(os.path.join(ROOT, ".venv/bin/python")) else sys.executable
    )
    tasks = expand(args.suite, args.budget, seeds, args.games.split(), python, args.dataset, extra)
    if args.slurm and not args.dry_run and shutil.which("sbatch") is None:
        raise SystemExit("error: --slurm needs sbatch on PATH (no SLURM client found); use --jobs N to run here")
    os.chdir(ROOT)
    print(f"{args.suite}: {len(tasks)} tasks at the {args.budget} budget", flush=True)
    if args.dry_run:
        for t in tasks:
            print(f"+ {t.shell()}")
        if args.slurm:  # the job script it would submit, over a tasks.txt of the lines above
            print(
                f"\n--- job.sbatch ---\n{sbatch_script(tasks, args.suite, args, 'runs/slurm/' + args.suite + '-STAMP')}"
            )
        return 0
    if args.slurm:
        script = write_sbatch(tasks, args.suite, args)
        out = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(
                f"error: sbatch failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
            )
        job_id = out.stdout.strip().split(";")[0]
        write_manifest(tasks, args.suite, args.budget, "slurm", job_id)
        print(f"submitted job array {job_id} ({len(tasks)} tasks): {script}")
        print(f"when it finishes: bash benchmark.sh report {args.suite}")
        print(job_id)
        return 0
    write_manifest(tasks, args.suite, args.budget, f"local --jobs {args.jobs}")
    failed = run_local(tasks, args.jobs)
    print(
        f"{args.suite}: {len(tasks) - failed} of {len(tasks)} tasks exited cleanly; "
        f"bash benchmark.sh report {args.suite}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
