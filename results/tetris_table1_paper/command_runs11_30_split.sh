#!/usr/bin/env bash
# Table 1's runs 11-30 from the split on: the 80 runs of command_runs11_30.sh as two processes of 40 (runs 11-20 and
# runs 21-30 of each activation), one core and one torch thread each, every setting as command_runs11_30.sh. The
# state at the split is state_runs11_30.npz; `python milestone.py split state_runs11_30.npz runs/split` cuts it in
# two packs and `python milestone.py unpack` turns each into a checkpoint (README, "Resume and reproduce").
#   bash command_runs11_30_split.sh 11 --resume runs/split/state_runs11_20.pt   # runs 11-20
#   bash command_runs11_30_split.sh 21 --resume runs/split/state_runs21_30.pt   # runs 21-30
cd "$(dirname "$0")"
first=${1:?usage: bash command_runs11_30_split.sh 11|21 --resume <checkpoint>}
shift
exec ../../.venv/bin/python ../../algos/td_lambda_tetris.py --activation dsilu sigmoid silu relu \
  --seed "$first" --num-runs 10 --total-episodes 200000 --compile --save-model \
  --exp-name "table1_runs${first}_$((first + 9))" "$@"
