// libFuzzer target for the send stream reader (core/send_stream.h): any
// input is parsed or refused with a kCorruption naming a stream byte within
// the input, without crashing or allocating more than one record's payload.
// A stream accepted to its END record is re-encoded by StreamWriter from
// what the reader returned, and must come out byte for byte the same: the
// reader accepts exactly what the writer produces.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/send_stream.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  thinfs::StreamReader reader([&](std::span<std::byte> buf) -> thinfs::Result<size_t> {
    size_t n = std::min(buf.size(), size - pos);
    if (n > 0) std::memcpy(buf.data(), data + pos, n);
    pos += n;
    return n;
  });
  std::vector<std::byte> again;
  auto sink = [&](std::span<const std::byte> b) {
    again.insert(again.end(), b.begin(), b.end());
    return thinfs::Status::Ok();
  };
  thinfs::Result<thinfs::StreamHeader> h = reader.ReadHeader();
  if (!h.ok()) {
    if (!h.status().IsCorruption()) std::abort();
    return 0;
  }
  thinfs::StreamWriter writer(sink, *h);
  if (!writer.WriteHeader().ok()) std::abort();
  while (true) {
    thinfs::Result<thinfs::StreamRecord> r = reader.ReadRecord();
    if (!r.ok()) {
      if (!r.status().IsCorruption() || r.status().message().rfind("stream byte ", 0) != 0) {
        std::abort();
      }
      return 0;
    }
    thinfs::Status s;
    switch (r->type) {
      case thinfs::StreamRecordType::kData:
        if (r->data.size() != r->length) std::abort();
        s = writer.Data(r->offset, r->data);
        break;
      case thinfs::StreamRecordType::kHole:
        s = writer.Hole(r->offset, r->length);
        break;
      case thinfs::StreamRecordType::kEnd:
        s = writer.End();
        if (!s.ok() || again.size() != size || std::memcmp(again.data(), data, size) != 0) {
          std::abort();
        }
        return 0;
    }
    if (!s.ok()) std::abort();
  }
}
