#!/usr/bin/env bash
# Installs what is missing, builds Release in build/, then formats a default
# pool ./pool (10 GiB sparse, 64 KiB blocks) if there is none and prints its
# status. (Once the FUSE layer lands this mounts the pool instead.)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
# Warnings are errors in CI (scripts/test.sh), not for someone running the tool.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTHINFS_WERROR=OFF
cmake --build build -j2 --target thinfs

POOL=${THINFS_POOL:-./pool}
if [[ ! -e "$POOL/meta" && ! -e "$POOL/bitmap" ]]; then
  ./build/thinfs format "$POOL" --size "${THINFS_POOL_SIZE:-10G}"
fi
./build/thinfs status "$POOL"
