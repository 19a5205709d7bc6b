// The thin_dump XML writer and parser (meta/thin_xml.h): the writer's exact
// layout, parse of what it writes, and a precise "LINE:COLUMN: what" for
// each kind of bad input. The fuzzer's seed corpus (fuzz/corpus/thin_xml)
// is replayed too, so that a committed crasher stays fixed.

#include "meta/thin_xml.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace thinfs::meta {
namespace {

// Records the parse as text, one line per callback.
class Recorder final : public ThinXmlHandler {
 public:
  Status OnSuperblock(const ThinSuperblock& sb) override {
    log += "sb " + sb.uuid + " " + std::to_string(sb.data_block_size) + " " +
           std::to_string(sb.nr_data_blocks) + "\n";
    return Status::Ok();
  }
  Status OnDevice(const ThinDevice& d) override {
    log += "dev " + std::to_string(d.dev_id) + " " + std::to_string(d.mapped_blocks) + "\n";
    return Status::Ok();
  }
  Status OnMapping(const ThinRange& r) override {
    if (fail_at_origin && r.origin_begin == *fail_at_origin) {
      return Status::InvalidArgument("handler refuses");
    }
    log += "map " + std::to_string(r.origin_begin) + " " + std::to_string(r.data_begin) + " " +
           std::to_string(r.length) + " " + std::to_string(r.time) + "\n";
    return Status::Ok();
  }
  Status OnDeviceEnd() override {
    log += "end\n";
    return Status::Ok();
  }
  std::string log;
  std::optional<uint64_t> fail_at_origin;
};

std::string Written() {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ThinXmlWriter w(f);
  ThinSuperblock sb;
  sb.uuid = "u";
  sb.time = 1;
  sb.transaction = 3;
  sb.data_block_size = 128;
  sb.nr_data_blocks = 100;
  w.BeginSuperblock(sb);
  w.BeginDevice(ThinDevice{1, 4, 0, 0, 1});
  w.Map(0, 10, 1);
  w.Map(1, 11, 1);
  w.Map(2, 12, 0);  // time differs: new run
  w.Map(5, 13, 0);  // origin gap: new run
  w.EndDevice();
  w.BeginDevice(ThinDevice{7, 0, 0, 0, 1});
  w.EndDevice();
  w.EndSuperblock();
  EXPECT_TRUE(w.Finish("memory").ok());
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

TEST(ThinXmlTest, WriterUsesThinDumpLayoutAndMergesRuns) {
  EXPECT_EQ(Written(),
            "<superblock uuid=\"u\" time=\"1\" transaction=\"3\" flags=\"0\" version=\"2\" "
            "data_block_size=\"128\" nr_data_blocks=\"100\">\n"
            "  <device dev_id=\"1\" mapped_blocks=\"4\" transaction=\"0\" creation_time=\"0\" "
            "snap_time=\"1\">\n"
            "    <range_mapping origin_begin=\"0\" data_begin=\"10\" length=\"2\" time=\"1\"/>\n"
            "    <single_mapping origin_block=\"2\" data_block=\"12\" time=\"0\"/>\n"
            "    <single_mapping origin_block=\"5\" data_block=\"13\" time=\"0\"/>\n"
            "  </device>\n"
            "  <device dev_id=\"7\" mapped_blocks=\"0\" transaction=\"0\" creation_time=\"0\" "
            "snap_time=\"1\">\n"
            "  </device>\n"
            "</superblock>\n");
}

TEST(ThinXmlTest, ParsesWhatTheWriterWrites) {
  Recorder r;
  Status s = ParseThinXml(Written(), &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(r.log,
            "sb u 128 100\n"
            "dev 1 4\nmap 0 10 2 1\nmap 2 12 1 0\nmap 5 13 1 0\nend\n"
            "dev 7 0\nend\n");
}

TEST(ThinXmlTest, StreamsFromAFileInPieces) {
  // More than one 1 MiB read, so the parser sees the document in pieces.
  std::string doc = "<superblock uuid=\"\" time=\"0\" transaction=\"0\" flags=\"0\" version=\"2\" "
                    "data_block_size=\"128\" nr_data_blocks=\"100000\">\n"
                    "<device dev_id=\"1\" mapped_blocks=\"40000\" transaction=\"0\" "
                    "creation_time=\"0\" snap_time=\"0\">\n";
  for (int i = 0; i < 40000; ++i) {
    doc += "<single_mapping origin_block=\"" + std::to_string(i) + "\" data_block=\"" +
           std::to_string(i) + "\" time=\"0\"/>\n";
  }
  doc += "</device></superblock>\n";
  ASSERT_GT(doc.size(), size_t{1} << 20);
  std::FILE* f = fmemopen(doc.data(), doc.size(), "r");
  ASSERT_NE(f, nullptr);
  Recorder r;
  uint64_t last_progress = 0;
  Status s = ParseThinXml(f, &r, [&](uint64_t bytes) { last_progress = bytes; });
  std::fclose(f);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(last_progress, doc.size());
  EXPECT_NE(r.log.find("map 39999 39999 1 0\nend\n"), std::string::npos);
}

const char kHead[] =
    "<superblock uuid=\"\" time=\"0\" transaction=\"0\" flags=\"0\" version=\"2\" "
    "data_block_size=\"128\" nr_data_blocks=\"10\">\n";
const char kDev[] =
    "  <device dev_id=\"1\" mapped_blocks=\"1\" transaction=\"0\" creation_time=\"0\" "
    "snap_time=\"0\">\n";

struct Bad {
  std::string doc;
  std::string error;  // expected substring, position included
};

TEST(ThinXmlTest, BadInputGetsPositionAndReason) {
  const std::string head = kHead, dev = kDev;
  const std::string map0 = "    <single_mapping origin_block=\"0\" data_block=\"0\" time=\"0\"/>\n";
  const std::string tail = "  </device>\n</superblock>\n";
  const std::vector<Bad> cases = {
      {"", "1:0: no element found"},
      {head + dev + map0, "4:0: no element found"},  // truncated
      {head + dev + "    <single_mapping origin_block=\"0\" data_blo", "3:4: unclosed token"},
      {"<device dev_id=\"1\"/>", "1:0: <device> must be a child of <superblock>"},
      {head + map0 + tail, "2:4: <single_mapping> must be a child of <device>"},
      {head + dev + "    <single_mapping origin_block=\"x\" data_block=\"0\" time=\"0\"/>\n" + tail,
       "3:4: <single_mapping> attribute origin_block=\"x\" is not an unsigned 64-bit decimal"},
      {head + dev + "    <single_mapping origin_block=\"-1\" data_block=\"0\" time=\"0\"/>\n" + tail,
       "is not an unsigned 64-bit decimal"},
      {head + dev + "    <single_mapping origin_block=\"18446744073709551616\" data_block=\"0\" "
                    "time=\"0\"/>\n" + tail,
       "3:4: <single_mapping> attribute origin_block=\"18446744073709551616\""},
      {head + dev + "    <single_mapping data_block=\"0\" time=\"0\"/>\n" + tail,
       "3:4: <single_mapping> lacks the attribute origin_block"},
      {head + dev + "    <single_mapping origin_block=\"0\" data_block=\"10\" time=\"0\"/>\n" + tail,
       "3:4: data blocks 10..10 of device 1 lie beyond the data area (nr_data_blocks=10)"},
      {head + dev + "    <range_mapping origin_begin=\"0\" data_begin=\"5\" length=\"6\" "
                    "time=\"0\"/>\n" + tail,
       "3:4: data blocks 5..10 of device 1 lie beyond the data area"},
      {head + dev + "    <range_mapping origin_begin=\"0\" data_begin=\"5\" length=\"0\" "
                    "time=\"0\"/>\n" + tail,
       "3:4: range_mapping of length 0"},
      {head + dev + "    <range_mapping origin_begin=\"18446744073709551615\" data_begin=\"0\" "
                    "length=\"2\" time=\"0\"/>\n" + tail,
       "3:4: origin blocks 18446744073709551615 + 2 overflow 64 bits"},
      {head + dev + map0 + map0.substr(0, 4) + "<bogus/>\n" + tail, "4:4: unknown element <bogus>"},
      {head + dev + tail, "3:2: device 1 says mapped_blocks=1 but its mappings cover 0 blocks"},
      {head + dev + map0 + "hello" + tail, "4:0: unexpected text 'hello'"},
      {"<?xml version=\"1.0\"?>\n<!DOCTYPE superblock [<!ENTITY a \"aaaa\">]>\n" + head + tail,
       "2:21: DOCTYPE declarations are not allowed"},
      {head + "<superblock/>" + tail, "2:0: <superblock> must be the document's root"},
      {"<superblock uuid=\"\" time=\"0\" transaction=\"0\" flags=\"0\" version=\"2\" "
       "data_block_size=\"0\" nr_data_blocks=\"10\"/>",
       "1:0: data_block_size must not be zero"},
      {head + "</superblock>\n<superblock/>", "3:0: junk after document element"},
      {head + dev + "    <single_mapping origin_block=\"0\" origin_block=\"0\" data_block=\"0\" "
                    "time=\"0\"/>\n" + tail,
       "3:37: duplicate attribute"},
  };
  for (const Bad& b : cases) {
    Recorder r;
    Status s = ParseThinXml(b.doc, &r);
    EXPECT_TRUE(s.IsInvalidArgument()) << b.doc << "\n-> " << s.ToString();
    EXPECT_NE(s.message().find(b.error), std::string::npos)
        << "input:\n" << b.doc << "\nexpected: " << b.error << "\ngot: " << s.message();
  }
}

TEST(ThinXmlTest, HandlerErrorsGetThePosition) {
  Recorder r;
  r.fail_at_origin = 3;
  const std::string doc = std::string(kHead) +
                          "  <device dev_id=\"1\" mapped_blocks=\"2\" transaction=\"0\" "
                          "creation_time=\"0\" snap_time=\"0\">\n"
                          "    <single_mapping origin_block=\"0\" data_block=\"0\" time=\"0\"/>\n"
                          "    <single_mapping origin_block=\"3\" data_block=\"1\" time=\"0\"/>\n"
                          "  </device>\n</superblock>\n";
  Status s = ParseThinXml(doc, &r);
  EXPECT_EQ(s.message(), "4:4: handler refuses");
}

TEST(ThinXmlTest, SeedCorpusParsesWithoutCrashing) {
  const std::filesystem::path dir = std::filesystem::path(THINFS_SOURCE_DIR) / "fuzz/corpus/thin_xml";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    Recorder r;
    (void)ParseThinXml(ss.str(), &r);  // any status; must not crash
    ++files;
  }
  EXPECT_GE(files, 5);
}

}  // namespace
}  // namespace thinfs::meta
