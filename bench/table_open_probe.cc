// table_open_probe: how long RocksDB's DB::Open takes against
// max_file_opening_threads, for a database laid out as a pool's metadata
// store (five column families; 16 KiB blocks, a prefix Bloom filter, LZ4)
// whose block map holds N table files (docs/benchmarks.md, lever 60).
//
//   table_open_probe --dir DIR [--files 4,32] [--threads 1,2,4,16]
//                    [--rounds 8] [--keys 200000] [--cold]
//
// For each file count it builds DIR/filesN (auto compaction off; N times
// KEYS random 20-byte keys with 12-byte values, then a flush: about 6 MiB
// a file at 200 000 keys), then times DB::Open, each in a process of its
// own (as a mount's open is its daemon's first), interleaving
// file counts, cache states and thread counts round by round. --cold adds
// opens after `sync; echo 3 > /proc/sys/vm/drop_caches` (root). Prints a
// Markdown table of medians (min-max) in ms, a row per file count and
// cache state, a column per thread count. Exits non-zero if a step fails
// or a cell is empty; it never judges a timing. DIR is made if missing;
// the probe replaces its own DIR/filesN and removes them at the end.

#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "table_open_probe: %s\n", what.c_str());
  std::exit(1);
}

void Check(const rocksdb::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

int Positive(const std::string& arg) {
  char* end = nullptr;
  const long v = std::strtol(arg.c_str(), &end, 10);
  if (arg.empty() || *end != '\0' || v < 1 || v > 1 << 30) Die("not a positive number: " + arg);
  return static_cast<int>(v);
}

std::vector<int> IntList(const std::string& arg) {
  std::vector<int> out;
  std::stringstream in(arg);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(Positive(item));
  if (out.empty()) Die("empty list");
  return out;
}

std::vector<rocksdb::ColumnFamilyDescriptor> Families() {
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  for (const char* name : {"default", "superblock", "devices", "map", "refcounts"}) {
    rocksdb::BlockBasedTableOptions table;
    table.block_size = 16 * 1024;
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    table.whole_key_filtering = false;
    rocksdb::ColumnFamilyOptions cf;
    cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    cf.prefix_extractor.reset(rocksdb::NewFixedPrefixTransform(12));
    cf.compression = rocksdb::kLZ4Compression;
    cf.disable_auto_compactions = true;  // the files stay as flushed
    cfs.emplace_back(name, cf);
  }
  return cfs;
}

constexpr size_t kMapFamily = 3;

void Close(rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*>* handles) {
  for (rocksdb::ColumnFamilyHandle* h : *handles) Check(db->DestroyColumnFamilyHandle(h), "close");
  handles->clear();
  Check(db->Close(), "close");
  delete db;
}

void Build(const std::string& dir, int files, int keys, std::mt19937_64* rng) {
  rocksdb::DBOptions o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  Check(rocksdb::DB::Open(o, dir, Families(), &handles, &db), "create " + dir);
  for (int f = 0; f < files; ++f) {
    for (int i = 0; i < keys; ++i) {
      char key[20], value[12];
      const uint64_t a = (*rng)(), b = (*rng)();
      std::memcpy(key, &a, 8);
      std::memcpy(key + 8, &b, 8);
      std::memcpy(key + 16, &a, 4);
      std::memcpy(value, &b, 8);
      std::memcpy(value + 8, &a, 4);
      Check(db->Put(rocksdb::WriteOptions(), handles[kMapFamily], rocksdb::Slice(key, 20),
                    rocksdb::Slice(value, 12)),
            "put");
    }
    Check(db->Flush(rocksdb::FlushOptions(), handles[kMapFamily]), "flush");
  }
  std::string level0;
  db->GetProperty(handles[kMapFamily], "rocksdb.num-files-at-level0", &level0);
  if (level0 != std::to_string(files)) Die(dir + ": " + level0 + " table files, not the ones made");
  Close(db, &handles);
}

void DropCaches() {
  ::sync();
  std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
}

// Microseconds from DB::Open to its return; the database is then closed.
// Run in a process of its own (OpenInChild), so that each open is its
// process's first, as the daemon's is: the first DB::Open of a process
// also starts RocksDB's process-wide threads.
double TimedOpen(const std::string& dir, int threads) {
  rocksdb::DBOptions o;
  o.max_file_opening_threads = threads;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  Check(rocksdb::DB::Open(o, dir, Families(), &handles, &db), "open " + dir);
  const auto t1 = std::chrono::steady_clock::now();
  Close(db, &handles);
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

double OpenInChild(const std::string& dir, int threads) {
  const std::string cmd = "/proc/" + std::to_string(::getpid()) + "/exe --open-once '" + dir +
                          "' " + std::to_string(threads);
  FILE* child = ::popen(cmd.c_str(), "r");
  if (child == nullptr) Die("popen " + cmd);
  double us = -1;
  const int got = std::fscanf(child, "%lf", &us);
  if (::pclose(child) != 0 || got != 1 || us < 0) Die("the child failed: " + cmd);
  return us;
}

std::string Cell(std::vector<double> v) {
  if (v.empty()) Die("an empty cell");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f (%.1f–%.1f)", median / 1000, v.front() / 1000,
                v.back() / 1000);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::vector<int> file_counts{4, 32}, thread_counts{1, 2, 4, 16};
  int rounds = 8, keys = 200000;
  bool cold = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--open-once" && argc == 4) {  // the child of OpenInChild
      std::printf("%.1f\n", TimedOpen(argv[2], Positive(argv[3])));
      return 0;
    }
    if (a == "--dir") {
      dir = value();
    } else if (a == "--files") {
      file_counts = IntList(value());
    } else if (a == "--threads") {
      thread_counts = IntList(value());
    } else if (a == "--rounds") {
      rounds = Positive(value());
    } else if (a == "--keys") {
      keys = Positive(value());
    } else if (a == "--cold") {
      cold = true;
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: table_open_probe --dir DIR [--files 4,32] [--threads 1,2,4,16]\n"
          "                        [--rounds 8] [--keys 200000] [--cold]\n"
          "Times RocksDB's DB::Open of a pool-like store whose map holds N table\n"
          "files, per max_file_opening_threads (docs/benchmarks.md, lever 60).\n");
      return 0;
    } else {
      Die("unknown argument " + a + " (see --help)");
    }
  }
  if (dir.empty()) Die("--dir is required");
  if (cold && ::geteuid() != 0) Die("--cold drops the page cache, which needs root");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) Die("mkdir " + dir + ": " + ec.message());
  auto db_dir = [&](int files) { return dir + "/files" + std::to_string(files); };

  std::mt19937_64 rng(1);
  for (int files : file_counts) {
    std::filesystem::remove_all(db_dir(files), ec);
    Build(db_dir(files), files, keys, &rng);
  }

  std::vector<std::string> caches{"warm"};
  if (cold) caches.push_back("cold");
  std::map<std::pair<int, std::string>, std::map<int, std::vector<double>>> samples;
  for (int r = 0; r < rounds; ++r) {
    for (int files : file_counts) {
      for (const std::string& cache : caches) {
        for (int threads : thread_counts) {
          if (cache == "cold") DropCaches();
          samples[{files, cache}][threads].push_back(OpenInChild(db_dir(files), threads));
        }
      }
    }
  }

  std::printf("DB::Open, ms, median (min–max) of %d rounds; %d keys per table file\n\n", rounds,
              keys);
  std::printf("| map table files | cache |");
  for (int threads : thread_counts) std::printf(" %d thread%s |", threads, threads == 1 ? "" : "s");
  std::printf("\n|---|---|");
  for (size_t i = 0; i < thread_counts.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (int files : file_counts) {
    for (const std::string& cache : caches) {
      std::printf("| %d | %s |", files, cache.c_str());
      for (int threads : thread_counts) {
        std::printf(" %s |", Cell(samples[{files, cache}][threads]).c_str());
      }
      std::printf("\n");
    }
  }
  for (int files : file_counts) std::filesystem::remove_all(db_dir(files), ec);
  return 0;
}
