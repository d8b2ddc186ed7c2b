#!/usr/bin/env bash
# One measurement: TAG THREADS CPUS ACTIVATION... -> "TAG threads runs placements/s wall_s torch_threads", read from
# summary.json (placements over the whole wall time, compilation included). 10 runs per activation, 2,500 episodes.
tag=$1; threads=$2; cpus=$3; shift 3
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
d=$(mktemp -d); cd "$d" || exit 1
OMP_NUM_THREADS=$threads taskset -c "$cpus" "$ROOT/.venv/bin/python" "$ROOT/algos/td_lambda_tetris.py" --activation "$@" \
  --num-runs 10 --total-episodes 2500 --compile --log-every-seconds 1000 --exp-name sp > log.txt 2>&1
python3 -c "import json,glob; s=json.load(open(glob.glob('runs/*/summary.json')[0])); print('$tag', $threads, 10*$#, round(s['sps']), round(s['wall_time'],1), s['torch_threads'])"
rm -rf "$d"
