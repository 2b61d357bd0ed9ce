#!/usr/bin/env bash
# Bring up a single-node SLURM on this machine, for the SLURM integration test (tests/test_slurm.py).
#
#   tests/slurm/start_slurm.sh      # installs what is missing (Debian packages), starts, waits for the node
#   export SLURM_CONF=/tmp/slmserve-slurm/etc/slurm.conf    # what the script prints at the end
#   tests/slurm/stop_slurm.sh       # cancels the jobs, stops every daemon it started, removes the folder
#
# What runs (all as root, all from Debian's packages; configuration and state under $DIR):
#   munged     own key and socket under $DIR/munge (SLURM's AuthInfo points there);
#   mariadbd   own data folder under $DIR/mysql, on 127.0.0.1 only: the accounting database;
#   slurmdbd   accounting: sacct (SLURM's records of every job) and sacctmgr (accounts, which the
#              executor plugin checks before it submits);
#   slurmctld, slurmd   one node named after this host, CPUs and memory as `slurmd -C` reports them,
#              and $SLMSERVE_SLURM_GPUS (default 4) GPUs `Gres=gpu:N` that do not exist: their "device
#              files" are character devices 1:3 (what /dev/null is) under $DIR/dev, so `--gpus=k`
#              requests are accepted on a CPU-only machine and SLURM sets CUDA_VISIBLE_DEVICES to the
#              GPU indices it allocates, as on a real GPU node. (SLURM 22.05 drops GPUs declared with
#              no File= at all: "Removing file-less GPU", node INVALID.) The jobs run the CPU engine.
# Cluster "slmtest", partition "debug" (default), account "slmtest" (root is a member).
# Outside $DIR: /etc/slurm/slurm.conf becomes a link to $DIR/etc/slurm.conf (where no slurm.conf
# exists; see below), and /usr/sbin/policy-rc.d exists only while packages are being installed.
# Ports (non-standard, so a real SLURM on the host is not disturbed): 16817 slurmctld, 16818 slurmd,
# 16819 slurmdbd, 16806 MariaDB. The node uses proctrack/linuxproc (no cgroup set-up needed): a job's
# processes are found by parentage, so scancel signals the job's whole process tree.
#
# Idempotent: if the node already answers, it says so and exits 0. Exit status: 0 ready; 2 this machine
# cannot run it (not root, no apt-get, packages cannot be installed); 1 it failed to start (log tails
# printed on stderr).
set -euo pipefail

DIR=${SLMSERVE_SLURM_DIR:-/tmp/slmserve-slurm}
NGPUS=${SLMSERVE_SLURM_GPUS:-4}
[[ $NGPUS =~ ^[1-9][0-9]?$ ]] || { echo "start_slurm: SLMSERVE_SLURM_GPUS must be 1-99, not '$NGPUS'" >&2; exit 1; }
CLUSTER=slmtest
PARTITION=debug
ACCOUNT=slmtest
PORT_CTLD=16817 PORT_SLURMD=16818 PORT_DBD=16819 PORT_DB=16806
HOST=$(hostname -s)
PKGS=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
BINS=(munged slurmctld slurmd slurmdbd sbatch sacct sacctmgr mariadbd mariadb-install-db)

say() { echo "start_slurm: $*" >&2; }
cannot() { say "cannot run SLURM here: $*"; exit 2; }
export SLURM_CONF="$DIR/etc/slurm.conf"

tails() {
  for f in "$DIR"/log/*.log; do
    [ -f "$f" ] || continue
    echo "----- tail of $f" >&2
    tail -n 12 "$f" >&2
  done
}
fail() { say "FAILED: $*"; tails; exit 1; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: run COMMAND until it succeeds
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until timeout 10 "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -ge "$deadline" ] && fail "$what not ready after ${limit} s"
    sleep 0.5
  done
}

node_state() { sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -n1; }

# ---------------------------------------------------------------------------- already running?
if [ -f "$SLURM_CONF" ] && command -v sinfo >/dev/null 2>&1; then
  case "$(node_state || true)" in
    idle|mixed|allocated)
      say "already running ($(sinfo -h -o '%P %D %T' | head -n1))"
      echo "export SLURM_CONF=$SLURM_CONF"
      exit 0 ;;
  esac
fi

# ---------------------------------------------------------------------------- packages
[ "$(id -u)" -eq 0 ] || cannot "not root (daemons and packages need root)"
missing=()
for b in "${BINS[@]}"; do
  PATH=$PATH:/usr/sbin:/sbin command -v "$b" >/dev/null 2>&1 || missing+=("$b")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || cannot "missing ${missing[*]} and no apt-get to install them"
  say "installing ${PKGS[*]} (missing: ${missing[*]})"
  # Keep the packages' init scripts from starting daemons with Debian's default configuration.
  added_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && added_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get install -y -q --no-install-recommends "${PKGS[@]}" > "$DIR.apt.log" 2>&1; }
  mkdir -p "$(dirname "$DIR")"
  if ! apt_install; then
    apt-get update -q > "$DIR.apt-update.log" 2>&1 || true
    if ! apt_install; then
      [ -n "$added_policy" ] && rm -f /usr/sbin/policy-rc.d
      tail -n 20 "$DIR.apt.log" >&2
      cannot "apt-get install ${PKGS[*]} failed (see above)"
    fi
  fi
  [ -n "$added_policy" ] && rm -f /usr/sbin/policy-rc.d
fi
export PATH=$PATH:/usr/sbin:/sbin

# ---------------------------------------------------------------------------- a clean folder
# Leftovers of an earlier run that did not stop cleanly: stop them first.
"$(dirname "$0")/stop_slurm.sh" >/dev/null 2>&1 || true
for port in $PORT_CTLD $PORT_SLURMD $PORT_DBD $PORT_DB; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    cannot "port $port is in use by another program"
  fi
done
# srun inside a job needs /etc/slurm/slurm.conf (made a link below): refuse a machine with its own.
if [ -e /etc/slurm/slurm.conf ] && [ ! -L /etc/slurm/slurm.conf ]; then
  cannot "/etc/slurm/slurm.conf exists: a SLURM is configured on this machine already"
fi
rm -rf "$DIR"
mkdir -p "$DIR"/{etc,log,run,state,spool,munge,mysql}
chmod 755 "$DIR"
chmod 711 "$DIR"/munge  # clients need to reach the socket; the key stays 0400

# ---------------------------------------------------------------------------- munge
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
MUNGE_SOCKET="$DIR/munge/munge.socket"
munged --force --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
  --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
  || fail "munged did not start"
wait_for 10 munged bash -c "munge -S '$MUNGE_SOCKET' -n | unmunge -S '$MUNGE_SOCKET'"

# ---------------------------------------------------------------------------- MariaDB
mariadb-install-db --no-defaults --user=root --datadir="$DIR/mysql/data" --skip-test-db \
  --auth-root-authentication-method=socket > "$DIR/log/mariadb-install.log" 2>&1 \
  || fail "mariadb-install-db failed"
DB_SOCKET="$DIR/mysql/mysqld.sock"
setsid mariadbd --no-defaults --user=root --datadir="$DIR/mysql/data" --socket="$DB_SOCKET" \
  --port=$PORT_DB --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$DIR/run/mariadbd.pid" \
  --log-error="$DIR/log/mariadbd.log" --innodb-buffer-pool-size=64M --max-connections=50 \
  < /dev/null > /dev/null 2>&1 &
wait_for 60 MariaDB mariadb --no-defaults --socket="$DB_SOCKET" -u root -e 'select 1'
mariadb --no-defaults --socket="$DB_SOCKET" -u root <<'SQL' || fail "could not create the slurm database user"
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slmserve-test';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------------------- configuration
# The node as this machine is: slurmd -C prints "NodeName=host CPUs=.. Boards=.. ... RealMemory=..".
node_hw=$(slurmd -C | head -n1 | sed -e 's/^NodeName=[^ ]* //')
cat > "$DIR/etc/slurm.conf" <<EOF
# Written by tests/slurm/start_slurm.sh: a one-node test cluster; removed by stop_slurm.sh.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT_CTLD
SlurmdPort=$PORT_SLURMD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
# Clients wait this long for slurmctld (default 10 s): on 2 cores starting vLLM, 10 s timed out in CI.
MessageTimeout=30
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
# Jobs stay visible to squeue/scontrol for 10 minutes after they end.
MinJobAge=600
# scancel: SIGTERM to every process of the job, SIGKILL KillWait seconds later.
KillWait=30
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$PORT_DBD
# With MUNGE, the socket used to talk to slurmdbd (AuthInfo covers the rest).
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
# Keep sbatch --comment in the accounting records (the executor puts the rule name there).
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$HOST NodeAddr=127.0.0.1 $node_hw Gres=gpu:$NGPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
# The GPUs' "device files": character devices 1:3 (what /dev/null is), so slurmd accepts them and
# sets CUDA_VISIBLE_DEVICES to the indices it allocates. SLURM 22.05 drops GPUs declared without
# File= ("Removing file-less GPU"), and with plain files it sets no CUDA_VISIBLE_DEVICES; plain files
# are the fallback where mknod is not allowed (then jobs see no GPU: the CPU engine's pool is empty).
mkdir -p "$DIR/dev"
gpu_files=devices
for i in $(seq 0 $((NGPUS - 1))); do
  if ! mknod "$DIR/dev/fakegpu$i" c 1 3 2>/dev/null; then
    gpu_files=plain
    : > "$DIR/dev/fakegpu$i"
  fi
done
echo "$gpu_files" > "$DIR/etc/fake-gpu-files"
cat > "$DIR/etc/gres.conf" <<EOF
NodeName=$HOST Name=gpu File=$DIR/dev/fakegpu[0-$((NGPUS - 1))]
EOF
cat > "$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$PORT_DBD
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$PORT_DB
StorageUser=slurm
StoragePass=slmserve-test
StorageLoc=slurm_acct_db
EOF
chmod 600 "$DIR/etc/slurmdbd.conf"

# The executor's job step runs `srun` with SLURM_* variables removed, SLURM_CONF included, so srun
# inside a job reads the compiled-in /etc/slurm/slurm.conf: point that at this configuration (only
# where no slurm.conf exists; stop_slurm.sh removes the link again).
mkdir -p /etc/slurm
ln -sfn "$DIR/etc/slurm.conf" /etc/slurm/slurm.conf

# ---------------------------------------------------------------------------- daemons
slurmdbd || fail "slurmdbd did not start"
wait_for 60 slurmdbd sacctmgr -n list cluster
sacctmgr -i add cluster "$CLUSTER" > /dev/null || fail "sacctmgr add cluster failed"
sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=slmserve-test Organization=slmserve \
  > /dev/null || fail "sacctmgr add account failed"
sacctmgr -i add user root Account="$ACCOUNT" Cluster="$CLUSTER" > /dev/null || fail "sacctmgr add user failed"
slurmctld -i || fail "slurmctld did not start"
wait_for 60 slurmctld scontrol ping
slurmd || fail "slurmd did not start"
deadline=$((SECONDS + 60))
while :; do
  state=$(node_state || true)
  case "$state" in
    idle) break ;;
    down*|drain*|fail*|inval*) fail "node $HOST is $state: $(sinfo -h -R -o '%E' || true)" ;;
  esac
  [ "$SECONDS" -ge "$deadline" ] && fail "node $HOST not idle after 60 s (state: ${state:-none})"
  sleep 0.5
done
say "SLURM up: cluster $CLUSTER, partition $PARTITION, account $ACCOUNT, node $HOST ($node_hw, gpu:$NGPUS)"
echo "export SLURM_CONF=$SLURM_CONF"
