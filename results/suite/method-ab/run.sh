#!/bin/bash
# A/B: the load generator at 1510e21 (old method) vs this branch (prefill + covering streams), alternated.
cd /work/wt-loadgen
for i in 1 2; do for c in coarse tsc; do for v in old new; do
  if [ $v = old ]; then B=/tmp/old-target/release/tollgate-bench; else B=target/release/tollgate-bench; fi
  $B --impls keyed_gcra,governor_keyed,gcra,governor --keys single,uniform:10000,zipf:10000:1.0,uniform:1000000 \
     --quota allow,deny --threads 1,2 --loop closed --duration 300ms --warmup 100ms --clock $c --no-plots \
     --out /tmp/ab/$v-$c-$i > /tmp/ab/$v-$c-$i.log 2>&1
done; done; done
echo done
