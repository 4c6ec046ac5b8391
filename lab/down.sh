#!/usr/bin/env bash
# down.sh - stop what lab/up.sh started: by the PID in each pid file, after checking
# /proc/PID/cmdline (never pkill). Removes the /etc/slurm/slurm.conf link if it is the
# lab's. Idempotent. LAB_PURGE=1 also deletes $LAB_DIR. Packages stay installed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export SLURM_CONF
PATH=$LAB_PATH
T0=$(date +%s.%N)
[ "$(id -u)" = 0 ] || die "run as root"
[ -d "$LAB_DIR" ] || { log "no $LAB_DIR: nothing to do"; exit 0; }

# stop <name...>: SIGTERM the named daemons, wait up to 15 s, then SIGKILL by pid.
stop() {
  local want_names=" $* " name pidfile want pid pids="" i
  while read -r name pidfile want; do
    case "$want_names" in *" $name "*) ;; *) continue ;; esac
    if pid=$(lab_pid "$pidfile" "$want"); then
      kill -TERM "$pid" 2>/dev/null && pids+="$pid:$name "
    fi
    rm -f "$pidfile"
  done <<< "$DAEMONS"
  for i in $(seq 1 75); do
    local alive=0 e
    for e in $pids; do kill -0 "${e%%:*}" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  for e in $pids; do
    if kill -0 "${e%%:*}" 2>/dev/null; then
      log "${e#*:} (pid ${e%%:*}) ignored SIGTERM for 15 s: SIGKILL"; kill -KILL "${e%%:*}" 2>/dev/null
    fi
    log "stopped ${e#*:} (pid ${e%%:*})"
  done
}

# Cancel jobs while the controller is up, so every slurmstepd ends cleanly.
if lab_pid "$RUN/slurmctld.pid" slurmctld >/dev/null; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 1 40); do [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi
slurmds=$(seq -f 'slurmd.node%g' 1 "$LAB_NODES" | tr '\n' ' ')
# shellcheck disable=SC2086
stop prometheus node-exporter pushgateway $slurmds
stop slurmctld                  # its slurmscriptd child exits with it
stop slurmdbd mariadbd munged   # nothing needs them once slurmctld has saved its state

# A slurmstepd of this lab that outlived its slurmd (it holds files under $LAB_DIR).
for c in /proc/[0-9]*/comm; do
  read -r comm < "$c" 2>/dev/null && [ "$comm" = slurmstepd ] || continue
  p=${c%/comm}
  if ls -l "$p/fd" 2>/dev/null | grep -q -- "$LAB_DIR/"; then
    log "killing leftover slurmstepd pid ${p#/proc/}"; kill -KILL "${p#/proc/}" 2>/dev/null
  fi
done

if [ -f "$RUN/etc-link" ]; then
  l=$(cat "$RUN/etc-link")
  if [ -L "$l" ] && [ "$(readlink "$l")" = "$SLURM_CONF" ]; then rm -f "$l" && log "removed $l"; fi
  rm -f "$RUN/etc-link"
fi
rm -f "$LAB_DIR/env.sh"
[ "${LAB_PURGE:-0}" = 1 ] && rm -rf "$LAB_DIR" && log "removed $LAB_DIR"
log "down in $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $T0}")s"
