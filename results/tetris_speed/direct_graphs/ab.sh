# ab.sh: alternating pairs, before (commit 4d06346, torch.compile's two graphs, checked out at $OLD) and after
# (compile_graph: the same two graphs called directly; $NEW, default the checkout that holds this script; measured:
# commit 1525150), --compile, two threads, 100 s each, the Atari queue paused (SIGSTOP). Steady rate = placements
# between the third and the last progress line / elapsed. The Python of this checkout's .venv runs both.
# Usage: OLD=<checkout of 4d06346> [NEW=<checkout>] bash ab.sh PAIRS   (writes <config>_<old|new><i>.txt and appends
# to summary.txt)
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OLD=$(cd "${OLD:?a checkout of commit 4d06346}" && pwd) || exit 1
NEW=$(cd "${NEW:-$ROOT}" && pwd) || exit 1
cd "$(dirname "$0")"
for i in $(seq 1 "${1:-3}"); do
  for config in 40 10; do
    if [ $config = 40 ]; then act="dsilu sigmoid silu relu"; else act="dsilu"; fi
    for v in old new; do
      root=$NEW; [ $v = old ] && root=$OLD
      OMP_NUM_THREADS=2 timeout -s TERM 100 "$ROOT/.venv/bin/python" "$root/algos/td_lambda_tetris.py" \
        --activation $act --num-runs 10 --total-episodes 100000 --log-every-seconds 10 --write-every-minutes 100 \
        --exp-name ab --compile > r${config}_$v$i.txt 2>&1
      python3 - r${config}_$v$i.txt $v $config >> summary.txt <<'PY'
import re, sys
L = [l for l in open(sys.argv[1]) if l.startswith("episodes ")]
p = [int(re.search(r"placements ([\d,]+)", l).group(1).replace(",", "")) for l in L]
print(f"runs {sys.argv[3]} {sys.argv[2]}: {len(p)} lines, steady {(p[-1] - p[2]) // (10 * (len(p) - 3)):,} placements/s")
PY
      tail -1 summary.txt
    done
  done
done
