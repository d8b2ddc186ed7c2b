# ab_compiled.sh: three alternating pairs, before (commit 7be9c61 checked out at $OLD) and after ($NEW, default the
# checkout that holds this script; measured: commit 02ff3ee), 40 runs, --compile, two threads, 100 s each, the Atari job
# paused; steady rate = placements between the third and the last progress line. Writes c_<old|new><i>.txt to the
# current directory.
#   OLD=<checkout of 7be9c61> [NEW=<checkout>] bash results/tetris_speed/scalar_engine/ab_compiled.sh
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OLD=$(cd "${OLD:?a checkout of commit 7be9c61}" && pwd) || exit 1
NEW=$(cd "${NEW:-$ROOT}" && pwd) || exit 1
for i in 1 2 3; do for v in old new; do root=$NEW; [ $v = old ] && root=$OLD; OMP_NUM_THREADS=2 timeout -s TERM 100 "$ROOT/.venv/bin/python" "$root/algos/td_lambda_tetris.py" --activation dsilu sigmoid silu relu --num-runs 10 --total-episodes 100000 --log-every-seconds 10 --write-every-minutes 100 --exp-name bc --compile > c_$v$i.txt 2>&1; python3 - c_$v$i.txt $v <<'PY'
import re, sys
L = [l for l in open(sys.argv[1]) if l.startswith("episodes ")]
p = [int(re.search(r"placements ([\d,]+)", l).group(1).replace(",", "")) for l in L]
print(sys.argv[2], len(p), (p[-1] - p[2]) // (10 * (len(p) - 3)))
PY
done; done
