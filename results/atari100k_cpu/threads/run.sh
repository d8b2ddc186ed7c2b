#!/usr/bin/env bash
# usage: run.sh THREADS TAG GAME MOE [PRESET]: 240 s of rainbow_softmoe.py (PRESET drq-eps unless given), Nature CNN,
# seed 7, a progress line every 15 s, into $WORKDIR/TAG.log (WORKDIR defaults to /tmp/thr; its runs/ is scratch)
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
WORKDIR=${WORKDIR:-/tmp/thr}
mkdir -p "$WORKDIR" && cd "$WORKDIR" || exit 1
export OMP_NUM_THREADS=$1 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4000000000
extra=(); [ "$4" = softmoe ] && extra=(--num-experts 4)
timeout -s INT 240 "$ROOT/.venv/bin/python" "$ROOT/algos/rainbow_softmoe.py" --preset "${5:-drq-eps}" --env-id "ALE/$3-v5" \
  --encoder nature --moe "$4" "${extra[@]}" --seed 7 --exp-name "thr_$2" --log-every-seconds 15 --total-timesteps 100000 \
  > "$WORKDIR/$2.log" 2>&1
