#!/usr/bin/env bash
# Builds the unit tests with clang and ThreadSanitizer (THINFS_TSAN=ON) in
# build-tsan/ and runs the engine's concurrency tests (Pool, bitmap space
# map, in-memory store) with halt_on_error: any data race fails the run
# with TSan's report on stderr.
#   scripts/tsan.sh [extra gtest filter]
set -euo pipefail
cd "$(dirname "$0")/.."

cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DTHINFS_WERROR=ON -DTHINFS_TSAN=ON \
  -DTHINFS_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-tsan -j2 --target core_tests meta_tests

filter="${1:-*Concurren*:*Parallel*:*Threads*:*Race*}"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
echo "== core_tests --gtest_filter='$filter'"
build-tsan/tests/core_tests --gtest_filter="$filter"
echo "== meta_tests --gtest_filter='$filter'"
build-tsan/tests/meta_tests --gtest_filter="$filter"
echo "== no data race reported"
