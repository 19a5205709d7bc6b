# THINFS_STATIC_DEPS: the thinfs-engine executable links every library but glibc
# statically (libstdc++, libgcc, Boost.Program_options, libfuse3, liburing, xxHash,
# expat and RocksDB's compression libraries; RocksDB itself is always the
# static librocksdb.a). Why: a `thinfs snapshot` on a mounted pool is mostly
# process start-up, and the dynamic loader's work for libstdc++ and the ten
# other shared objects was more than half of it: 5.7 ms of CPU per start
# before, 2.6 ms after (docs/benchmarks.md, "7. Snapshot latency").
# The cost: a larger binary, and a security update of one of these libraries
# needs a rebuild of thinfs (as RocksDB always did). The .deb's Depends come
# from dpkg-shlibdeps and shrink accordingly.
#
# Included by the top-level CMakeLists.txt after the thinfs and thinfs_engine
# targets exist; Boost_USE_STATIC_LIBS is set there, before
# find_package(Boost). Every target that links these imported targets gets
# the static archives; only the two executables also get the static C++
# runtime (and the front, thinfs, glibc: below).

# The archives that replace the shared objects, from the same Debian -dev
# packages (Debian 12 builds them position-independent, so they link into
# the PIE).
function(thinfs_static_archive var name)
  find_library(${var} NAMES lib${name}.a REQUIRED NO_CACHE)
  set(${var} ${${var}} PARENT_SCOPE)
endfunction()

foreach(lib fuse3 uring xxhash expat snappy z bz2 lz4 zstd)
  thinfs_static_archive(THINFS_STATIC_${lib} ${lib})
endforeach()

set_target_properties(PkgConfig::FUSE3 PROPERTIES
  INTERFACE_LINK_LIBRARIES "${THINFS_STATIC_fuse3};Threads::Threads;${CMAKE_DL_LIBS};rt")
set_target_properties(PkgConfig::XXHASH PROPERTIES INTERFACE_LINK_LIBRARIES "${THINFS_STATIC_xxhash}")
set_target_properties(PkgConfig::URING PROPERTIES INTERFACE_LINK_LIBRARIES "${THINFS_STATIC_uring}")
set_target_properties(PkgConfig::EXPAT PROPERTIES INTERFACE_LINK_LIBRARIES "${THINFS_STATIC_expat}")
# RocksDB's exported dependencies name the shared objects (and gflags,
# which the library itself does not use).
set_target_properties(RocksDB::rocksdb PROPERTIES INTERFACE_LINK_LIBRARIES
  "${THINFS_STATIC_snappy};${THINFS_STATIC_z};${THINFS_STATIC_bz2};${THINFS_STATIC_lz4};${THINFS_STATIC_zstd}")

target_link_options(thinfs_engine PRIVATE -static-libstdc++ -static-libgcc)
# The front (tools/front.cc) links glibc statically too, as a static PIE: no
# dynamic loader at all, 2.0 ms a start instead of 2.5 (docs/benchmarks.md,
# "32. A front binary without the engine"). It calls nothing of glibc that
# needs shared objects at run time (NSS, iconv, dlopen); the linker would
# warn if it did.
target_link_options(thinfs PRIVATE -static-pie)
