#!/usr/bin/env bash
# usage: run.sh THREADS TAG GAME MOE
cd /tmp/thr
export OMP_NUM_THREADS=$1 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4000000000
extra=(); [ "$4" = softmoe ] && extra=(--num-experts 4)
timeout -s INT 240 /work/main/.venv/bin/python /work/main/algos/rainbow_softmoe.py --preset drq-eps --env-id ALE/$3-v5 \
  --encoder nature --moe $4 "${extra[@]}" --seed 7 --exp-name thr_$2 --log-every-seconds 15 --total-timesteps 100000 > /tmp/thr/$2.log 2>&1
