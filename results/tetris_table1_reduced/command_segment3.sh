#!/usr/bin/env bash
# Segment 3: the segment-2 checkpoint (4,000 episodes per run) continued towards 10,000 episodes per run, the budget
# issue 11 asks for (the traces restart at resume, as on any resume). SIGTERM after 2 h 20 min writes everything reached.
# Resumes the newest segment-2 checkpoint in runs/; as run: --resume runs/
#   SZTetris-v0__table1_reduced_seg2__shallow-dsilu+sigmoid+silu+relu__1__1795433848/td_lambda_tetris.pt (not committed).
cd "$(dirname "$0")"
ckpt=$(ls -t runs/*__table1_reduced_seg2__*/td_lambda_tetris.pt 2>/dev/null | head -n 1)
[ -n "$ckpt" ] || { echo "error: no segment-2 checkpoint in runs/: run command_segment2.sh first"; exit 1; }
OMP_NUM_THREADS=1 exec timeout -s TERM 8400 ../../.venv/bin/python ../../algos/td_lambda_tetris.py --network shallow \
  --activation dsilu sigmoid silu relu --num-runs 10 --total-episodes 10000 --reward-timing next --save-model \
  --resume "$ckpt" --write-every-minutes 3 --log-every-seconds 60 --exp-name table1_reduced_seg3
