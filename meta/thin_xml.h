// The XML metadata format of thin-provisioning-tools (thin_dump,
// thin_restore), version 0.9: a writer and a streaming parser.
//
//   <superblock uuid="" time="1" transaction="3" flags="0" version="2"
//               data_block_size="128" nr_data_blocks="100">
//     <device dev_id="1" mapped_blocks="3" transaction="0"
//             creation_time="0" snap_time="1">
//       <range_mapping origin_begin="0" data_begin="0" length="2" time="0"/>
//       <single_mapping origin_block="5" data_block="9" time="1"/>
//     </device>
//   </superblock>
//
// data_block_size is in 512-byte sectors; block numbers are in data
// blocks. docs/interop.md says how thinfs's devices, epochs and sharing map
// onto these fields.
//
// The parser (expat) streams: it never holds more than one element, so a
// dump of millions of mappings parses in constant memory. It checks the
// structure and every number, and reports the first problem as
// kInvalidArgument "LINE:COLUMN: what" (expat's position: 1-based line,
// 0-based column of the element's start). A handler's error stops the
// parse and gets the same position prefix. DOCTYPE and entity
// declarations are refused (no entity expansion attacks).
//
// Thread safety: a writer or a parse belongs to one thread.

#ifndef THINFS_META_THIN_XML_H_
#define THINFS_META_THIN_XML_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "core/status.h"

namespace thinfs::meta {

struct ThinSuperblock {
  std::string uuid;
  uint64_t time = 0;
  uint64_t transaction = 0;
  uint64_t flags = 0;
  uint64_t version = 2;
  uint64_t data_block_size = 0;  // 512-byte sectors
  uint64_t nr_data_blocks = 0;
};

struct ThinDevice {
  uint64_t dev_id = 0;
  uint64_t mapped_blocks = 0;
  uint64_t transaction = 0;
  uint64_t creation_time = 0;
  uint64_t snap_time = 0;
};

// `length` blocks from origin_begin map to data_begin, data_begin + 1, ...
// (a single_mapping has length 1).
struct ThinRange {
  uint64_t origin_begin = 0;
  uint64_t data_begin = 0;
  uint64_t length = 1;
  uint64_t time = 0;
};

// Writes thin_dump's layout exactly (two-space indent, attribute order),
// so that our dump and thin_dump's compare line by line. Consecutive
// mappings (origin and data both +1, same time) become one range_mapping,
// as thin_dump prints them.
class ThinXmlWriter {
 public:
  explicit ThinXmlWriter(std::FILE* out) : out_(out) {}
  ThinXmlWriter(const ThinXmlWriter&) = delete;
  ThinXmlWriter& operator=(const ThinXmlWriter&) = delete;

  void BeginSuperblock(const ThinSuperblock& sb);
  void BeginDevice(const ThinDevice& d);
  // REQUIRES: inside a device; origin blocks strictly increasing.
  void Map(uint64_t origin, uint64_t data, uint64_t time);
  void EndDevice();
  void EndSuperblock();
  // kIOError when a write to the stream failed (checked once, at the end).
  Status Finish(const std::string& what);

 private:
  void FlushRange();

  std::FILE* out_;
  bool have_range_ = false;
  ThinRange range_;
};

// Receives the parse, element by element, in document order.
class ThinXmlHandler {
 public:
  virtual ~ThinXmlHandler() = default;
  virtual Status OnSuperblock(const ThinSuperblock& sb) = 0;
  virtual Status OnDevice(const ThinDevice& d) = 0;
  // Validated: length >= 1, no overflow of origin or data ranges, data
  // blocks below nr_data_blocks.
  virtual Status OnMapping(const ThinRange& r) = 0;
  // The device's mapped_blocks equalled the blocks of its mappings.
  virtual Status OnDeviceEnd() = 0;
};

// Parses the XML read from `in` (until EOF). `progress`, when set, is
// called now and then with the bytes consumed so far.
// Returns kInvalidArgument "LINE:COL: ..." for malformed, truncated or
// inconsistent input, kIOError for a read error, or the handler's error
// (with the position prefix).
Status ParseThinXml(std::FILE* in, ThinXmlHandler* handler,
                    const std::function<void(uint64_t bytes)>& progress = {});
// The same over a buffer (tests, fuzzing).
Status ParseThinXml(const std::string& text, ThinXmlHandler* handler);

}  // namespace thinfs::meta

#endif  // THINFS_META_THIN_XML_H_
