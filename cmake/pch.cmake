# Precompiled headers, for build speed only (THINFS_PCH; scripts/test.sh
# turns it on for its gcc and ASan builds). Every target gets its own PCH
# of the standard headers most of its files include, plus the one heavy
# library header its files share (GoogleTest for the tests,
# Boost.Program_options for the CLI). Project headers stay out: a change to
# one then rebuilds only its includers. A PCH makes a missing #include of a
# standard header go unnoticed; builds without THINFS_PCH (the default, and
# scripts/tsan.sh) still catch it.
set(THINFS_PCH_STD <algorithm> <atomic> <chrono> <cstdint> <cstdio> <cstring> <functional>
    <map> <memory> <mutex> <optional> <string> <string_view> <utility> <vector>)

function(thinfs_precompile_headers target)
  if(THINFS_PCH)
    target_precompile_headers(${target} PRIVATE ${THINFS_PCH_STD} ${ARGN})
  endif()
endfunction()

# The same PCH as `from`'s, for a target compiled with the same flags and
# definitions (the test executables: one PCH for the engine's tests, one
# for those that also use fs/, instead of one each).
function(thinfs_reuse_precompiled_headers target from)
  if(THINFS_PCH)
    target_precompile_headers(${target} REUSE_FROM ${from})
  endif()
endfunction()
