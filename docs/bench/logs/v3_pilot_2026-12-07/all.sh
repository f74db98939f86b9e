#!/bin/bash
R=/tmp/pilot/run1.sh
declare -A O
O[fgd_all]="rolloutpipe.cpu.system_cores=all"
O[fgd_trn]="rolloutpipe.cpu.system_cores=trainer"
O[fgd_trn_nice]="rolloutpipe.cpu.system_cores=trainer rolloutpipe.cpu.trainer_nice=19"
O[sync_all]="rolloutpipe.mode=sync rolloutpipe.cpu.system_cores=all"
O[sync_trn]="rolloutpipe.mode=sync rolloutpipe.cpu.system_cores=trainer"
for r in 1 2; do
  if [ $r = 1 ]; then order="fgd_all fgd_trn sync_all sync_trn fgd_trn_nice"; else order="fgd_trn_nice sync_trn sync_all fgd_trn fgd_all"; fi
  for n in $order; do $R ${n}_r$r ${O[$n]}; done
done
