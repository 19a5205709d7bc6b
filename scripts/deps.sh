#!/usr/bin/env bash
# Installs the Debian 12 packages thinfs needs to build, test and run, and
# only those that are missing. Works as root, or through sudo otherwise.
set -euo pipefail

PACKAGES=(
  cmake g++ pkg-config
  libfuse3-dev fuse3 liburing-dev
  librocksdb-dev libxxhash-dev libboost-program-options-dev libexpat1-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  fio e2fsprogs util-linux thin-provisioning-tools
  qemu-system-common qemu-utils btrfs-progs gnuplot-nox ministat  # bench/fio_compare.py's peers (btrfs also: tests/e2e/reflink_host_test.cc)
  xfsprogs  # a reflinking host for the pool (docs/benchmarks.md, lever 11)
  qemu-system-x86 busybox-static  # scripts/kernel-vm.sh: the tests on Debian 12's kernel
  clang
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  SUDO=()
elif command -v sudo >/dev/null; then
  SUDO=(sudo)
else
  echo "deps: missing ${missing[*]}, and not root and no sudo to install them" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "${missing[@]}"
