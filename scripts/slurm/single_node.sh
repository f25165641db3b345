#!/usr/bin/env bash
# A one-machine Slurm cluster from Debian's packages (slurm-wlm, munge): munged, slurmctld and slurmd
# on this host, every file under DIR, nothing in /etc changed. The Slurm test (tests/test_slurm.py)
# starts and stops it; an instructor can use it to try `vramlab grade-class --slurm` before the campus
# cluster. Needs root (SlurmUser=root; munged runs as the munge user).
#
#   scripts/slurm/single_node.sh start DIR   # writes DIR/slurm.conf, starts the three daemons, waits for the node
#   scripts/slurm/single_node.sh stop DIR    # cancels this cluster's jobs, stops the daemons by their pids
#   export SLURM_CONF=DIR/slurm.conf         # then sbatch, squeue, scancel and sinfo talk to it
#
# Settings that matter on a small machine: proctrack/linuxproc and task/none (no cgroup plugins, so the
# grader's own memory cgroups are untouched), select/cons_tres with CR_Core (tasks share the node by
# cores), no accounting (no slurmdbd: sacct answers nothing; vramlab follows progress with its journals
# and squeue). CPUS (default: this machine's) and the two ports (default: two free ones) can be set.
set -euo pipefail

usage() { echo "用法：$0 start|stop|status DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
DIR=$(mkdir -p "$2" && cd "$2" && pwd)
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

pid_of() { [ -s "$1" ] && cat "$1" || true; }

stop_pid() {        # TERM, wait up to 10 s, then KILL: one daemon, by the pid its pid file holds
    local pid; pid=$(pid_of "$1")
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || { rm -f "$1"; return 0; }
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$1"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start() {
    [ "$(id -u)" = 0 ] || { echo "需要 root：SlurmUser=root，munged 以 munge 用户运行" >&2; exit 4; }
    for bin in munged mungekey slurmctld slurmd sinfo; do
        command -v "$bin" >/dev/null || [ -x "/usr/sbin/$bin" ] || { echo "没有 $bin：apt-get install slurm-wlm munge" >&2; exit 4; }
    done
    PATH=$PATH:/usr/sbin
    local host cpus mem_mb ctld_port d_port munge
    host=$(hostname -s)
    cpus=${CPUS:-$(nproc)}
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
    ctld_port=${SLURMCTLD_PORT:-$(free_port)}
    d_port=${SLURMD_PORT:-$(free_port)}
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    # munge's files must be reachable by the munge user: a pytest tmp folder (0700, root) is not
    if [ -s "$DIR/munge.dir" ]; then munge=$(cat "$DIR/munge.dir"); else munge=$(mktemp -d /tmp/vramlab-munge.XXXXXX); fi
    echo "$munge" > "$DIR/munge.dir"
    chmod 0755 "$munge"
    chown munge:munge "$munge"
    [ -s "$munge/munge.key" ] || runuser -u munge -- mungekey --create --keyfile="$munge/munge.key"
    runuser -u munge -- munged --socket="$munge/munge.socket" --key-file="$munge/munge.key" \
        --pid-file="$munge/munged.pid" --log-file="$munge/munged.log" --seed-file="$munge/munged.seed"
    cp "$munge/munged.pid" "$DIR/munged.pid"
    cat > "$CONF" <<CONF
# written by scripts/slurm/single_node.sh
ClusterName=vramlab
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=60
SlurmdTimeout=30
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    slurmctld -f "$CONF"
    slurmd -f "$CONF"
    for _ in $(seq 150); do
        state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -1 || true)
        case "$state" in idle*|mixed*|allocated*) echo "Slurm 单机集群已启动：$host，$cpus 核；export SLURM_CONF=$CONF"; return 0 ;; esac
        sleep 0.2
    done
    echo "节点没有进入 idle 状态（最后的状态：${state:-无}）；日志在 $DIR/log/" >&2
    exit 4
}

stop() {
    PATH=$PATH:/usr/sbin
    if [ -s "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
        # this cluster's jobs end first, so that no slurmstepd outlives slurmd
        jobs=$(squeue -h -o %A 2>/dev/null || true)
        [ -z "$jobs" ] || scancel $jobs 2>/dev/null || true
        for _ in $(seq 100); do [ -z "$(squeue -h -o %A 2>/dev/null || true)" ] && break; sleep 0.2; done
    fi
    stop_pid "$DIR/slurmd.pid"
    stop_pid "$DIR/slurmctld.pid"
    stop_pid "$DIR/munged.pid"
    if [ -s "$DIR/munge.dir" ]; then
        rm -rf "$(cat "$DIR/munge.dir")"
        rm -f "$DIR/munge.dir"
    fi
    echo "Slurm 单机集群已停止（$DIR）"
}

case "$action" in
    start) start ;;
    stop) stop ;;
    status) sinfo ;;
    *) usage ;;
esac
