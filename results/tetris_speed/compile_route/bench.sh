#!/usr/bin/env bash
# --compile's two routes side by side: today's (make_fx + compile_fx, graphs called directly) against the public one
# (torch.compile(fullgraph=True, dynamic=False, isolate_recompiles=True) with every guard skipped through
# options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe}; public_route.diff), in alternating order.
#   bash bench.sh OLD_TREE PUB_TREE REPS OUT_DIR [PIDS_TO_PAUSE...]
# OLD_TREE / PUB_TREE: checkouts of the script (PUB_TREE = OLD_TREE + public_route.diff). Each run: one process, one torch
# thread (the --compile default), 2,500 episodes per run, compilation included; placements/s = the run's placements
# (summary.json global_step) over the process's wall time. The PIDs are paused (SIGSTOP) for the measurement and
# continued on any exit.
set -u
OLD=$1 PUB=$2 REPS=$3 OUT=$4; shift 4
PIDS="$*"
PY=${PY:-$(cd "$(dirname "$0")/../../.." && pwd)/.venv/bin/python}
mkdir -p "$OUT"
resume() { for p in $PIDS; do kill -CONT "$p" 2>/dev/null; done; }
trap resume EXIT INT TERM
for p in $PIDS; do kill -STOP "$p"; done
start=$(date +%s)
one() {  # route tree size rep
  local route=$1 tree=$2 size=$3 rep=$4 acts
  if [ "$size" = 40 ]; then acts="dsilu sigmoid silu relu"; else acts="dsilu"; fi
  local dir; dir=$(mktemp -d /tmp/cr_XXXX)
  local log="$OUT/r${size}_${route}${rep}.txt"
  { echo "# $(date -u +%FT%TZ) route=$route tree=$tree commit=$(git -C "$tree" rev-parse --short HEAD) size=$size rep=$rep"
    echo "# paused: $(for p in $PIDS; do echo -n "$p=$(awk '{print $3}' /proc/$p/stat 2>/dev/null) "; done)"
    echo "# load: $(cat /proc/loadavg)"; } > "$log"
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$dir" && env -u OMP_NUM_THREADS PUB=flat PUB_ISO=1 "$PY" "$tree/algos/td_lambda_tetris.py" --activation $acts \
    --num-runs 10 --total-episodes 2500 --compile --log-every-seconds 10 --write-every-minutes 100 \
    --exp-name "r${size}_${route}${rep}") >> "$log" 2>&1
  t1=$(date +%s.%N)
  local steps; steps=$("$PY" -c "import json,glob; print(json.load(open(glob.glob('$dir/runs/*/summary.json')[0]))['global_step'])")
  echo "# wall_s=$(echo "$t1 - $t0" | bc) placements=$steps placements_per_s=$(echo "$steps / ($t1 - $t0)" | bc)" >> "$log"
  tail -1 "$log"
  rm -rf "$dir"
}
for rep in $(seq 1 "$REPS"); do
  if [ $(( $(date +%s) - start )) -gt 600 ]; then echo "stopping before rep $rep: 10 minutes paused"; break; fi
  if [ $((rep % 2)) = 1 ]; then order="old pub"; else order="pub old"; fi
  for size in 40 10; do
    for route in $order; do
      if [ $route = old ]; then tree=$OLD; else tree=$PUB; fi
      echo -n "rep $rep size $size $route: "; one $route "$tree" $size $rep
    done
  done
done
