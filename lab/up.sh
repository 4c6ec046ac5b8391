#!/usr/bin/env bash
# up.sh - bring up the slurm-triage lab on one machine, as root, from nothing:
# munged, a private MariaDB, slurmdbd, slurmctld, LAB_NODES x slurmd (node1..),
# Pushgateway, node_exporter and Prometheus, all on 127.0.0.1, with fake GPUs per
# node. Idempotent: a running lab is left as it is. Works with Slurm 22.05 (Debian 12)
# and 24.11 (Debian 13).
#
# Knobs: LAB_DIR=/tmp/slurm-lab  LAB_NODES=4  LAB_HOOKS=1 (0: no Prolog/Epilog)
#        LAB_INSTALL=auto|0  LAB_KEEP_STATE=0|1  LAB_SCENARIO=h100x8-idle.json
#        LAB_UTS=auto|0|1 (1: Slurm daemons in a UTS namespace with hostname localhost)
#        SLURM_PREFIX= (lab/common.sh: a Slurm built from source under that prefix, e.g. /opt/slurm-24.11)
#        LAB_USER=triage-test LAB_UID=4242 (the jobs' user: a second lab on the machine needs its own)
# Ports (lab/common.sh): CTLD_PORT=6817 SLURMD_PORT=6818 DBD_PORT=6819 NODE_PORT_BASE=17000
#        (node i: NODE_PORT_BASE+i) DB_PORT=13306 PUSHGW_PORT=9091 PROM_PORT=9090 NODE_EXPORTER_PORT=9100
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LAB_HOOKS=${LAB_HOOKS:-1}
LAB_INSTALL=${LAB_INSTALL:-auto}
LAB_SCENARIO=${LAB_SCENARIO:-h100x8-idle.json}
PATH=$LAB_PATH
export SLURM_CONF
# Daemons get a clean, systemd-like environment: slurmd's environment is what the
# Prolog/Epilog and SPANK code see, and an interactive shell's variables would leak.
CLEAN_ENV=(env -i PATH="$LAB_PATH" LANG=C.UTF-8)

T0=$(date +%s.%N); T_LAST=$T0; TIMINGS=""
phase_done() {
  local now; now=$(date +%s.%N)
  TIMINGS+=$(printf '  %-22s %6.2fs' "$1" "$(awk "BEGIN{print $now - $T_LAST}")")$'\n'
  T_LAST=$now
}
wait_for() {   # wait_for <seconds> <what> <command...>
  local t=$1 what=$2; shift 2
  local end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${t}s waiting for $what (logs: $LAB_DIR/log)"
    sleep 0.2
  done
}
render() {     # render <template> <dest> [mode]: substitute @KEY@ placeholders
  sed -e "s|@LAB_DIR@|$LAB_DIR|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" \
      -e "s|@DB_PORT@|$DB_PORT|g" -e "s|@PUSHGW_PORT@|$PUSHGW_PORT|g" -e "s|@NODES@|$LAB_NODES|g" \
      -e "s|@NODE_EXPORTER_PORT@|$NODE_EXPORTER_PORT|g" -e "s|@PROM_PORT@|$PROM_PORT|g" -e "s|@DB_PASS@|${DB_PASS:-}|g" \
      -e "s|@KIND@|${KIND:-}|g" -e "s|@HOOK@|${HOOK:-}|g" "$1" > "$2"
  chmod "${3:-644}" "$2"
}

[ "$(id -u)" = 0 ] || die "run as root (sudo make lab-up)"
# With CommunicationParameters=NoInAddrAny/NoCtldInAddrAny, Slurm daemons bind the
# address their *hostname* resolves to. Where that is not loopback (a container whose
# hostname maps to its bridge IP), they run in a UTS namespace named "localhost".
LAB_UTS=${LAB_UTS:-auto}
if [ "$LAB_UTS" = auto ]; then
  case "$(getent ahostsv4 "$(hostname)" | awk 'NR==1{print $1}')" in 127.*) LAB_UTS=0 ;; *) LAB_UTS=1 ;; esac
fi
SLURM_DAEMON=("${CLEAN_ENV[@]}")
if [ "$LAB_UTS" = 1 ]; then
  SLURM_DAEMON+=(unshare --uts sh -c 'hostname localhost && exec "$0" "$@"')
fi
[ "$LAB_NODES" -ge 1 ] && [ "$LAB_NODES" -le 9 ] || die "LAB_NODES must be 1..9"

# Idempotence: all daemons alive -> nothing to do; some alive -> refuse (half-up lab).
alive=0; total=0
while read -r name pidfile want; do
  total=$((total + 1))
  lab_pid "$pidfile" "$want" >/dev/null && alive=$((alive + 1))
done <<< "$DAEMONS"
if [ "$alive" = "$total" ] && [ -f "$LAB_DIR/env.sh" ]; then
  log "lab already up ($alive daemons): source $LAB_DIR/env.sh"; exit 0
fi
[ "$alive" = 0 ] || die "lab is half up ($alive/$total daemons alive): run 'make lab-down' first"

# --- 1. packages (only when something is missing) -----------------------------------
PKGS="slurm-wlm slurmctld slurmd slurm-client slurmdbd slurm-wlm-mysql-plugin munge libslurm-dev
prometheus prometheus-pushgateway prometheus-node-exporter mariadb-server gcc make libc6-dev
python3-venv curl util-linux passwd"
if [ -n "$SLURM_PREFIX" ]; then   # Slurm itself comes from the prefix, not from packages
  [ -x "$SLURM_PREFIX/sbin/slurmctld" ] && [ -f "$SLURM_PREFIX/include/slurm/spank.h" ] \
    || die "SLURM_PREFIX=$SLURM_PREFIX has no sbin/slurmctld or include/slurm/spank.h"
  PKGS=$(printf '%s\n' $PKGS | grep -v -e '^slurm' -e '^libslurm' | tr '\n' ' ')
fi
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=" $p"
done
if [ -n "$missing" ]; then
  [ "$LAB_INSTALL" = auto ] || die "missing packages:$missing (LAB_INSTALL=0)"
  log "installing:$missing"
  # Debian's postinst scripts would start munge/slurm*/mariadb/prometheus* (some on
  # 0.0.0.0) through /etc/init.d unless policy-rc.d forbids it.
  tmp_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; tmp_policy=1
  fi
  trap '[ "$tmp_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  [ "$tmp_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  trap - EXIT
fi
SLURM_VERSION=$(slurmd -V | awk '{print $2}')
# The hooks' config defaults (hooks.scontrol, drain.sinfo, triage.sacct, ...) and some tests
# name Debian's /usr/bin paths: lab/slurm-ns runs a command where those are the prefix's.
if [ -n "$SLURM_PREFIX" ] && ! [ /usr/bin/scontrol -ef "$SLURM_PREFIX/bin/scontrol" ]; then
  log "WARNING: /usr/bin/scontrol is not $SLURM_PREFIX's: run this under lab/slurm-ns $SLURM_PREFIX"
fi
phase_done "packages"

# --- 2. repo venv, fake NVML, test user ------------------------------------------------
if [ -z "$SLURM_PREFIX" ]; then make -s -C "$REPO" venv spank; else make -s -C "$REPO" venv; fi
make -s -C "$REPO/tests/fakenvml"
if ! id -u "$TEST_USER" >/dev/null 2>&1; then
  uid_opt=(-u "$TEST_UID"); getent passwd "$TEST_UID" >/dev/null && uid_opt=()
  useradd -m -d "/home/$TEST_USER" -s /bin/bash "${uid_opt[@]}" "$TEST_USER"
  log "created user $TEST_USER (uid $(id -u "$TEST_USER"))"
fi
# The job user's srun dlopens the SPANK plugin, which runs the venv's python, and the
# watcher loads the fake NVML: a clone under a directory closed to others (Debian's /root
# is 0700) would fail every job. Then the lab runs a copy of the checkout in $LAB_DIR; so does
# a SLURM_PREFIX lab: its plugin is built against that Slurm's spank.h (Slurm refuses a plugin
# of another release), while the checkout's serves Debian's Slurm.
mkdir -p "$LAB_DIR" && chmod 755 "$LAB_DIR"
rm -rf "$LAB_DIR/checkout"
RUN_REPO=$REPO
if [ -n "$SLURM_PREFIX" ] || ! runuser -u "$TEST_USER" -- test -r "$REPO/setup.py"; then
  why="$REPO is closed to $TEST_USER"; [ -z "$SLURM_PREFIX" ] || why="the SPANK plugin is built for $SLURM_PREFIX"
  log "$why: the lab runs a copy of it in $LAB_DIR/checkout"
  mkdir -p "$LAB_DIR/checkout"
  tar -C "$REPO" --exclude=./.venv --exclude=./.git --exclude='*/__pycache__' -cf - . | tar -C "$LAB_DIR/checkout" -xf -
  RUN_REPO="$LAB_DIR/checkout"
  [ -z "$SLURM_PREFIX" ] || rm -f "$RUN_REPO/spank/slurm_triage_spank.so"   # the checkout's, for Debian's Slurm
  make -s -C "$RUN_REPO" venv spank ${SLURM_PREFIX:+SLURM_PREFIX="$SLURM_PREFIX"}
  make -s -C "$RUN_REPO/tests/fakenvml"
  chmod -R a+rX "$RUN_REPO"
fi
runuser -u "$TEST_USER" -- test -x "$RUN_REPO/.venv/bin/python" -a -r "$RUN_REPO/spank/slurm_triage_spank.so" \
  || die "$RUN_REPO is not usable by $TEST_USER (its venv or SPANK plugin is missing or closed)"
phase_done "venv, fakenvml, user"

# --- 3. directories and configs -----------------------------------------------------------
mkdir -p "$LAB_DIR"/{etc/plugstack.conf.d,bin,log,state,spool,run,prom/textfile,db}
chmod 755 "$LAB_DIR"
if [ "${LAB_KEEP_STATE:-0}" != 1 ]; then
  # slurmctld would recover old jobs, the job-id counter and DRAIN states.
  rm -rf "$LAB_DIR"/state/* "$LAB_DIR"/spool/* "$LAB_DIR"/prom/data "$LAB_DIR"/db/data \
         "$LAB_DIR"/prom/pushgateway.store "$LAB_DIR"/nodes
fi
rm -f "$LAB_DIR"/log/*.log
install -d -o "$TEST_USER" -g "$(id -g "$TEST_USER")" -m 0755 "$LAB_DIR/work"
E="$LAB_DIR/etc"
render "$HERE/etc/slurm.conf.in" "$E/slurm.conf"
if [ "$LAB_HOOKS" = 1 ]; then
  for KIND in prolog epilog; do
    HOOK="$RUN_REPO/$KIND/slurm-triage-$KIND"
    [ -x "$HOOK" ] || die "$HOOK is missing or not executable (LAB_HOOKS=0 runs the lab without hooks)"
    render "$HERE/etc/hook.sh.in" "$LAB_DIR/bin/$KIND" 755
  done
  printf 'Prolog=%s/bin/prolog\nEpilog=%s/bin/epilog\n' "$LAB_DIR" "$LAB_DIR" >> "$E/slurm.conf"
fi
{
  for i in $(seq 1 "$LAB_NODES"); do
    echo "NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((NODE_PORT_BASE + i)) CPUs=$(nproc) RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} >> "$E/slurm.conf"
# cgroup.conf: slurmd loads a cgroup plugin even with proctrack/linuxproc. 24.05+
# can switch it off ("disabled" does not exist before); 22.05 autodetects, and on a
# cgroup-v2-only host without systemd it must not ask systemd for a scope.
{
  echo "# rendered by lab/up.sh for Slurm $SLURM_VERSION"
  if [ "$(printf '%s\n' "$SLURM_VERSION" 24.05 | sort -V | head -1)" = 24.05 ]; then
    echo "CgroupPlugin=disabled"
  elif [ -e /sys/fs/cgroup/cgroup.controllers ]; then
    printf 'CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n'
  else
    echo "CgroupPlugin=autodetect"
  fi
} > "$E/cgroup.conf"
[ -e "$E/plugstack.conf" ] || echo "include $E/plugstack.conf.d/*.conf" > "$E/plugstack.conf"
# The SPANK plugin, as etc/plugstack.conf.d/slurm-triage.conf shows an admin (without
# --triage it does nothing); tests may rewrite this file, srun re-reads it every step.
echo "required $RUN_REPO/spank/slurm_triage_spank.so python=$RUN_REPO/.venv/bin/python config=$E/slurm-triage.toml gate_timeout=30 hook_timeout=10" \
  > "$E/plugstack.conf.d/slurm-triage.conf"
render "$HERE/etc/slurm-triage.toml.in" "$E/slurm-triage.toml"
render "$HERE/etc/prometheus.yml.in" "$LAB_DIR/prom/prometheus.yml"
mkdir -p "$LAB_DIR/prom/rules" && cp "$RUN_REPO"/etc/prometheus/*.rules.yml "$LAB_DIR/prom/rules/"
[ -s "$LAB_DIR/db/pass" ] || { umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$LAB_DIR/db/pass"; umask 022; }
DB_PASS=$(cat "$LAB_DIR/db/pass")
render "$HERE/etc/slurmdbd.conf.in" "$E/slurmdbd.conf" 600
chown root:root "$E/slurmdbd.conf"
# Per-node fake GPUs, kernel log and triage state.
SCENARIOS="$RUN_REPO/tests/fakenvml/scenarios"
for i in $(seq 1 "$LAB_NODES"); do
  N="$LAB_DIR/nodes/node$i"
  mkdir -p "$N/nvml" "$N/state" "$N/spool"
  ln -sfn "$RUN_REPO/tests/fakenvml/build/libnvidia-ml.so.1" "$N/nvml/libnvidia-ml.so.1"
  "$HERE/set-rdma" "node$i" --reset >/dev/null   # a quiet mlx5 HDR port (rdma.sysfs_root)
  [ -L "$N/nvml/scenario.json" ] && continue
  if [ -f "$SCENARIOS/$LAB_SCENARIO" ]; then
    "$HERE/set-scenario" "node$i" "$LAB_SCENARIO" >/dev/null
  else  # tests/fakenvml not there yet: the link dangles until it is
    ln -sfn "$SCENARIOS/$LAB_SCENARIO" "$N/nvml/scenario.json"; : > "$N/kernel.log"
  fi
done
# Slurm commands run without SLURM_CONF (e.g. from a hook) would otherwise try a
# DNS SRV lookup for a configless controller. (A SLURM_PREFIX build reads $SLURM_PREFIX/etc.)
SLURM_ETC=/etc/slurm
[ -z "$SLURM_PREFIX" ] || SLURM_ETC=$SLURM_PREFIX/etc
if [ ! -e "$SLURM_ETC/slurm.conf" ] && [ ! -L "$SLURM_ETC/slurm.conf" ]; then
  mkdir -p "$SLURM_ETC"
  ln -s "$SLURM_CONF" "$SLURM_ETC/slurm.conf"
  echo "$SLURM_ETC/slurm.conf" > "$RUN/etc-link"
fi
phase_done "configs"

# --- 4. munged ----------------------------------------------------------------------------
install -d -o munge -g munge -m 0755 "$LAB_DIR/munge"   # socket dir: x for all
[ -s "$LAB_DIR/munge/munge.key" ] || dd if=/dev/urandom of="$LAB_DIR/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$LAB_DIR/munge/munge.key"; chmod 0400 "$LAB_DIR/munge/munge.key"
MSOCK="$LAB_DIR/munge/munge.socket.2"
"${CLEAN_ENV[@]}" runuser -u munge -- /usr/sbin/munged --key-file="$LAB_DIR/munge/munge.key" \
  --socket="$MSOCK" --pid-file="$LAB_DIR/munge/munged.pid" --log-file="$LAB_DIR/munge/munged.log" \
  --seed-file="$LAB_DIR/munge/munged.seed"
check_munge() { munge -S "$MSOCK" -n | unmunge -S "$MSOCK"; }
wait_for 10 "munged" check_munge
phase_done "munged"

# --- 5. private MariaDB (own datadir and socket, 127.0.0.1:$DB_PORT) ----------------------
DB="$LAB_DIR/db"
DBSOCK="$DB/mariadb.sock"
install -d -o mysql -g mysql -m 0755 "$DB"
chmod 600 "$DB/pass"
if [ ! -d "$DB/data/mysql" ]; then
  install -d -o mysql -g mysql -m 0700 "$DB/data"
  mariadb-install-db --no-defaults --user=mysql --datadir="$DB/data" --skip-test-db \
    --auth-root-authentication-method=socket >"$LAB_DIR/log/mariadb-install.log" 2>&1 \
    || die "mariadb-install-db failed: $LAB_DIR/log/mariadb-install.log"
fi
spawn "$RUN/mariadbd.pid" /dev/null /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB/data" \
  --socket="$DBSOCK" --pid-file="$DB/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
  --skip-name-resolve --skip-log-bin --performance-schema=OFF --innodb-buffer-pool-size=128M \
  --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 --log-error="$DB/mariadbd.log"
wait_for 60 "mariadbd" mariadb-admin --no-defaults -S "$DBSOCK" -u root ping
mariadb --no-defaults -S "$DBSOCK" -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL
phase_done "mariadb"

# --- 6. slurmdbd, cluster registration -----------------------------------------------------
"${SLURM_DAEMON[@]}" env SLURM_CONF="$SLURM_CONF" slurmdbd
wait_for 60 "slurmdbd (sacctmgr list cluster)" sacctmgr -n list cluster
sacctmgr -n -P list cluster format=cluster | grep -qx lab || sacctmgr -i add cluster lab >/dev/null
phase_done "slurmdbd"

# --- 7. slurmctld + slurmd x N --------------------------------------------------------------
"${SLURM_DAEMON[@]}" slurmctld -f "$SLURM_CONF"
wait_for 30 "slurmctld (scontrol ping)" sh -c 'scontrol ping | grep -q UP'
# 22.05 prints "MULTIPLE_SLURMD = Yes", 24.11 "MULTIPLE_SLURMD = yes".
[[ "$(scontrol show config)" =~ MULTIPLE_SLURMD\ *=\ *[Yy]es ]] \
  || die "this Slurm build lacks --enable-multiple-slurmd: several nodes on one host are impossible"
phase_done "slurmctld"
for i in $(seq 1 "$LAB_NODES"); do
  "${SLURM_DAEMON[@]}" slurmd -f "$SLURM_CONF" -N "node$i"
done
all_idle() { [ "$(sinfo -h -N -o '%N %T' | awk '$2=="idle"' | wc -l)" -eq "$LAB_NODES" ]; }
wait_for 30 "all $LAB_NODES nodes idle" all_idle
phase_done "slurmd x$LAB_NODES"

# --- 8. Pushgateway, node_exporter, Prometheus -----------------------------------------------
P="$LAB_DIR/prom"
# No consistency check, as README "Performance" recommends for a gateway that only slurm-triage
# pushes to: with it every PUT gathers every group (259 ms at 200 groups vs 1.6 ms without), and
# each job's result is a group of its own for pushgateway.result_keep_seconds. The unit tests'
# private gateway (tests/conftest.py) keeps the check, where the 400 on an inconsistent push is tested.
spawn "$RUN/pushgateway.pid" "$LAB_DIR/log/pushgateway.log" prometheus-pushgateway \
  --web.listen-address="127.0.0.1:$PUSHGW_PORT" --web.enable-admin-api \
  --persistence.file="$P/pushgateway.store" --persistence.interval=5s --push.disable-consistency-check
spawn "$RUN/node-exporter.pid" "$LAB_DIR/log/node-exporter.log" prometheus-node-exporter \
  --web.listen-address="127.0.0.1:$NODE_EXPORTER_PORT" --collector.textfile.directory="$P/textfile"
spawn "$RUN/prometheus.pid" "$LAB_DIR/log/prometheus.log" prometheus --config.file="$P/prometheus.yml" \
  --storage.tsdb.path="$P/data" --web.listen-address="127.0.0.1:$PROM_PORT" --web.enable-admin-api \
  --web.enable-lifecycle
wait_for 20 "pushgateway" curl -sf "http://127.0.0.1:$PUSHGW_PORT/-/ready"
wait_for 20 "node_exporter" curl -sf -o /dev/null "http://127.0.0.1:$NODE_EXPORTER_PORT/metrics"
wait_for 30 "prometheus" curl -sf "http://127.0.0.1:$PROM_PORT/-/ready"
phase_done "prometheus stack"

cat > "$LAB_DIR/env.sh" <<ENV
# source me: the environment for talking to the lab (written by lab/up.sh)
export LAB_DIR=$LAB_DIR
export SLURM_CONF=$SLURM_CONF
export PUSHGATEWAY_URL=http://127.0.0.1:$PUSHGW_PORT
export PROMETHEUS_URL=http://127.0.0.1:$PROM_PORT
export SLURM_TRIAGE_CONFIG=$E/slurm-triage.toml
export LAB_CHECKOUT=$RUN_REPO
ENV
[ "$TEST_USER" = triage-test ] || echo "export LAB_USER=$TEST_USER" >> "$LAB_DIR/env.sh"
[ -z "$SLURM_PREFIX" ] || echo "export PATH=$SLURM_PREFIX/bin:$SLURM_PREFIX/sbin:\$PATH   # the lab's Slurm" >> "$LAB_DIR/env.sh"
{
  echo "# lab/up.sh $(date -Is): Slurm $SLURM_VERSION, $LAB_NODES nodes, hooks=$LAB_HOOKS"
  printf '%s' "$TIMINGS"
  printf '  %-22s %6.2fs\n' total "$(awk "BEGIN{print $(date +%s.%N) - $T0}")"
} | tee "$LAB_DIR/timings.txt"
log "lab is up: source $LAB_DIR/env.sh"
