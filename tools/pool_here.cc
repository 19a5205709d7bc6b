#include "tools/pool_here.h"

#include <chrono>
#include <utility>

namespace thinfs::tools {

Result<meta::PoolFiles> OpenPoolFilesHere(const std::string& dir, bool read_only) {
  meta::OpenOptions options;
  options.read_only = read_only;
  options.one_shot = true;
  return meta::OpenPoolFiles(dir, options);
}

Result<std::unique_ptr<meta::RocksDbStore>> OpenStoreHere(const std::string& dir, bool read_only) {
  meta::RocksDbOptions options;
  options.read_only = read_only;
  options.one_shot = true;
  return meta::RocksDbStore::Open(dir, options);
}

Result<std::unique_ptr<OpenPool>> OpenPoolHere(const std::string& dir, bool read_only) {
  THINFS_ASSIGN_OR_RETURN(meta::PoolFiles files, OpenPoolFilesHere(dir, read_only));
  auto out = std::make_unique<OpenPool>();
  out->sb = files.superblock;
  PoolOptions options;
  options.commit_interval = std::chrono::milliseconds(0);
  options.read_only = read_only;
  Result<std::unique_ptr<Pool>> pool = Pool::Open(std::move(files.data), std::move(files.bitmap),
                                                  std::move(files.store), options);
  if (!pool.ok()) return pool.status().WithContext("cannot open pool " + dir);
  out->files = std::move(files);
  out->pool = std::move(*pool);
  return out;
}

}  // namespace thinfs::tools
