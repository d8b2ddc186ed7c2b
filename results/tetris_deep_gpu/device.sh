#!/usr/bin/env bash
# Run on a lent GPU machine from the repository root (torch there; tyro, docstring_parser, typeguard, gymnasium,
# cloudpickle and farama_notifications carried as wheels in .whl/). Writes everything to $OUT/device.tgz:
#   1. speed: placements/s of the deep net (silu-dsilu) at 40 and 400 batched runs, and of the shallow net (eager,
#      Table 1's four activations) at 40 and 400 runs, one after the other, SPEED_SECONDS each;
#   2. the deep rows of Table 1: SiLU-dSiLU, SiLU-SiLU, ReLU-ReLU, 5 runs each, one process per activation side by
#      side on the one GPU, stopped by SIGINT after DEEP_SECONDS (summary, learning curve and checkpoint written).
set -uo pipefail
ROOT=$PWD
OUT=${OUT:-/tmp/out}
W=/tmp/work
mkdir -p "$OUT" "$W"
"${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$ROOT || exit 1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
TD="$PY $ROOT/algos/td_lambda_tetris.py --device ${DEVICE:-cuda} --log-every-seconds 5"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  lscpu | grep -E "Model name|^CPU\(s\)"; git -C "$ROOT" rev-parse HEAD 2>/dev/null; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt"

speed() {  # name seconds flags...
  local name=$1 seconds=$2; shift 2
  (cd "$W" && timeout -s INT "$seconds" $TD --exp-name "speed_$name" "$@" > "$W/speed_$name.log" 2>&1)
  echo "== speed $name"; grep -E "^episodes" "$W/speed_$name.log" | tail -n 2
}
S=${SPEED_SECONDS:-40}
speed deep40 "$S" --network deep --activation silu-dsilu --num-runs 40
speed deep400 "$((S + 10))" --network deep --activation silu-dsilu --num-runs 400
speed shallow40 "$S" --activation dsilu sigmoid silu relu --num-runs 10
speed shallow400 "$S" --activation dsilu sigmoid silu relu --num-runs 100

for act in silu-dsilu silu-silu relu-relu; do
  (cd "$W" && timeout -s INT "${DEEP_SECONDS:-300}" $TD --network deep --activation "$act" --num-runs 5 \
     --exp-name deep_rows --save-model > "$W/deep_$act.log" 2>&1) &
done
wait
for act in silu-dsilu silu-silu relu-relu; do echo "== deep $act"; tail -n 4 "$W/deep_$act.log"; done
du -sh "$W"/runs/*/td_lambda_tetris.pt
tar czf "$OUT/device.tgz" -C "$W" --exclude='events.out.tfevents*' --exclude='*.pt' .
ls -la "$OUT"
