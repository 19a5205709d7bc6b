#!/usr/bin/env bash
# The main job: installs what is missing, builds Release in build/, formats a
# default pool ./pool (10 GiB sparse, 64 KiB blocks) if there is none, and
# mounts it on ./vols. Override with THINFS_POOL, THINFS_MOUNT and
# THINFS_POOL_SIZE.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
# Warnings are errors in CI (scripts/test.sh), not for someone running the tool.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTHINFS_WERROR=OFF
cmake --build build -j2 --target thinfs

POOL=${THINFS_POOL:-./pool}
MNT=${THINFS_MOUNT:-./vols}
if [[ ! -e "$POOL/meta" && ! -e "$POOL/bitmap" ]]; then
  ./build/thinfs format "$POOL" --size "${THINFS_POOL_SIZE:-10G}"
fi
mkdir -p "$MNT"
if findmnt -rn -M "$(realpath "$MNT")" >/dev/null 2>&1; then
  echo "$MNT is already mounted."
else
  ./build/thinfs mount "$POOL" "$MNT"
fi
./build/thinfs status "$POOL" || true
cat <<TXT

Pool $POOL is mounted on $MNT. Each file there is a thin volume:
  truncate -s 20G $MNT/vm1                 # a new 20 GiB volume (takes no space yet)
  dev=\$(losetup -f --show $MNT/vm1)       # a block device over it
  mkfs.ext4 \$dev                           # ... use it like any disk
  cp --reflink=auto --sparse=never $MNT/vm1 $MNT/vm1-clone   # instant clone
  ./build/thinfs umount $MNT                # commit and unmount
TXT
