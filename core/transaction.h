// The commit protocol.
//
// A Transaction collects the metadata edits of one commit (MetaBatch in
// core/metadata.h). Pool::Commit() is the only durability point; it runs
// one at a time under Pool's commit mutex, in this order:
//
//   0. Cut: with every metadata change excluded (the swap lock held
//      exclusively, for microseconds), freeze the overlay of uncommitted
//      block-map and refcount edits, collect the dirty device records and
//      take the space map's pending frees. Changes after the cut go to the
//      next commit.
//   1. fdatasync the pool data, so that every block a frozen mapping points
//      at holds what was written to it. Skipped when no data write
//      completed since the last data sync began (Pool's data_dirty). With
//      PoolOptions::sync_overwrites off (on by default), the periodic commit
//      also skips it when the only writes were overwrites in place (Pool's
//      new_data clear): no mapping needs them, so like ext4's data=ordered
//      they wait for the next fsync, snapshot or commit that syncs.
//   2. Make the allocation bitmap durable (msync): every block the frozen
//      mappings use is marked allocated before any mapping to it exists on
//      disk. The bitmap may over-report after a crash, never under-report.
//      When no bit changed since its last sync, the body is not synced.
//      The header's new generation is written and its write-back started,
//      not waited for: it may lag the metadata after a crash, and it can
//      lead it by at most this commit (meta::CheckBitmapGeneration).
//   3. Write the frozen edits as one RocksDB WriteBatch with sync=true.
//      This is the commit.
//   4. Only then release the blocks freed by the frozen edits to the
//      allocator, and drop the frozen overlay.
//
// Without data writes or allocations since the last commit (a snapshot,
// create or rename after an fsync) the commit's only synchronous I/O is
// step 3: one WAL write and fdatasync.
//
// A crash before 3 loses the frozen edits (and leaks their blocks, which
// recovery reclaims by rebuilding the bitmap from the block map); a crash
// after 3 keeps them. A freed block is never reused before the mapping that
// released it is gone on disk, so no device can ever see another's data.
//
// A failed step makes the pool read-only (sticky) until `thinfs check`.

#ifndef THINFS_CORE_TRANSACTION_H_
#define THINFS_CORE_TRANSACTION_H_

#include "core/metadata.h"

namespace thinfs {

using Transaction = MetaBatch;

}  // namespace thinfs

#endif  // THINFS_CORE_TRANSACTION_H_
