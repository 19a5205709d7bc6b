// On-disk formats of a thinfs pool. Every byte that reaches the disk is
// described here, once. All integers are little-endian unless a section
// says otherwise (RocksDB keys are big-endian so that they sort).

#ifndef THINFS_META_FORMAT_H_
#define THINFS_META_FORMAT_H_

#include <cstdint>

namespace thinfs::meta {

// ===================== Bitmap file (pool/bitmap) =====================
// (section owned by meta/bitmap_space_map)

// ======================== RocksDB (pool/meta/) ========================
// (section owned by meta/rocksdb_store)

}  // namespace thinfs::meta

#endif  // THINFS_META_FORMAT_H_
