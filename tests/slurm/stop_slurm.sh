#!/usr/bin/env bash
# Stop the test SLURM that tests/slurm/start_slurm.sh started, and remove its folder. Idempotent.
#   1. cancel every job of that cluster and wait until their processes are gone (slurmstepd outlives
#      slurmd, so jobs are ended first);
#   2. stop slurmd, slurmctld, slurmdbd, mariadbd and munged, each by the pid it wrote under $DIR/run
#      (checked against the process name, so a reused pid is never signalled), SIGTERM then SIGKILL;
#   3. remove the /etc/slurm/slurm.conf link start_slurm.sh made, and $DIR (kept with SLMSERVE_SLURM_KEEP=1, e.g. to read its logs).
# Installed packages are left installed.
set -uo pipefail

DIR=${SLMSERVE_SLURM_DIR:-/tmp/slmserve-slurm}
export SLURM_CONF="$DIR/etc/slurm.conf"
export PATH=$PATH:/usr/sbin:/sbin
say() { echo "stop_slurm: $*" >&2; }

if [ ! -d "$DIR" ]; then
  say "nothing to stop ($DIR does not exist)"
  exit 0
fi

# ---------------------------------------------------------------------------- jobs
if [ -f "$SLURM_CONF" ] && command -v scontrol >/dev/null 2>&1 && timeout 10 scontrol ping >/dev/null 2>&1; then
  ids=$(timeout 10 squeue -h -o '%i' 2>/dev/null | tr '\n' ' ')
  if [ -n "${ids// /}" ]; then
    say "cancelling jobs $ids"
    # shellcheck disable=SC2086
    timeout 10 scancel $ids 2>/dev/null || true
    for _ in $(seq 90); do  # KillWait (30 s) and a margin
      [ -z "$(timeout 10 squeue -h -t PD,R,CG,S,CF -o '%i' 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
fi

# ---------------------------------------------------------------------------- daemons
stop_daemon() {  # stop_daemon NAME: the pid in $DIR/run/NAME.pid, if it is still NAME
  local name=$1 pidfile="$DIR/run/$1.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(tr -dc '0-9' < "$pidfile")
  if [ -z "$pid" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then
    rm -f "$pidfile"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 40); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || { rm -f "$pidfile"; return 0; }
    sleep 0.25
  done
  say "$name (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null
  rm -f "$pidfile"
}
for d in slurmd slurmctld slurmdbd mariadbd munged; do
  stop_daemon "$d"
done

# The link start_slurm.sh made, if it is still ours.
if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$DIR/etc/slurm.conf" ]; then
  rm -f /etc/slurm/slurm.conf
fi

if [ "${SLMSERVE_SLURM_KEEP:-0}" = 1 ]; then
  say "stopped; kept $DIR"
else
  rm -rf "$DIR"
  rm -f "$DIR.apt.log" "$DIR.apt-update.log"
  say "stopped; removed $DIR"
fi
