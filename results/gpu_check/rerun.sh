#!/usr/bin/env bash
# The second call of the check: the two tests fixed after the first call, sarsa's train-and-resume on CUDA (its
# pytest fixture records a video, which needs moviepy's 68 MB ffmpeg wheel: too large to carry), and two more
# alternating rounds of the Rainbow default (old/new). Same setup as check.sh.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -n 3 -p no:cacheprovider tests/test_compact_checkpoint.py \
  "tests/test_dqn_softmoe.py::test_phi_adam_eps_gives_phi_its_own_eps_and_leaves_the_rest_at_adam_eps" \
  >"$OUT/pytest_rerun.txt" 2>&1
echo "pytest rc $?"; tail -n 2 "$OUT/pytest_rerun.txt"
R=$PWD; mkdir -p /tmp/sarsa && (cd /tmp/sarsa && ROOT=$R timeout 120 python3 - <<'PY' 2>&1 | tail -n 8 | tee "$OUT/sarsa_cuda.txt"
import os, sys
sys.path.insert(0, os.path.join(os.environ.get("ROOT", "."), "algos"))
import torch
import sarsa_lambda_silu_atari as sarsa
kw = dict(env_id="ALE/Breakout-v5", max_episode_frames=600, log_every_seconds=1000.0, num_envs=2, device=os.environ.get("DEV", "cuda"),
          save_model=True)
first = sarsa.main(sarsa.Args(total_episodes=3, **kw))
a, b = (sarsa.main(sarsa.Args(total_episodes=4, resume=first["checkpoint"], **kw)) for _ in range(2))
ca, cb = (torch.load(s["checkpoint"], map_location="cpu", weights_only=True) for s in (a, b))
same = a["run_name"] != b["run_name"] and torch.equal(ca["theta"], cb["theta"]) and ca["global_step"] == cb["global_step"]
print(f"sarsa on CUDA: 3 episodes, resumed twice to 4: theta identical {same}, steps {ca['global_step']}, "
      f"theta on {ca['theta'].device} of shape {tuple(ca['theta'].shape)}")
PY
)
log=$OUT/bench_log_rerun.txt table=$OUT/sps_rerun.tsv
printf "round\tcode\tconfiguration\tsteps_per_second\twall_s\n" >"$table"
flags=(--env-id ALE/Breakout-v5 --total-timesteps 10000 --learning-starts 1000 --buffer-size 10000 --analysis-every 0
       --device cuda --cuda-graph --exp-name gpu_check)
for round in 3 4; do
  order=(old new); [ $round = 4 ] && order=(new old)
  for code in "${order[@]}"; do
    root=$PWD; [ "$code" = old ] && root=$PWD/.old
    t0=$SECONDS
    (cd /tmp && timeout 100 python3 "$root/algos/rainbow_softmoe.py" "${flags[@]}" >/tmp/last.txt 2>&1)
    tail -n 2 /tmp/last.txt >>"$log"
    sps=$(grep "^done:" /tmp/last.txt | sed -E 's/.* ([0-9,]+) steps\/s.*/\1/' | tr -d ,)
    printf "%s\t%s\t%s\t%s\t%s\n" "$round" "$code" rainbow_impala_softmoe8 "${sps:-?}" "$((SECONDS - t0))" | tee -a "$table"
  done
done
