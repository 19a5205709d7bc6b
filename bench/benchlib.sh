# shellcheck shell=bash
# Shell helpers shared by bench/*.sh (source it; it defines functions only).

# Prints the /sys/class/block/DEV/stat file of the block device under DIR,
# or says why there is none (as PROBE, on stderr) and returns 1.
disk_stat_file() {
  local dir=$1 probe=$2 source stat
  source=$(findmnt -n -o SOURCE -T "$dir")
  stat=/sys/class/block/$(basename "$(realpath "$source")")/stat
  if [[ ! -r $stat ]]; then
    echo "$probe: $dir is on $source, which has no $stat" >&2
    return 1
  fi
  echo "$stat"
}

# Prints the reads completed and the sectors read so far (fields 1 and 3)
# of STAT_FILE, a /sys/class/block/DEV/stat file (disk_stat_file).
disk_reads() {
  awk '{print $1, $3}' "$1"
}

# Prints the writes completed and the sectors written so far (fields 5
# and 7) of STAT_FILE, as disk_reads.
disk_writes() {
  awk '{print $5, $7}' "$1"
}

# Prints the bandwidth in MiB/s, rounded, of fio's JSON output in FILE in
# DIRECTION, read (the default) or write (whatever fio printed before the
# JSON is skipped).
fio_mibs() {
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):]); print(round(j["jobs"][0][sys.argv[2]]["bw_bytes"] / 2**20))' "$1" "${2:-read}"
}

# Prints lines 2 to LAST of the calling script's header comment, without
# the comment marks: its usage text.
header_usage() {
  sed -n "2,$1p" "$0" | sed 's/^# \{0,1\}//'
}

# Exits 77 (the test is skipped) without root or fio, unless CI is set,
# where that is a failure (exit 1). PROBE names the script in the message.
require_root_and_fio() {
  local probe=$1 missing=
  [[ $EUID -eq 0 ]] || missing="root (drop_caches, mount)"
  command -v fio >/dev/null || missing=fio
  if [[ -n $missing ]]; then
    echo "$probe: needs $missing" >&2
    [[ -n ${CI:-} ]] && exit 1
    exit 77
  fi
}

# Makes the work directory DIR, which must not exist yet (exit 2 if it does:
# another run may be using it). PROBE names the script in the message.
make_work_dir() {
  local probe=$1 dir=$2
  if [[ -e $dir ]]; then
    echo "$probe: $dir exists; remove it or wait for the other run" >&2
    exit 2
  fi
  mkdir -p "$dir"
}

# A probe's CONFIG... arguments, after its options: without any, prints
# the usage (header_usage LAST) and exits 2; then require_root_and_fio
# PROBE and parse_configs.
parse_probe_configs() {
  local probe=$1 last=$2
  shift 2
  if [[ $# -lt 1 ]]; then
    header_usage "$last"
    exit 2
  fi
  require_root_and_fio "$probe"
  parse_configs "$@"
}

# Splits CONFIG arguments of the form BINARY[:MOUNT_OPTIONS] into the
# caller's arrays bins (real paths) and opts ("" without options).
parse_configs() {
  local c
  bins=() opts=()
  for c in "$@"; do
    bins+=("$(realpath "${c%%:*}")")
    if [[ $c == *:* ]]; then opts+=("${c#*:}"); else opts+=(""); fi
  done
}

# Syncs each FILE and evicts it from the page cache (POSIX_FADV_DONTNEED),
# as fio_compare.py's --cache cold does for a target's files.
evict_files() {
  python3 -c '
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)' "$@"
}

# Serves SRC on MNT with a libfuse passthrough BINARY in the background
# (its output to LOG) and waits up to 5 s for the mount; sets the caller's
# passthrough_pid. PROBE names the script in the message if it does not
# mount (exit 1).
start_passthrough() {
  local probe=$1 binary=$2 src=$3 mnt=$4 log=$5
  "$binary" -f -o source="$src" "$mnt" >"$log" 2>&1 &
  # shellcheck disable=SC2034 # set for the caller
  passthrough_pid=$!
  for _ in $(seq 100); do mountpoint -q "$mnt" && return 0; sleep 0.05; done
  echo "$probe: passthrough did not mount" >&2
  exit 1
}

# Formats a pool of BYTES for each CONFIG of parse_configs (the caller's
# bins and opts) in WORK/I/pool and mounts it on WORK/I/mnt with the
# CONFIG's options; appends I to the caller's array mounted (for
# umount_configs) and the daemon's PID to its array pids.
mount_configs() {
  local work=$1 bytes=$2 i
  for i in "${!bins[@]}"; do
    mkdir -p "$work/$i/mnt"
    "${bins[$i]}" format "$work/$i/pool" --size "$bytes" >/dev/null
    "${bins[$i]}" mount "$work/$i/pool" "$work/$i/mnt" ${opts[$i]:+-o "${opts[$i]}"}
    mounted+=("$i")
    pids+=("$(cat "$work/$i/pool/lock")")
  done
}

# Unmounts, in a cleanup, what mount_configs mounted in WORK.
umount_configs() {
  local work=$1 i
  for i in "${mounted[@]}"; do "${bins[$i]}" umount "$work/$i/mnt" || true; done
}

# Writes every dirty page back and drops the whole page cache, every
# layer's (as fio_compare.py's --cache cold does between jobs).
drop_caches() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
}

# Prints the CPU time (utime + stime, in clock ticks) process PID has used.
daemon_cpu_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat"
}

# The machine's busy time so far, in clock ticks, over every CPU: user,
# nice, system, irq, softirq and steal (the fields of /proc/stat's cpu
# line but idle and iowait).
machine_busy_ticks() {
  awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat
}

# The part of it in irq and softirq.
machine_irq_ticks() {
  awk '/^cpu / {print $7 + $8}' /proc/stat
}

# Context switches of every thread of process $1 so far, voluntary and
# involuntary (a thread that has exited is no longer counted).
daemon_context_switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/^voluntary_ctxt_switches/ {v += $2} /^nonvoluntary_ctxt_switches/ {n += $2} END {print v + 0, n + 0}'
}
