#!/usr/bin/env bash
# Issue 9 §3 on a GPU: CleanRL's dqn_atari.py and rainbow_atari.py against dqn_softmoe.py and rainbow_softmoe.py, one
# after the other on the same machine, at the CPU speed table's settings (Breakout, learning from step 1,000, a buffer
# of 10,000, one update per 4 steps; CleanRL's DQN copies its target every 1,000 steps, so ours does too), ours in
# eager mode and with --cuda-graph (EAGER=0 or GRAPHS=0 leaves one out).
#
#   bash results/gpu_speed/bench.sh prepare CLEANRL_CHECKOUT   # here: copy and patch CleanRL into .gpu/
#   bash results/gpu_speed/bench.sh run OUTDIR STEPS ROUNDS     # there, from the repository root
#
# prepare copies CleanRL's two scripts and cleanrl_utils/{__init__,atari_wrappers,buffers}.py (measured: CleanRL commit
# fe8d8a03) into the git-ignored .gpu/cleanrl/ and applies the patches that gymnasium 1.x and numpy 2 need: the
# wrappers' new names (GrayscaleObservation, FrameStackObservation), ale_py's registration, and single-env rows passed
# to the Rainbow buffer's add. Nothing of CleanRL is committed here. The GPU machine has no gymnasium, ale-py or tyro:
# their wheels travel in the git-ignored .whl/ (see the README's GPU speed section) and are installed to /tmp/site.
set -uo pipefail
mode=${1:?usage: bench.sh prepare CLEANRL_CHECKOUT | run OUTDIR STEPS ROUNDS}

if [ "$mode" = prepare ]; then
  src=${2:?CleanRL checkout}
  mkdir -p .gpu/cleanrl/cleanrl_utils
  cp "$src"/cleanrl/dqn_atari.py "$src"/cleanrl/rainbow_atari.py .gpu/cleanrl/
  for f in __init__.py atari_wrappers.py buffers.py; do cp "$src/cleanrl_utils/$f" .gpu/cleanrl/cleanrl_utils/; done
  for f in .gpu/cleanrl/dqn_atari.py .gpu/cleanrl/rainbow_atari.py; do
    sed -i 's/gym.wrappers.GrayScaleObservation(env)/gym.wrappers.GrayscaleObservation(env)/;
            s/gym.wrappers.FrameStack(env, 4)/gym.wrappers.FrameStackObservation(env, 4)/;
            s/^import gymnasium as gym$/import ale_py\nimport gymnasium as gym\n\ngym.register_envs(ale_py)/' "$f"
  done
  sed -i 's/        rb.add(obs, actions, rewards, real_next_obs, terminations)/        rb.add(obs[0], actions[0], rewards[0], real_next_obs[0], terminations[0])/' \
    .gpu/cleanrl/rainbow_atari.py
  exit 0
fi

out=${2:?OUTDIR}
steps=${3:-10000}
rounds=${4:-1}
PY=${PYTHON:-python3}
root=$PWD
log="$out/bench_log.txt"
table="$out/sps.tsv"
[ -f "$table" ] || printf "round\tscript\tsteps_per_second\n" >"$table"
common=(--total-timesteps "$steps" --learning-starts 1000 --buffer-size 10000)
ours=(--env-id ALE/Breakout-v5 "${common[@]}" --analysis-every 0 --device cuda --exp-name gpu_speed)

measure() {  # name, then the command; the steps/s it reports goes to the table (ONLY=REGEX picks names)
  local name=$1
  shift
  [[ $name =~ ${ONLY:-.} ]] || return 0
  echo "+ $*" >>"$log"
  local t0=$SECONDS
  timeout 300 "$@" >"$out/last.txt" 2>&1
  local rc=$?
  grep -v "^global_step=\|^SPS:" "$out/last.txt" | tail -n 6 >>"$log"
  local sps
  if grep -q "^SPS:" "$out/last.txt"; then  # CleanRL prints global_step / elapsed every 100 updates
    sps=$(grep "^SPS:" "$out/last.txt" | tail -n 1 | awk '{print $2}')
  else  # ours: the final line's whole-run steps/s
    sps=$(grep "^done:" "$out/last.txt" | sed -E 's/.* ([0-9,]+) steps\/s.*/\1/' | tr -d ,)
  fi
  echo "rc $rc, $((SECONDS - t0)) s, steps/s ${sps:-?}" >>"$log"
  printf "%s\t%s\t%s\n" "$round" "$name" "${sps:-?}" >>"$table"
}

for round in $(seq 1 "$rounds"); do
  if [ "${EAGER:-1}" = 1 ]; then  # CleanRL and ours in eager mode
  cd "$root/.gpu/cleanrl" || exit 1
  measure cleanrl_dqn_atari "$PY" dqn_atari.py --env-id BreakoutNoFrameskip-v4 "${common[@]}"
  cd "$root" || exit 1
  measure ours_dqn_nature_none "$PY" algos/dqn_softmoe.py "${ours[@]}" --encoder nature --moe none \
    --target-network-frequency 1000
  measure ours_dqn_nature_softmoe8 "$PY" algos/dqn_softmoe.py "${ours[@]}" --encoder nature
  cd "$root/.gpu/cleanrl" || exit 1
  measure cleanrl_rainbow_atari "$PY" rainbow_atari.py --env-id BreakoutNoFrameskip-v4 "${common[@]}"
  cd "$root" || exit 1
  measure ours_rainbow_nature_none "$PY" algos/rainbow_softmoe.py "${ours[@]}" --encoder nature --moe none
  measure ours_rainbow_nature_softmoe8 "$PY" algos/rainbow_softmoe.py "${ours[@]}" --encoder nature
  measure ours_rainbow_impala_softmoe8 "$PY" algos/rainbow_softmoe.py "${ours[@]}"
  fi
  if [ "${GRAPHS:-1}" = 1 ]; then  # the same with --cuda-graph
    measure ours_dqn_nature_none_graph "$PY" algos/dqn_softmoe.py "${ours[@]}" --encoder nature --moe none \
      --target-network-frequency 1000 --cuda-graph
    measure ours_dqn_nature_softmoe8_graph "$PY" algos/dqn_softmoe.py "${ours[@]}" --encoder nature --cuda-graph
    measure ours_rainbow_nature_none_graph "$PY" algos/rainbow_softmoe.py "${ours[@]}" --encoder nature --moe none \
      --cuda-graph
    measure ours_rainbow_nature_softmoe8_graph "$PY" algos/rainbow_softmoe.py "${ours[@]}" --encoder nature --cuda-graph
    measure ours_rainbow_impala_softmoe8_graph "$PY" algos/rainbow_softmoe.py "${ours[@]}" --cuda-graph
  fi
done
rm -f "$out/last.txt"
cat "$table"
