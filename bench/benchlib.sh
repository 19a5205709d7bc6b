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
