// libFuzzer target for the thin_dump XML parser (meta/thin_xml.h): any
// input is parsed or rejected with a "LINE:COLUMN: " error, without
// crashing, and what is accepted obeys the parser's promises (data blocks
// inside the data area, mapped_blocks equal to the mappings' blocks).
// Accepted documents of modest size are written back with ThinXmlWriter
// and parsed again: the same blocks must come back.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "meta/thin_xml.h"

namespace {

using thinfs::Status;
using namespace thinfs::meta;

struct Block {
  uint64_t device, origin, data, time;
  bool operator==(const Block&) const = default;
};

class Collect final : public ThinXmlHandler {
 public:
  Status OnSuperblock(const ThinSuperblock& s) override {
    sb = s;
    return Status::Ok();
  }
  Status OnDevice(const ThinDevice& d) override {
    devices.push_back(d);
    counted = 0;
    return Status::Ok();
  }
  Status OnMapping(const ThinRange& r) override {
    if (r.length == 0 || r.data_begin >= sb.nr_data_blocks ||
        r.length > sb.nr_data_blocks - r.data_begin) {
      std::abort();  // the parser promised to refuse these
    }
    counted += r.length;
    total += r.length;
    if (total <= kMaxExpanded) {
      for (uint64_t i = 0; i < r.length; ++i) {
        blocks.push_back({devices.back().dev_id, r.origin_begin + i, r.data_begin + i, r.time});
      }
    }
    return Status::Ok();
  }
  Status OnDeviceEnd() override {
    if (counted != devices.back().mapped_blocks) std::abort();
    return Status::Ok();
  }

  static constexpr uint64_t kMaxExpanded = 4096;
  ThinSuperblock sb;
  std::vector<ThinDevice> devices;
  std::vector<Block> blocks;
  uint64_t counted = 0;
  uint64_t total = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Collect c;
  Status s = ParseThinXml(text, &c);
  if (!s.ok()) {
    // Every refusal names a position "LINE:COLUMN: ".
    const std::string& m = s.message();
    const size_t colon = m.find(':');
    if (colon == 0 || colon == std::string::npos) std::abort();
    return 0;
  }
  if (c.total > Collect::kMaxExpanded) return 0;
  // Origins must increase within a device for the writer; skip otherwise.
  for (size_t i = 1; i < c.blocks.size(); ++i) {
    if (c.blocks[i].device == c.blocks[i - 1].device &&
        c.blocks[i].origin <= c.blocks[i - 1].origin) {
      return 0;
    }
  }
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return 0;
  {
    ThinXmlWriter w(f);
    ThinSuperblock sb = c.sb;
    sb.uuid = "";  // the writer does not escape (our uuids need none)
    w.BeginSuperblock(sb);
    size_t next = 0;
    for (const ThinDevice& d : c.devices) {
      w.BeginDevice(d);
      while (next < c.blocks.size() && c.blocks[next].device == d.dev_id) {
        w.Map(c.blocks[next].origin, c.blocks[next].data, c.blocks[next].time);
        ++next;
      }
      w.EndDevice();
    }
    w.EndSuperblock();
    (void)w.Finish("memory");
  }
  std::fclose(f);
  const std::string again_text(buf, len);
  std::free(buf);
  Collect again;
  if (!ParseThinXml(again_text, &again).ok()) std::abort();
  // Devices with a repeated dev_id would interleave differently; compare
  // only when ids are unique.
  if (again.blocks != c.blocks) {
    for (size_t i = 0; i < c.devices.size(); ++i) {
      for (size_t j = i + 1; j < c.devices.size(); ++j) {
        if (c.devices[i].dev_id == c.devices[j].dev_id) return 0;
      }
    }
    std::abort();
  }
  return 0;
}
