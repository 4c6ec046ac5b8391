# common.sh - shared settings and helpers for lab/up.sh, lab/down.sh, lab/status.sh.
# Sourced, not executed. Everything the lab creates lives under $LAB_DIR.
LAB_DIR=${LAB_DIR:-/tmp/slurm-lab}
LAB_NODES=${LAB_NODES:-4}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE="$REPO/lab"
# What the lab's hooks, SPANK plugin and fake GPUs run from: the checkout itself, or, when
# the job user cannot reach it (a clone under Debian's 0700 /root), the copy that lab/up.sh
# keeps in $LAB_DIR/checkout.
RUN_REPO=$REPO
[ -d "${LAB_DIR:-/tmp/slurm-lab}/checkout/slurm_triage" ] && RUN_REPO="${LAB_DIR:-/tmp/slurm-lab}/checkout"
# SLURM_PREFIX: the lab runs the Slurm installed under this prefix (built from source, e.g.
# /opt/slurm-24.11, configured with --sysconfdir=$SLURM_PREFIX/etc; docs/slurm-24.11.md)
# instead of Debian's packages (empty, the default). Its sbin/ and bin/ come first on PATH.
SLURM_PREFIX=${SLURM_PREFIX:-}
LAB_PATH=${SLURM_PREFIX:+$SLURM_PREFIX/sbin:$SLURM_PREFIX/bin:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN="$LAB_DIR/run"
SLURM_CONF="$LAB_DIR/etc/slurm.conf"
PUSHGW_PORT=${PUSHGW_PORT:-9091}
PROM_PORT=${PROM_PORT:-9090}
NODE_EXPORTER_PORT=${NODE_EXPORTER_PORT:-9100}
DB_PORT=${DB_PORT:-13306}
DBD_PORT=${DBD_PORT:-6819}
CTLD_PORT=${CTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
# node i listens on NODE_PORT_BASE+i (17001..)
NODE_PORT_BASE=${NODE_PORT_BASE:-17000}
# The jobs' user. A second lab on this machine needs its own (LAB_USER=...): Lab.reset() SIGKILLs
# every process of its user, and the Epilog's leftover checks judge that user's processes.
TEST_USER=${LAB_USER:-triage-test}
TEST_UID=${LAB_UID:-4242}
# The lab's daemons: "name pidfile cmdline-substring", in start order. The pid
# file is trusted only when /proc/PID/cmdline contains the substring.
DAEMONS="munged $LAB_DIR/munge/munged.pid munged
mariadbd $RUN/mariadbd.pid mariadbd
slurmdbd $RUN/slurmdbd.pid slurmdbd
slurmctld $RUN/slurmctld.pid slurmctld"
for _i in $(seq 1 "$LAB_NODES"); do
  DAEMONS+=$'\n'"slurmd.node$_i $RUN/slurmd.node$_i.pid slurmd"
done
DAEMONS+="
pushgateway $RUN/pushgateway.pid prometheus-pushgateway
node-exporter $RUN/node-exporter.pid prometheus-node-exporter
prometheus $RUN/prometheus.pid prometheus"
unset _i

log() { printf '[lab %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { printf '[lab] ERROR: %s\n' "$*" >&2; exit 1; }

# lab_pid <pidfile> <substring>: print the live pid recorded in <pidfile> if its
# cmdline matches (guards against recycled pids); fail otherwise.
lab_pid() {
  local pid cmd
  [ -f "$1" ] || return 1
  pid=$(tr -dc 0-9 < "$1")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  case "$cmd" in *"$2"*) echo "$pid" ;; *) return 1 ;; esac
}

# spawn PIDFILE LOG CMD...: start a daemon that does not daemonize itself in a session of
# its own (so it outlives the shell that started it, like the Slurm daemons do), with the
# minimal environment, and record its pid: the sh writes its own pid, then execs CMD.
spawn() {
  local pidfile=$1 logfile=$2; shift 2
  "${CLEAN_ENV[@]}" setsid sh -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "$@" >"$logfile" 2>&1 </dev/null &
}
