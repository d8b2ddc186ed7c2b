#!/usr/bin/env bash
# The two papers' tables and figures as suites of runs, at a chosen budget, here or on a SLURM cluster; and the report
# that sets our numbers beside the papers'. Every task is one plain command line, printed before it runs.
#
#   bash benchmark.sh SUITE [--budget smoke|reduced|paper] [--seeds "1 2"] [--games "A B"] [--dry-run] [--jobs N]
#                           [--slurm [--partition P] [--time T] [--gpus-per-task N] [--cpus-per-task N]] [-- FLAGS]
#   bash benchmark.sh report [SUITE|DIR ...] [--out DIR]
#
# Elfwing, Uchibe & Doya 2018:
#   tetris-table1   Table 1: shallow dSiLU / sigmoid / SiLU / ReLU (10 runs each, one batched process) and deep
#                   SiLU-SiLU / ReLU-ReLU / SiLU-dSiLU (5 runs each) on stochastic SZ-Tetris (paper: 200,000 episodes)
#   tetris-10x10    Fig. 4: shallow dSiLU, 250 hidden units, on 10x10 Tetris, 5 runs (paper: 400,000 episodes)
#   tetris-table3   Table 3 and Fig. 6: 10 dSiLU runs, then the best one evaluated (softmax at the final tau,
#                   epsilon-greedy 0 / 0.001 / 0.01 / 0.05) with the value analysis (benchmark/tetris_eval.py)
#   tetris-speed    placements per second at 10 and 40 batched runs, compiled
#   atari-table2    Table 2 / Fig. 5: Sarsa(lambda) SiLU-dSiLU on the 12 games, 2 runs each (paper: 200,000 episodes)
#   atari-table3    Table 3's Asterix and Asteroids rows and Fig. 7, evaluated by benchmark/sarsa_analysis.py
#   atari-speed     agent steps per second of the Sarsa(lambda) loop at 1 and 8 environments
# Obando-Ceron et al. 2024 (20 games, 26 for Atari 100k):
#   moe-fig1 (DQN, Rainbow: 1/2/4/8 Soft MoE experts against the baseline widened x1-x8), moe-fig4-replay-ratio,
#   moe-fig6-tokenization, moe-fig7-cnn, moe-fig8-random-phi, moe-fig10-analysis, atari100k (DER and DrQ(eps),
#   baseline vs Soft MoE, 26 games, 100k agent steps: §5.2's text-only claim, no figure), cql-fig11
#
# Budgets: smoke = seconds per task on a CPU; reduced = the budget of the repository's results (results/*/README.md);
# paper = the paper's. One task per (game, variant, seed); --slurm submits them as one job array (with --dry-run it
# prints the job script); everything after -- goes to every task. benchmark/suites.py holds the suites. At --budget
# paper every launch and --dry-run first prints the compute the tasks need: agent steps, placements or gradient steps,
# and GPU- and core-hours at the rates measured in this repository, each named (docs/benchmark.md has the table).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
case "${1:-}" in
  report) shift; exec "$PY" benchmark/report.py "$@" ;;
  ""|-h|--help) sed -n '2,28p' "$0"; exit 0 ;;
  *) exec "$PY" benchmark/suites.py "$@" ;;
esac
