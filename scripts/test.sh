#!/usr/bin/env bash
# Installs what is missing, then builds and runs every test:
#   1. gcc Debug with -Werror in build-test/: the whole ctest suite;
#   2. clang with ASan+UBSan in build-asan/: the unit tests (labels core,
#      meta, tools).
# Exits non-zero if any build or test fails.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

echo "== gcc debug build and full test suite (build-test/)"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Debug -DTHINFS_WERROR=ON \
  -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++
cmake --build build-test -j2
ctest --test-dir build-test --output-on-failure -j2

echo "== clang ASan+UBSan build and unit tests (build-asan/)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTHINFS_WERROR=ON -DTHINFS_SANITIZE=ON \
  -DTHINFS_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
cmake --build build-asan -j2
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j2 -L '^(core|meta|tools)$'

echo "== all tests passed"
