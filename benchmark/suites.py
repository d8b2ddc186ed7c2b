"""The two papers' tables and figures as task lists: one task = one (game, variant, seed) = one command line.

benchmark.sh hands every suite to this file. A suite expands to its tasks at a budget (smoke: seconds per task on a
CPU; reduced: the budget of the repository's results; paper: the paper's), then the tasks are printed (--dry-run),
run here N at a time (--jobs N), or written as one SLURM job array and submitted (--slurm; with --dry-run it prints
the job script instead). Every task writes its run directory to runs/{run_name}/ and its log to
runs/logs/{suite}/{task}.log, wherever it ran, and the launch writes runs/suites/{suite}.json (the task list) so
`benchmark.sh report SUITE` can say which tasks finished, failed or are missing. A task that evaluates what it trained
(tetris-table3, atari-table3) runs the evaluation after the training, in the same task. At the paper budget the launch
(or dry run) first prints what the tasks need: their agent steps, placements or gradient steps, and the hours on one
GPU and on one CPU core at the rates measured in this repository (RATES, each with its source), or "not measured".

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
from dataclasses import asdict, dataclass, field, replace

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
    """envs/atari_scores.csv: game -> row (random, human, dqn_nature scores, subsets, sources)."""
    with open(os.path.join(ROOT, "envs", "atari_scores.csv"), newline="") as f:
        return {row["game"]: row for row in csv.DictReader(f)}


def expand(suite, budget, seeds=None, games=None, python=None, dataset="results/cql_cpu/work/dataset", extra=()):
    """The suite's tasks. Raises SystemExit with one line on an unknown suite, budget or game, a game the suite does
    not play, or a cql suite on several games whose dataset does not vary with {game}."""
    if suite not in SUITES:
        raise SystemExit(f"error: unknown suite '{suite}' (known: {', '.join(SUITES)})")
    if budget not in BUDGETS:
        raise SystemExit(f"error: unknown budget '{budget}' (known: {', '.join(BUDGETS)})")
    if suite in ELFWING_SUITES:
        played = {spec.game: None for spec in elfwing_specs(suite, budget)}  # its games at this budget, in order
        check_games(games, suite, played, f" at the {budget} budget")
        seeds = seeds or ([1, 2] if suite == "atari-table2" else [1])  # Table 2: two runs per game
        return elfwing_expand(suite, budget, seeds, games, python or sys.executable, extra)
    default_games, kind, variants = suite_definition(suite)
    if games:
        unknown = [g for g in games if g not in known_games()]
        if unknown:
            raise SystemExit(
                f"error: unknown game '{unknown[0]}' (Gymnasium's CamelCase ROM names, e.g. Pong, MsPacman)"
            )
    if suite != "cql-fig11":  # Fig. 11's games are whichever --games names (the paper does not list them)
        check_games(games, suite, default_games)
    games = games or (SMOKE_GAMES if budget == "smoke" else default_games)
    if kind == "offline" and len(games) > 1 and "{game}" not in dataset:
        raise SystemExit(f"error: {suite} on {len(games)} games needs {{game}} in --dataset (e.g. data/{{game}}), "
                         f"or every game reads the one dataset {dataset}")  # fmt: skip
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


def check_games(games, suite, valid, where=""):
    """One line for a --games entry the suite does not play (it would give no task)."""
    if outside := [g for g in games or () if g not in valid]:
        raise SystemExit(f"error: game '{outside[0]}' is not in {suite}{where} (its games: {' '.join(valid)})")


def elfwing_expand(suite, budget, seeds, games, python, extra):
    tasks = []
    for spec in elfwing_specs(suite, budget):
        if games and spec.game not in games:
            continue
        tetris = spec.game in ("SZTetris", "Tetris10x10")
        script = ["algos/td_lambda_tetris.py"] if tetris else ["algos/sarsa_lambda_silu_atari.py", "--env-id"]
        if tetris and len(seeds) > 1:  # run i of --seed s starts from network s + i (td_lambda_tetris.py)
            n, ordered = int(spec.flags[spec.flags.index("--num-runs") + 1]), sorted(seeds)
            if min(b - a for a, b in zip(ordered, ordered[1:], strict=False)) < n:
                raise SystemExit(
                    f"error: {suite} trains {n} runs per seed, run i of seed s from network s + i: "
                    f"seeds closer than {n} share networks; use seeds {n} apart, e.g. 1 {1 + n}"
                )
        for seed in seeds:
            exp = f"{suite}.{spec.variant}"
            argv = [python, *script, *([] if tetris else [f"ALE/{spec.game}-v5"]), *spec.flags, "--seed", str(seed),
                    "--exp-name", exp, *([] if spec.seconds else ["--save-model"]), *extra]  # fmt: skip
            then = ""
            if spec.evaluate:  # the newest checkpoint of this task's run (run names end in the start time)
                checkpoint = "td_lambda_tetris.pt" if tetris else "sarsa_lambda_silu_atari.pt"
                # the budget in the folder: tetris_eval.py refuses a folder that holds an evaluation already
                out = ["--out", f"runs/{exp}.{budget}.s{seed}.eval"] if tetris else ["--exp-name", f"{exp}.eval"]
                run_name = f"{spec.game}-v0__{exp}" if tetris else f"{spec.game}__{exp}"  # the scripts' run names
                found = f'"$(ls -td runs/{run_name}__*__{seed}__*/ | head -n 1){checkpoint}"'
                evaluate = shlex.join(spec.evaluate[1:] + out)
                then = f"{shlex.join([python, spec.evaluate[0]])} --checkpoint {found} {evaluate}"
            log = os.path.join("runs", "logs", suite, f"{spec.game}.{spec.variant}.s{seed}.log")
            tasks.append(Task(suite, spec.game, spec.variant, seed, argv, log, then, spec.seconds))
    return tasks


# What a suite needs at the paper budget, printed with its task list. Each task is costed at the rate of its own
# configuration, read from its command line (so flags after -- count: `-- --cuda-graph` or `-- --encoder nature` pick
# the rates measured with them): hours = tasks x per-task budget / rate. Every rate is one measured in this repository,
# named by its file and figure; a configuration never timed is "not measured", except a network variant of a timed
# (agent, encoder, replay ratio, mode), which takes that network's rate marked "stand-in": on the H100 the baseline
# and Soft MoE of one agent and encoder ran within 10% of each other with CUDA graphs (10-21% eager), where the agent
# and the encoder moved the rate 1.2-2.3x, and the replay ratio sets the updates per step, over half of an eager step's
# time at 0.25 (results/gpu_speed: 5.2 ms per DQN update, one per 4 steps, at 434 steps/s). Where several rounds timed
# a configuration, the lowest rate.
@dataclass(frozen=True)
class Rate:
    per_second: float
    unit: str  # agent steps, placements or gradient steps
    device: str  # GPU (hours on one GPU) or core (hours on one CPU core)
    config: tuple  # what was timed, as task_cost() describes a task
    where: str  # the file that holds the measurement
    figure: str  # which figure of it


GPU_SPEED = "results/gpu_speed/README.md"  # Breakout, 10,000-step runs, learning from step 1,000, a 10,000 buffer
A100K = "results/atari100k_cpu/README.md"
A100K_26 = "results/atari100k_26games/README.md"
FREEZE = "results/softmoe_100k_freeze/README.md"
TETRIS_PAPER = "results/tetris_table1_paper/README.md"
RATES = {
    "h100-dqn-nature-none": Rate(434, "agent steps", "GPU", ("dqn", "nature", "none", 0.25, "eager"), GPU_SPEED,
                                 "Result: dqn_softmoe.py --encoder nature --moe none, eager, round 3 (634 in round 1)"),
    "h100-dqn-nature-none-graph": Rate(817, "agent steps", "GPU", ("dqn", "nature", "none", 0.25, "graph"), GPU_SPEED,
                                       "Result: the same with --cuda-graph, round 3 (823 in round 2)"),
    "h100-dqn-nature-softmoe": Rate(502, "agent steps", "GPU", ("dqn", "nature", "softmoe-e8", 0.25, "eager"),
                                    GPU_SPEED, "Result: dqn_softmoe.py --encoder nature (Soft MoE, 8 experts), eager"),
    "h100-dqn-nature-softmoe-graph": Rate(803, "agent steps", "GPU", ("dqn", "nature", "softmoe-e8", 0.25, "graph"),
                                          GPU_SPEED, "Result: the same with --cuda-graph, round 2"),
    "h100-rainbow-nature-none": Rate(186, "agent steps", "GPU", ("full-rainbow", "nature", "none", 0.25, "eager"),
                                     GPU_SPEED, "Result: rainbow_softmoe.py --encoder nature --moe none, eager, "
                                     "round 3 (199 in round 1)"),
    "h100-rainbow-nature-none-graph": Rate(425, "agent steps", "GPU",
                                           ("full-rainbow", "nature", "none", 0.25, "graph"), GPU_SPEED,
                                           "Result: the same with --cuda-graph, round 2 (432 in round 3)"),
    "h100-rainbow-nature-softmoe": Rate(219, "agent steps", "GPU",
                                        ("full-rainbow", "nature", "softmoe-e8", 0.25, "eager"), GPU_SPEED,
                                        "Result: rainbow_softmoe.py --encoder nature (Soft MoE, 8 experts), eager"),
    "h100-rainbow-nature-softmoe-graph": Rate(388, "agent steps", "GPU",
                                              ("full-rainbow", "nature", "softmoe-e8", 0.25, "graph"), GPU_SPEED,
                                              "Result: the same with --cuda-graph, round 2 (402 in round 3)"),
    "h100-rainbow-impala-softmoe": Rate(137, "agent steps", "GPU",
                                        ("full-rainbow", "impala", "softmoe-e8", 0.25, "eager"), GPU_SPEED,
                                        "Result: rainbow_softmoe.py (Impala, Soft MoE 8: the default), eager"),
    "h100-rainbow-impala-softmoe-graph": Rate(312, "agent steps", "GPU",
                                              ("full-rainbow", "impala", "softmoe-e8", 0.25, "graph"), GPU_SPEED,
                                              "Result: the same with --cuda-graph"),
    "h200-drq-eps-impala-softmoe-graph": Rate(231, "agent steps", "GPU",
                                              ("drq-eps", "impala", "softmoe-e8", 1.0, "graph"), FREEZE,
                                              "What the device part would take: DrQ(eps), Impala + Soft MoE 8, "
                                              "--cuda-graph, one process on an H200, Breakout, while learning"),
    "core-rainbow-nature-none": Rate(47.8, "agent steps", "core", ("full-rainbow", "nature", "none", 0.25, ""), A100K,
                                     "Runs table: full-rainbow_RoadRunner_none_s1, one thread beside another run"),
    "core-rainbow-nature-softmoe": Rate(22.0, "agent steps", "core",
                                        ("full-rainbow", "nature", "softmoe-e8", 0.25, ""), A100K,
                                        "Runs table: full-rainbow_RoadRunner_softmoe_s1, one thread beside another "
                                        "run"),
    "core-drq-eps-impala-none": Rate(7.6, "agent steps", "core", ("drq-eps", "impala", "none", 1.0, ""), FREEZE,
                                     "Complete runs, wall time: the Impala baseline seed 1, 7.9 and 7.6 steps/s, one "
                                     "thread beside another run, evaluation included"),
    "core-drq-eps-impala-softmoe": Rate(6.8, "agent steps", "core", ("drq-eps", "impala", "softmoe-e8", 1.0, ""),
                                        FREEZE, "Complete runs, wall time: Impala + Soft MoE seed 1, 6.8 and 6.9 "
                                        "steps/s, one thread beside another run, evaluation included"),
    "core-drq-eps-nature-none": Rate(27.0, "agent steps", "core", ("drq-eps", "nature", "none", 1.0, ""), A100K,
                                     "Threads: DrQ(eps) Breakout baseline, two runs side by side, one thread each "
                                     "(27.4 and 27.0), early in a run"),
    "core-drq-eps-nature-softmoe4": Rate(15.0, "agent steps", "core", ("drq-eps", "nature", "softmoe-e4", 1.0, ""),
                                         A100K, "Runs table: drq-eps_Breakout_softmoe_s2, side by side, one thread"),
    "core-der-nature-none": Rate(4.05, "agent steps", "core", ("der", "nature", "none", 1.0, ""), A100K_26,
                                 "Cost here: one update and one acting pass a step, one pinned core, while learning "
                                 "(13.7 early in a run on an earlier CPU, results/atari100k_cpu)"),
    "core-der-nature-softmoe4": Rate(2.77, "agent steps", "core", ("der", "nature", "softmoe-e4", 1.0, ""),
                                     A100K_26, "Cost here: one update and one acting pass a step, one pinned core, "
                                     "while learning (6.8 early in a run on an earlier CPU, results/atari100k_cpu)"),
    "core-cql-nature-none": Rate(5.2, "gradient steps", "core", ("cql", "nature", "none"), "results/cql_cpu/README.md",
                                 "Speed: the baseline on one thread shared with two other runs"),
    "core-cql-nature-softmoe": Rate(3.0, "gradient steps", "core", ("cql", "nature", "softmoe-e8"),
                                    "results/cql_cpu/README.md", "Speed: Soft MoE (3.0-4.4) on one thread shared with "
                                    "two other runs"),
    "core-tetris-shallow-40runs": Rate(56_100, "placements", "core", ("SZTetris", "shallow", 40), TETRIS_PAPER,
                                       "Wall time and rate: all, Table 1's 40 runs to 200,000 episodes on one core "
                                       "(4,437M placements in 79,068 s)"),
    "core-tetris-shallow-10runs": Rate(30_348, "placements", "core", ("SZTetris", "shallow", 10),
                                       "results/tetris_speed/README.md", "Threads and processes: 10 batched runs, "
                                       "1 thread, 2,500 episodes, compilation included (30,348 / 31,832)"),
    "h200-tetris-deep-5runs-x3": Rate(2_220, "placements", "GPU", ("SZTetris", "deep", 5),
                                      "results/tetris_deep_gpu/README.md", "Deep rows: three 5-run processes (the "
                                      "three networks) side by side on one H200, together (713-772 each)"),
    "h200-tetris-shallow-40runs": Rate(14_864, "placements", "GPU", ("SZTetris", "shallow", 40),
                                       "results/tetris_deep_gpu/README.md", "Speed: shallow net, eager (not "
                                       "--compile), 40 batched runs, one process alone on an H200"),
    "core-tetris-deep-5runs": Rate(292, "placements", "core", ("SZTetris", "deep", 5),
                                   "results/tetris_speed/README.md", "The deep net on a CPU: 5 runs, one thread "
                                   "(deep_cpu/summary.json)"),
    "core-tetris10x10-5runs": Rate(4_400, "placements", "core", ("Tetris10x10", "shallow", 5),
                                   "results/tetris_10x10_reduced/README.md", "machine: 'about 4,400 placements/s' "
                                   "(4,443 in its summary.json), one thread shared with two to three other jobs"),
    "core-sarsa-1env": Rate(239, "agent steps", "core", ("sarsa", 1), "docs/sarsa_lambda_silu_atari.md",
                            "Speed: project CPU, Alien, one core taken by another job, --num-envs 1"),
    "core-sarsa-8envs": Rate(417, "agent steps", "core", ("sarsa", 8), "results/sarsa_atari_reduced/README.md",
                             "wall time: Asterix, --num-envs 8, 417 steps/s on one core (an earlier project CPU)"),
}  # fmt: skip
# Mean placements per episode, for the Tetris budgets given in episodes (placements = runs x episodes x this)
EPISODE_PLACEMENTS = {
    # Table 1's 40 shallow runs to 200,000 episodes: 4,437M placements over 40 x 200,000 episodes
    "SZTetris": (4_437e6 / (40 * 200_000), TETRIS_PAPER),
    # 32,178,835 placements over the 5 runs' first 52,397 episodes (9,247-13,075 each): a lower bound, as episodes
    # lengthen while the agent learns (the paper's final 4,900 lines take >= 12,250 placements: 10 cells a line, 4 a
    # piece)
    "Tetris10x10": (32_178_835 / 52_397, "results/tetris_10x10_reduced/summary.json"),
}


def _values(argv, flag):
    """The values after the last `flag` in argv (up to the next option); None where it is absent."""
    found = None
    for i, a in enumerate(argv):
        if a == flag:
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            found = argv[i + 1 : j]
        elif a.startswith(flag + "="):
            found = [a.split("=", 1)[1]]
    return found


def _value(argv, flag, default):
    values = _values(argv, flag)
    return values[-1] if values else default


def _switch(argv, flag) -> bool:
    on = False
    for a in argv:
        on = True if a == flag else False if a == "--no-" + flag[2:] else on
    return on


@dataclass(frozen=True)
class Cost:
    """One task's budget: `amount` of `unit` ("<=" / ">=" when only a bound is known, `basis` says how it was found)
    and the rate of its configuration on each device: (RATES key, "" or "stand-in: ...") or None (not measured)."""

    what: str
    amount: float
    unit: str
    bound: str = ""
    basis: str = ""
    gpu: tuple | None = None
    core: tuple | None = None
    net: str = field(default="", compare=False)  # the network, listed in the line but not part of its grouping


def _rate_for(device: str, config: tuple):
    """(key, note) of the rate measured for config on device, or of a stand-in: the same config but the network
    (index 2; the baseline for a baseline, else an MoE where one was timed); None where neither was measured."""
    exact = [k for k, r in RATES.items() if r.device == device and r.config == config]
    if exact:
        return exact[0], ""
    if len(config) < 3 or config[0] in ("SZTetris", "Tetris10x10", "sarsa"):
        return None
    near = [k for k, r in RATES.items() if r.device == device and r.config[:2] == config[:2]
            and r.config[3:] == config[3:]]  # fmt: skip
    if not near:
        return None
    baseline = config[2].startswith("none")
    near.sort(key=lambda k: RATES[k].config[2].startswith("none") != baseline)
    return near[0], f"stand-in: only {RATES[near[0]].config[2]} timed"


def task_cost(task) -> Cost:
    """The task's budget and the rates that cost it, from its command line."""
    argv, script = task.argv, os.path.basename(task.argv[1])
    if task.seconds:  # a speed measurement: stopped by timeout
        return Cost("a speed measurement", task.seconds, "s", basis="stopped by timeout")
    if script in ("dqn_softmoe.py", "rainbow_softmoe.py", "cql_softmoe.py"):
        moe, k = _value(argv, "--moe", "softmoe"), _value(argv, "--num-experts", "8")
        width = _value(argv, "--width-multiplier", "1")
        net = ("none" if width == "1" else f"none-x{width}") if moe == "none" else f"{moe}-e{k}"
        if moe != "none" and _value(argv, "--tokenization", "perconv") != "perconv":
            net += "-" + _value(argv, "--tokenization", "")
        net += "-randomphi" if _switch(argv, "--random-phi") else ""
        encoder = _value(argv, "--encoder", "impala")
        if script == "cql_softmoe.py":
            agent = _value(argv, "--agent", "cql")
            steps = int(_value(argv, "--num-iterations", "200")) * int(_value(argv, "--steps-per-iteration", "62500"))
            config = (agent, encoder, net)
            return Cost(f"{agent}, {encoder}", steps, "gradient steps", gpu=_rate_for("GPU", config),
                        core=_rate_for("core", config), net=net)  # fmt: skip
        agent = "dqn" if script == "dqn_softmoe.py" else _value(argv, "--preset", "full-rainbow")
        short = agent in ("der", "drq-eps")  # the Atari-100k presets: 100k steps, replay ratio 1
        steps = int(_value(argv, "--total-timesteps", "100000" if short else "50000000"))
        rr = float(_value(argv, "--replay-ratio", "1" if short else "0.25"))
        mode = "graph" if _switch(argv, "--cuda-graph") else "eager"
        config = (agent, encoder, net, rr)
        return Cost(f"{agent}, {encoder}, replay ratio {rr:g}" + (", --cuda-graph" if mode == "graph" else ""), steps,
                    "agent steps", gpu=_rate_for("GPU", config + (mode,)), core=_rate_for("core", config + ("",)),
                    net=net)  # fmt: skip
    if script == "td_lambda_tetris.py":
        game = "Tetris10x10" if "Tetris10x10" in _value(argv, "--env-id", "") else "SZTetris"
        network = _value(argv, "--network", "shallow")
        runs = len(_values(argv, "--activation") or [None]) * int(_value(argv, "--num-runs", "1"))
        episodes = int(_value(argv, "--total-episodes", "0"))
        length, source = EPISODE_PLACEMENTS[game]
        bound, how = "", f"the measured mean of Table 1's shallow runs ({source})"
        if game == "Tetris10x10":  # episodes lengthen as the agent learns
            bound = ">="
            how = f"the mean of each run's first 9,247-13,075 episodes ({source}); the paper's final 4,900 lines "
            how += "take >= 12,250 placements (10 cells a line, 4 a piece)"
        elif network == "deep":
            how = f"assumed: the shallow runs' measured mean ({source}); the paper's deep scores are alike"
        config = (game, network, runs)
        return Cost(f"{game}, {network}, {runs} runs", runs * episodes * length, "placements", bound,
                    f"{runs} runs x {episodes:,} episodes x {length:.1f} placements, {how}",
                    _rate_for("GPU", config), _rate_for("core", config))  # fmt: skip
    # sarsa_lambda_silu_atari.py: an episode ends after at most 18,000 frames (§3.3), an action every fourth frame
    envs = int(_value(argv, "--num-envs", "1"))
    episodes = int(_value(argv, "--total-episodes", "200000"))
    cap = int(_value(argv, "--max-episode-frames", "18000")) // int(_value(argv, "--frame-skip", "4"))
    return Cost(f"Sarsa(lambda), --num-envs {envs}", episodes * cap, "agent steps", "<=",
                f"{episodes:,} episodes x at most {cap:,} agent steps (the 18,000-frame cap)",
                _rate_for("GPU", ("sarsa", envs)), _rate_for("core", ("sarsa", envs)))  # fmt: skip


def _bound(bounds: set) -> str:
    """The bound of a sum of figures: "<= " when some are upper bounds and the rest exact (">= " alike)."""
    marks = bounds - {""}
    return f"{marks.pop()} " if len(marks) == 1 else ""


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 100 else f"{h:.1f}" if h >= 1 else f"{h:.3f}"


def cost_lines(tasks) -> list[str]:
    """The compute the tasks need, one line per configuration, a total, and the source of every rate used."""
    groups = {}
    for t in tasks:
        cost = task_cost(t)
        groups.setdefault(cost, []).append(cost.net)
    lines = ["compute at the paper budget (hours = tasks x per-task budget / rate; rates measured in this repository, "
             "sources below; start-up, evaluations and analyses after training not counted):"]  # fmt: skip
    used, totals, covered, amounts = [], {"GPU": 0.0, "core": 0.0}, {"GPU": 0, "core": 0}, {}
    bounds = {"GPU": set(), "core": set()}  # "<=" / ">=" where a group's budget is a bound
    unit_bounds = {}
    for cost, members in groups.items():
        n = len(members)
        amounts[cost.unit] = amounts.get(cost.unit, 0) + n * cost.amount
        unit_bounds.setdefault(cost.unit, set()).add(cost.bound)
        bound = f"{cost.bound} " if cost.bound else ""
        nets = ", ".join(dict.fromkeys(m for m in members if m))
        head = f"  {n} x {bound}{cost.amount:,.0f} {cost.unit} ({cost.what}" + (f"; {nets})" if nets else ")")
        if cost.unit == "s":
            lines.append(f"{head}: {_hours(n * cost.amount / 3600)} h of wall time, {cost.basis}")
            continue
        parts = []
        for device in ("GPU", "core"):
            found = getattr(cost, device.lower())
            if found is None:
                parts.append(f"{device}-hours not measured")
                continue
            key, note = found
            rate = RATES[key]
            hours = n * cost.amount / rate.per_second / 3600
            totals[device] += hours
            covered[device] += n
            bounds[device].add(cost.bound)
            used += [key] if key not in used else []
            parts.append(f"{bound}{_hours(hours)} {device}-hours at {rate.per_second:,g}/s [{key}]"
                         + (f" ({note})" if note else ""))  # fmt: skip
        lines.append(f"{head}: {'; '.join(parts)}")
        if cost.basis:
            lines.append(f"      per task: {cost.basis}")
    total = ", ".join(_bound(unit_bounds[unit]) + (f"{v:,.0f} {unit}" if unit == "s" else f"{v:.3e} {unit}")
                      for unit, v in amounts.items())  # fmt: skip
    line = f"  total: {len(tasks)} task{'s' * (len(tasks) != 1)}" + (f", {total}" if total else "")
    for device in ("GPU", "core"):
        if covered[device]:
            part = f"{_bound(bounds[device])}{_hours(totals[device])} {device}-hours"
            line += f"; {part}" + (f" (the {covered[device]} tasks measured)" if covered[device] < len(tasks) else "")
        elif amounts.keys() - {"s"}:
            line += f"; {device}-hours not measured"
    lines.append(line)
    eager = [t for t in tasks if os.path.basename(t.argv[1]) in ("dqn_softmoe.py", "rainbow_softmoe.py")
             and not _switch(t.argv, "--cuda-graph")]  # fmt: skip
    if eager:  # the same tasks with CUDA graphs, where those rates were measured
        graph = [task_cost(replace(t, argv=t.argv + ["--cuda-graph"])) for t in eager]
        hours = [c.amount / RATES[c.gpu[0]].per_second / 3600 for c in graph if c.gpu]
        used += [c.gpu[0] for c in graph if c.gpu and c.gpu[0] not in used]
        used = list(dict.fromkeys(used))
        lines.append(f"  with -- --cuda-graph: {_hours(sum(hours))} GPU-hours (the {len(hours)} tasks measured)"
                     if hours else "  with -- --cuda-graph: GPU-hours not measured")  # fmt: skip
    lines += [f"  [{k}] {RATES[k].per_second:,g} {RATES[k].unit}/s on one {RATES[k].device}: {RATES[k].where}, "
              f"{RATES[k].figure}" for k in used]  # fmt: skip
    return lines


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
               f"--cpus-per-task={1 if args.cpus_per_task is None else args.cpus_per_task}"]  # fmt: skip
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
    # the options a suite or a launch does not use default to None, so that one given in vain is refused
    p.add_argument("--dataset", help="cql-fig11: dataset dir, {game} allowed (default: results/cql_cpu/work/dataset)")
    p.add_argument("--dry-run", action="store_true", help="print every command, run nothing")
    p.add_argument("--jobs", type=int, help="run the tasks N at a time on this machine (default 1)")
    p.add_argument(
        "--slurm", action="store_true", help="submit one SLURM job array, one task per (game, variant, seed)"
    )
    p.add_argument("--partition", help="--slurm only")
    p.add_argument("--time", help="--slurm only")
    p.add_argument("--gpus-per-task", type=int, help="--slurm only")
    p.add_argument("--cpus-per-task", type=int, help="--slurm only (default 1)")
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
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"error: --jobs must be at least 1, got {args.jobs}")
    for values, name in ((seeds, "--seeds"), (args.games.split(), "--games")):  # two tasks would share one log
        if twice := [v for i, v in enumerate(values) if v in values[:i]]:
            raise SystemExit(f"error: {name} lists {twice[0]} twice")
    if args.dataset is not None and args.suite != "cql-fig11":
        raise SystemExit(f"error: --dataset is for cql-fig11 only; {args.suite} reads no dataset")
    slurm_only = [f"--{k.replace('_', '-')}" for k in ("partition", "time", "gpus_per_task", "cpus_per_task")
                  if getattr(args, k) is not None]  # fmt: skip
    if slurm_only and not args.slurm:
        raise SystemExit(f"error: {slurm_only[0]} sets the SLURM job array: it needs --slurm")
    if args.jobs is not None and args.slurm:
        raise SystemExit("error: --jobs runs tasks on this machine; with --slurm each array task runs one task")
    python = os.environ.get("PYTHON") or (
        ".venv/bin/python" if os.path.exists(os.path.join(ROOT, ".venv/bin/python")) else sys.executable
    )
    dataset = "results/cql_cpu/work/dataset" if args.dataset is None else args.dataset
    tasks = expand(args.suite, args.budget, seeds, args.games.split(), python, dataset, extra)
    if not tasks:  # never a manifest, job array or run of nothing
        raise SystemExit(f"error: {args.suite} has no task with these --games and --seeds")
    if args.slurm and not args.dry_run and shutil.which("sbatch") is None:
        raise SystemExit("error: --slurm needs sbatch on PATH (no SLURM client found); use --jobs N to run here")
    os.chdir(ROOT)
    print(f"{args.suite}: {len(tasks)} task{'s' * (len(tasks) != 1)} at the {args.budget} budget", flush=True)
    if args.budget == "paper":  # what an allocation must hold
        print("\n".join(cost_lines(tasks)), flush=True)
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
    jobs = args.jobs or 1
    write_manifest(tasks, args.suite, args.budget, f"local --jobs {jobs}")
    failed = run_local(tasks, jobs)
    print(
        f"{args.suite}: {len(tasks) - failed} of {len(tasks)} tasks exited cleanly; "
        f"bash benchmark.sh report {args.suite}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
