#!/usr/bin/env bash
# status.sh - which lab daemons run (by pid file + cmdline), node states, endpoints.
# Exit 0 when every daemon is up, 1 otherwise.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export SLURM_CONF
[ -z "$SLURM_PREFIX" ] || PATH=$SLURM_PREFIX/bin:$PATH
up=0 down=0
while read -r name pidfile want; do
  if pid=$(lab_pid "$pidfile" "$want"); then
    printf '  %-16s up    pid %s\n' "$name" "$pid"; up=$((up + 1))
  else
    printf '  %-16s down\n' "$name"; down=$((down + 1))
  fi
done <<< "$DAEMONS"
echo "LAB_DIR=$LAB_DIR: $up up, $down down"
if lab_pid "$RUN/slurmctld.pid" slurmctld >/dev/null; then
  timeout 10 sinfo -N -o '%N %T %E' 2>&1 | sed 's/^/  /'
  for n in "$LAB_DIR"/nodes/*/nvml/scenario.json; do
    [ -L "$n" ] && printf '  %s scenario: %s\n' "$(basename "$(dirname "$(dirname "$n")")")" "$(basename "$(readlink "$n")")"
  done
fi
for u in "pushgateway http://127.0.0.1:$PUSHGW_PORT/-/ready" "prometheus http://127.0.0.1:$PROM_PORT/-/ready"; do
  curl -sf -o /dev/null --max-time 2 "${u#* }" && echo "  ${u%% *} ready: ${u#* }" || echo "  ${u%% *} not ready"
done
[ -f "$LAB_DIR/env.sh" ] && echo "source $LAB_DIR/env.sh"
[ "$down" = 0 ]
