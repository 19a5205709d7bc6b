#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test:
#   1. gcc Debug with -Werror in build-test/: the whole ctest suite (unit,
#      end-to-end with real mounts and loop devices, benchmark smoke runs;
#      the benchmarks' runs one at a time, beside steps 2 and 3's build);
#   2. the FUSE end-to-end tests of build-test/ again, on Debian 12's own
#      kernel (6.1) in a qemu guest (scripts/kernel-vm.sh);
#   3. clang with ASan+UBSan in build-asan/: the unit, end-to-end and
#      regression tests again (the daemon runs under the sanitizers too);
#   4. clang with TSan in build-tsan/: the engine's concurrency tests
#      (scripts/tsan.sh), beside the benchmarks' runs, before step 3's
#      tests;
#   5. the Debian package built from build-test/, installed, used through
#      its installed files only, and purged (scripts/package-test.sh).
# Exits non-zero if any build or test fails. Needs root (mounts, losetup,
# apt-get). With CI set, a missing /dev/fuse or loop device fails the tests
# instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

echo "== gcc debug build and full test suite (build-test/)"
# Build time (docs/benchmarks.md, "How long the CI takes"): THINFS_PCH,
# precompiled headers (cmake/pch.cmake; scripts/tsan.sh builds without them,
# so a missing standard #include still fails the CI); THINFS_UNITY, each
# test executable compiled in batches of files (tests/CMakeLists.txt;
# scripts/tsan.sh compiles one file at a time); -g1, line tables without
# variables, enough for file:line in any backtrace.
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Debug -DTHINFS_WERROR=ON -DTHINFS_PCH=ON -DTHINFS_UNITY=ON \
  -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1 \
  -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++
cmake --build build-test -j2
ctest --test-dir build-test --output-on-failure -j2 -LE '^bench$'

# The benchmarks' quick runs (label bench) drop the page cache, so they
# run one at a time and beside no other test: here in the background,
# beside the guest and the ASan+UBSan build, which do not look at this
# machine's page cache (what it saves: docs/benchmarks.md, "How long the
# CI takes"). Their output, and their failure, come before the ASan+UBSan
# tests start; an earlier failure waits for them at exit, so that their
# mounts and loop devices are gone when this script is.
echo "== the benchmarks' quick runs (build-test/, label bench), in the background"
bench_log=build-test/bench-tests.log
ctest --test-dir build-test --output-on-failure -L '^bench$' >"$bench_log" 2>&1 &
bench_pid=$!
trap 'if [[ -n ${bench_pid:-} ]]; then wait "$bench_pid" || true; fi' EXIT

echo "== the FUSE end-to-end tests on Debian 12's kernel, in a qemu guest (build-test/kernel-vm/)"
# This machine's kernel may be newer than a Debian 12 user's (6.1), and the
# kernel's FUSE decides what the daemon must do itself (docs/fuse.md,
# "Inodes and caching"). What depends on the kernel runs again there: the
# FUSE surface and its page-cache drops, a direct-I/O loop device under
# ext4 and fsck, kill -9 and SIGTERM, the periodic sync, snapshots of
# dirty pages, a reflinking host, read-around where the kernel has no
# cachestat(2) (docs/design.md). About 2 minutes under emulation; the
# whole e2e suite takes 7 minutes there from a Release build and about
# twice that from this Debug one (docs/fuse.md, "Tests").
on_61='ServerTest.*:GatedServerTest.*:FuseTest.Ext4OnDirectIoLoopDeviceChecksClean'
on_61+=':FuseTest.KillNineThenRemountKeepsFsyncedData:FuseTest.SigtermWithFilesStillOpenClosesThemAndExitsZero'
on_61+=':SnapshotFlushTest.*:*/SyncOverwritesTest.*:*/ReflinkHostTest.*/CopiesOwedToTheCommit'
on_61+=':FuseTest.ReadAroundOptionReadsTheWindowOfARandomRead'
bash scripts/kernel-vm.sh --dir build-test/kernel-vm --timeout 1200 \
  "CI=1 $PWD/build-test/tests/e2e_tests --gtest_brief=1 --gtest_filter='$on_61'"

echo "== clang ASan+UBSan build and tests (build-asan/)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTHINFS_WERROR=ON -DTHINFS_SANITIZE=ON \
  -DTHINFS_PCH=ON -DTHINFS_UNITY=ON -DTHINFS_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
cmake --build build-asan -j2

# The engine's concurrency tests under TSan use no page cache, mount or
# loop device: they run beside the benchmarks' quick runs, which the
# ASan+UBSan build above usually ends before (docs/benchmarks.md, "How long
# the CI takes").
echo "== clang TSan build and the concurrency tests (build-tsan/), beside the benchmarks' quick runs"
bash scripts/tsan.sh

echo "== the benchmarks' quick runs, started after the gcc tests: their output"
bench_status=0
wait "$bench_pid" || bench_status=$?
bench_pid=
cat "$bench_log"
if ((bench_status != 0)); then
  echo "== the benchmarks' quick runs failed (exit $bench_status)" >&2
  exit 1
fi

echo "== the ASan+UBSan tests (build-asan/)"
# Fewer random seeds under the sanitizers (each run is ~5x slower); the
# gcc run above covers the default counts.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  THINFS_MODEL_SEEDS=12 THINFS_POWERLOSS_SEEDS=3 THINFS_KILL_ITERATIONS=8 \
  ctest --test-dir build-asan --output-on-failure -j2 -L '^(core|meta|tools|e2e|regress)$'

echo "== Debian package: build, install, use, purge"
THINFS_PKG_BUILD_DIR=build-test bash scripts/package-test.sh

echo "== all tests passed"
