#!/usr/bin/env bash
# Threads x runs in one sitting (nothing else running): Table 1's process (40 runs) and 10 runs at 1 and 2 torch
# threads, alternating, twice; then Table 1's 40 runs as two processes of 20, one per core. Appends to threads.txt.
cd "$(dirname "$0")" || exit 1
O=threads.txt
echo "# $(date -u) commit $(git rev-parse --short HEAD); tag threads runs sps wall torch_threads" >> $O
for rep in 1 2; do
  bash one.sh single 1 0,1 dsilu sigmoid silu relu >> $O
  bash one.sh single 2 0,1 dsilu sigmoid silu relu >> $O
  bash one.sh single 1 0,1 dsilu >> $O
  bash one.sh single 2 0,1 dsilu >> $O
done
bash one.sh pair_core0 1 0 dsilu sigmoid >> $O & bash one.sh pair_core1 1 1 silu relu >> $O; wait
echo "# done $(date -u)" >> $O
