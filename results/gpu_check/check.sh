#!/usr/bin/env bash
# The CUDA side of the scripts after the shared Atari module (envs/atari.py, the Network dataclass, FrameReplay.FIELDS):
# 1. the whole test suite on a GPU machine (--device auto picks CUDA there, and tests/test_cuda_graph.py runs);
# 2. agent steps/s before (OLD: the scripts of the commit before the module, unpacked into .old/) and after (this tree),
#    alternating old/new, on gpu_speed's budget (Breakout, 10,000 steps, learning from 1,000, replay 10,000).
# Run from the repository root on the GPU machine, with the wheels in .whl/ and the old scripts in .old/:
#   git archive 33d1c84^ algos envs | tar -x -C .old
#   bash results/gpu_check/check.sh            # OUT=<dir> for the outputs (default /tmp/out)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; python3 --version
  python3 -c "import torch; print(torch.__version__)"; cat .old/.commit_new 2>/dev/null || git rev-parse HEAD; } | tee "$OUT/machine.txt"

timeout "${PYTEST_SECONDS:-170}" python3 -m pytest -q -n "${WORKERS:-12}" -p no:cacheprovider -rs tests \
  >"$OUT/pytest.txt" 2>&1
echo "pytest rc $?"; tail -n 3 "$OUT/pytest.txt"

log=$OUT/bench_log.txt table=$OUT/sps.tsv
printf "round\tcode\tconfiguration\tsteps_per_second\twall_s\n" >"$table"
flags=(--env-id ALE/Breakout-v5 --total-timesteps 10000 --learning-starts 1000 --buffer-size 10000 --analysis-every 0
       --device cuda --cuda-graph --exp-name gpu_check)
measure() {  # round code configuration script flags...
  local round=$1 code=$2 name=$3 script=$4 t0=$SECONDS; shift 4
  echo "+ [$code] $script $*" >>"$log"
  (cd /tmp && timeout 150 python3 "$script" "${flags[@]}" "$@" >/tmp/last.txt 2>&1)
  local rc=$? sps
  tail -n 4 /tmp/last.txt >>"$log"
  sps=$(grep "^done:" /tmp/last.txt | sed -E 's/.* ([0-9,]+) steps\/s.*/\1/' | tr -d ,)
  echo "rc $rc, $((SECONDS - t0)) s" >>"$log"
  printf "%s\t%s\t%s\t%s\t%s\n" "$round" "$code" "$name" "${sps:-?}" "$((SECONDS - t0))" | tee -a "$table"
}
for round in 1 2; do
  order=(old new); [ $round = 2 ] && order=(new old)  # neither side always goes first
  for code in "${order[@]}"; do
    root=$PWD; [ "$code" = old ] && root=$PWD/.old
    measure $round $code dqn_nature_none "$root/algos/dqn_softmoe.py" --encoder nature --moe none
    measure $round $code rainbow_impala_softmoe8 "$root/algos/rainbow_softmoe.py"
  done
done
