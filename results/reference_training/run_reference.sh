#!/usr/bin/env bash
# The reference's own training on Breakout, seed 1 (SEED=<n> for another), both arms (labs/moes DER.gin: Soft MoE
# with 4 experts, and its BASELINE), one process per arm pinned to a core of its own (CORE, default 0 for softmoe and
# 1 for baseline: XLA spreads an update over every core it may use, so two unpinned runs contend; its multi-threaded
# Eigen is off), with the changes of dopamine_reference.CHANGES (noise_factorised: 0.3-0.5 s an update), resumable:
# the runner checkpoints after every 2,000-step iteration (the evaluation at 100k only: README) into the arm's
# work/dopamine_Breakout_<arm>_s<seed>/checkpoints and restarts from the latest.
#
#   DOPAMINE=../dopamine bash results/reference_training/run_reference.sh softmoe   # or baseline
#   SEED=2 CORE=0 DOPAMINE=../dopamine bash results/reference_training/run_reference.sh baseline
#
# Needs .refvenv (README) and a checkout of google/dopamine at 5873f54.
set -euo pipefail
cd "$(dirname "$0")/../.."
arm=${1:?usage: run_reference.sh softmoe|baseline}
case "$arm" in softmoe) moe=SOFTMOE core=0 ;; baseline) moe=BASELINE core=1 ;; *) echo "unknown arm $arm"; exit 1 ;; esac
seed=${SEED:-1}
base=results/reference_training/work/dopamine_Breakout_${arm}_s$seed
mkdir -p "$base"
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" OMP_NUM_THREADS=1
exec taskset -c "${CORE:-$core}" .refvenv/bin/python -W ignore results/reference_training/train.py --dopamine-dir "${DOPAMINE:?set DOPAMINE to a dopamine checkout}" \
  --game Breakout --moe-type "$moe" --seed "$seed" --base-dir "$base" --iteration-steps 2000 --num-iterations 50 \
  --eval-every 50 >>"$base/train_log.txt" 2>&1
