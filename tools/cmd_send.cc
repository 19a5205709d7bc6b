// Replication commands: diff (thin_delta), send and receive (zfs send /
// rbd export-diff). They read the committed block map with
// core/resolved_walk.h; the stream format is core/send_stream.h, the
// identities of bases tools/stream_ids.h.
//
// diff and send open an unmounted pool directly; on a mounted one they
// read a checkpoint of its committed metadata (the daemon writes it) and
// the data through the mounted files (ReadView). receive builds the device
// in an unmounted pool opened here, or in a mounted one through the
// daemon's control socket and the mounted files (ReceiveTarget).
//
// Receive is atomic: it builds the device under a temporary name
// (TempNameFor), renames it into place only after the END record verified,
// and deletes it on any error. A crash mid-receive leaves at most that
// temporary device, which the next receive of the same name deletes first.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/resolved_walk.h"
#include "core/pool.h"
#include "core/send_stream.h"
#include "core/size.h"
#include "meta/pool_dir.h"
#include "tools/cli.h"
#include "tools/control_client.h"
#include "tools/daemon_checkpoint.h"
#include "tools/pool_here.h"
#include "tools/progress.h"
#include "tools/receive_target.h"
#include "tools/stream_ids.h"

namespace thinfs::tools {

namespace {

// The live, named device `name` among `devices`.
Result<const DeviceRecord*> FindNamed(const std::vector<DeviceRecord>& devices,
                                      const std::string& name) {
  for (const DeviceRecord& r : devices) {
    if (r.name == name && (r.flags & (DeviceRecord::kHidden | DeviceRecord::kDeleting |
                                      DeviceRecord::kDetached)) == 0) {
      return &r;
    }
  }
  return Status::NotFound("no device '" + name + "'");
}

// Reads bytes of a device like pread(2): short only at its end.
using DataReader = std::function<Result<size_t>(uint64_t offset, std::span<std::byte> buf)>;

// What diff and send read: committed metadata and device data, of an
// unmounted pool opened here, or of a mounted one: a checkpoint of its
// metadata (DaemonCheckpoint) and the data through the mounted files.
struct ReadView {
  std::string root;
  std::string mountpoint;  // "" when opened here
  Superblock sb;
  MetadataStore* store = nullptr;
  std::unique_ptr<OpenPool> here;
  std::unique_ptr<DaemonCheckpoint> checkpoint;
  std::unique_ptr<meta::RocksDbStore> checkpoint_store;

  // REQUIRES: no walk over `store` is alive.
  Status Close() {
    Status s = here ? here->Close() : Status::Ok();
    checkpoint_store.reset();
    checkpoint.reset();
    return s;
  }

  Result<DataReader> OpenData(const DeviceRecord& device) {
    if (mountpoint.empty()) {
      THINFS_ASSIGN_OR_RETURN(std::shared_ptr<Volume> vol, here->pool->OpenVolume(device.id));
      return DataReader([vol](uint64_t offset, std::span<std::byte> buf) {
        return vol->Read(offset, buf);
      });
    }
    const std::string path = mountpoint + "/" + device.name;
    int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (raw < 0) return Status::FromErrno(errno, "open " + path);
    auto fd = std::shared_ptr<int>(new int(raw), [](int* p) {
      ::close(*p);
      delete p;
    });
    return DataReader([fd, path](uint64_t offset, std::span<std::byte> buf) -> Result<size_t> {
      size_t done = 0;
      while (done < buf.size()) {
        ssize_t n = ::pread(*fd, buf.data() + done, buf.size() - done,
                            static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status::FromErrno(errno, "read " + path);
        if (n == 0) break;
        done += static_cast<size_t>(n);
      }
      return done;
    });
  }
};

// Opens `dir` for reading: directly when unmounted, else through the daemon.
Result<std::unique_ptr<ReadView>> OpenForReading(const std::string& dir) {
  auto view = std::make_unique<ReadView>();
  view->root = meta::PoolPaths::For(dir).root;
  Result<std::unique_ptr<OpenPool>> here = OpenPoolHere(dir, true);
  if (here.ok()) {
    view->here = std::move(*here);
    view->sb = view->here->sb;
    view->store = view->here->pool->store();
    return view;
  }
  if (here.status().code() != Status::Code::kBusy) return here.status();
  std::optional<Result<std::string>> where = DaemonMountpoint(dir);
  if (!where) return here.status();  // locked by something that is not a daemon
  if (!where->ok()) return where->status();
  view->mountpoint = **where;
  bool answered = false;
  Result<std::unique_ptr<DaemonCheckpoint>> cp =
      DaemonCheckpoint::Take(meta::PoolPaths::For(dir), ".send-", &answered);
  if (!answered) return here.status();
  if (!cp.ok()) return cp.status().WithContext("checkpoint of the mounted pool");
  view->checkpoint = std::move(*cp);
  THINFS_ASSIGN_OR_RETURN(view->checkpoint_store,
                          OpenStoreHere(view->checkpoint->dir(), /*read_only=*/true));
  view->store = view->checkpoint_store.get();
  THINFS_ASSIGN_OR_RETURN(view->sb, view->store->ReadSuperblock());
  return view;
}

int FailStatus(const CommandLine& cl, const Status& s) {
  return cl.Fail(s.IsInvalidArgument() ? kExitUsage : kExitFailure, s.message());
}

// ---- diff -----------------------------------------------------------------------

int Diff(const CommandLine& cl) {
  const std::string format = cl.Get<std::string>("format");
  if (format != "text" && format != "json" && format != "xml") {
    return cl.Fail(kExitUsage, "--format must be text, json or xml, not '" + format + "'");
  }
  const bool same = cl.Get<bool>("same");
  Result<std::unique_ptr<ReadView>> op = OpenForReading(cl.Arg(0));
  if (!op.ok()) return FailStatus(cl, op.status());
  MetadataStore* store = (*op)->store;
  const uint64_t bs = (*op)->sb.block_size;
  Result<std::vector<DeviceRecord>> devices = store->LoadDevices();
  if (!devices.ok()) return FailStatus(cl, devices.status());
  Result<const DeviceRecord*> left = FindNamed(*devices, cl.Arg(1));
  if (!left.ok()) return FailStatus(cl, left.status());
  Result<const DeviceRecord*> right = FindNamed(*devices, cl.Arg(2));
  if (!right.ok()) return FailStatus(cl, right.status());
  auto lw = ResolvedWalk::Create(store, *devices, (*left)->id, bs);
  if (!lw.ok()) return FailStatus(cl, lw.status());
  auto rw = ResolvedWalk::Create(store, *devices, (*right)->id, bs);
  if (!rw.ok()) return FailStatus(cl, rw.status());

  std::string out;
  JsonWriter j;
  uint64_t differ_bytes = 0;
  const uint64_t max_size = std::max((*left)->size, (*right)->size);
  auto bytes_of = [&](uint64_t block) { return std::min(block * bs, max_size); };
  if (format == "xml") {
    // thin_delta's layout; data_block_size in 512-byte sectors.
    out += "<superblock uuid=\"" + meta::FormatUuid((*op)->sb.uuid) + "\" time=\"0\" transaction=\"" +
           std::to_string((*op)->sb.transaction_id) + "\" data_block_size=\"" +
           std::to_string(bs / 512) + "\" nr_data_blocks=\"" +
           std::to_string((*op)->sb.data_blocks) + "\">\n  <diff left=\"" +
           std::to_string((*left)->id.value) + "\" right=\"" + std::to_string((*right)->id.value) +
           "\">\n";
  } else if (format == "json") {
    j.BeginObject()
        .Key("left").String(cl.Arg(1))
        .Key("right").String(cl.Arg(2))
        .Key("block_size").Uint(bs)
        .Key("ranges").BeginArray();
  }
  Status s = DiffWalks(lw->get(), rw->get(), same, [&](const DiffRange& r) -> Status {
    const uint64_t offset = bytes_of(r.begin);
    const uint64_t length = bytes_of(r.end) - offset;
    if (r.kind != DiffKind::kSame) differ_bytes += length;
    if (format == "xml") {
      out += std::string("    <") + DiffKindName(r.kind) + " begin=\"" + std::to_string(r.begin) +
             "\" length=\"" + std::to_string(r.end - r.begin) + "\"/>\n";
    } else if (format == "json") {
      j.BeginObject()
          .Key("kind").String(DiffKindName(r.kind))
          .Key("offset").Uint(offset)
          .Key("length").Uint(length)
          .EndObject();
    } else {
      char line[160];
      std::snprintf(line, sizeof line, "%-10s %16llu %16llu  %s at %s\n", DiffKindName(r.kind),
                    static_cast<unsigned long long>(offset),
                    static_cast<unsigned long long>(length), FormatSize(length).c_str(),
                    FormatSize(offset).c_str());
      out += line;
    }
    return Status::Ok();
  });
  if (!s.ok()) return FailStatus(cl, s);
  if (format == "xml") {
    out += "  </diff>\n</superblock>\n";
  } else if (format == "json") {
    j.EndArray().Key("differ_bytes").Uint(differ_bytes).EndObject();
    out = j.str() + "\n";
  } else {
    out = std::string("KIND                 OFFSET           LENGTH\n") + out +
          FormatSize(differ_bytes) + " (" + std::to_string(differ_bytes) + " bytes) differ\n";
  }
  std::cout << out << std::flush;
  // The walks' iterators must go before the store closes.
  lw->reset();
  rw->reset();
  Status closed = (*op)->Close();
  if (!closed.ok()) return FailStatus(cl, closed);
  return kExitOk;
}

// ---- send -----------------------------------------------------------------------

// Writes to a file descriptor, retrying short writes.
Status WriteAll(int fd, std::span<const std::byte> buf, const std::string& what) {
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::write(fd, buf.data() + done, buf.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write " + what);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Sends bytes [offset, offset + length) of a device of `size` bytes as DATA
// records.
Status SendData(const DataReader& read, uint64_t size, StreamWriter* w, uint64_t offset,
                uint64_t length, uint64_t bs, std::vector<std::byte>* buf) {
  const uint64_t chunk = std::max(kStreamWriterDataBytes / bs, uint64_t{1}) * bs;
  const uint64_t end = std::min(offset + length, size);
  while (offset < end) {
    const uint64_t n = std::min(chunk, end - offset);
    buf->resize(n);
    THINFS_ASSIGN_OR_RETURN(size_t got, read(offset, *buf));
    if (got != n) return Status::IOError("short read of the device at " + std::to_string(offset));
    THINFS_RETURN_IF_ERROR(w->Data(offset, *buf));
    offset += n;
  }
  return Status::Ok();
}

int Send(const CommandLine& cl) {
  const std::string& name = cl.Arg(1);
  int fd = 1;
  std::string out_name = "standard output";
  if (cl.Has("output")) {
    out_name = cl.Get<std::string>("output");
  } else if (::isatty(1) == 1) {
    return cl.Fail(kExitUsage, "refusing to write a stream to a terminal (use -o FILE or a pipe)");
  }
  Result<std::unique_ptr<ReadView>> op = OpenForReading(cl.Arg(0));
  if (!op.ok()) return FailStatus(cl, op.status());
  ReadView& p = **op;
  MetadataStore* store = p.store;
  const uint64_t bs = p.sb.block_size;
  Result<std::vector<DeviceRecord>> devices = store->LoadDevices();
  if (!devices.ok()) return FailStatus(cl, devices.status());
  Result<const DeviceRecord*> target = FindNamed(*devices, name);
  if (!target.ok()) return FailStatus(cl, target.status());
  Result<StreamGuids> guids = StreamGuids::Load(p.root);
  if (!guids.ok()) return FailStatus(cl, guids.status());

  StreamHeader h;
  h.block_size = bs;
  h.device_size = (*target)->size;
  std::memcpy(h.pool_uuid, p.sb.uuid, 16);
  h.guid = guids->IdentityOf(p.sb.uuid, **target);
  const DeviceRecord* base = nullptr;
  if (cl.Has("from")) {
    Result<const DeviceRecord*> b = FindNamed(*devices, cl.Get<std::string>("from"));
    if (!b.ok()) return FailStatus(cl, Status::NotFound("--from: " + b.status().message()));
    base = *b;
    h.flags |= StreamHeader::kIncremental;
    h.base_guid = guids->IdentityOf(p.sb.uuid, *base);
    h.base_size = base->size;
  }
  auto target_walk = ResolvedWalk::Create(store, *devices, (*target)->id, bs);
  if (!target_walk.ok()) return FailStatus(cl, target_walk.status());
  Result<DataReader> data = p.OpenData(**target);
  if (!data.ok()) return FailStatus(cl, data.status());

  // Only a regular file is synced at the end, and removed on failure
  // (-o /dev/null or a FIFO is left alone).
  bool regular = false;
  if (cl.Has("output")) {
    fd = ::open(out_name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return cl.Fail(kExitFailure, "cannot create " + out_name + ": " + std::strerror(errno));
    struct stat st {};
    regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  }
  ProgressLine progress("sending ");
  StreamWriter w(
      [&](std::span<const std::byte> b) {
        return WriteAll(fd, b, out_name);
      },
      h);
  std::vector<std::byte> buf;
  Status s = w.WriteHeader();
  const uint64_t total = base == nullptr ? (*target)->mapped_blocks * bs : 0;
  if (s.ok() && base == nullptr) {
    // Full: the mapped runs as DATA; holes are simply not sent.
    std::optional<DiffRange> run;
    auto flush = [&]() -> Status {
      if (!run) return Status::Ok();
      THINFS_RETURN_IF_ERROR(
          SendData(*data, (*target)->size, &w, run->begin * bs, (run->end - run->begin) * bs, bs,
                   &buf));
      progress.ShowBytes(name.c_str(), w.data_bytes(), total);
      run.reset();
      return Status::Ok();
    };
    while (s.ok()) {
      Result<std::optional<ResolvedBlock>> b = (*target_walk)->Next();
      if (!b.ok()) {
        s = b.status();
        break;
      }
      if (!*b) break;
      const uint64_t vb = (**b).vblock;
      if (run && run->end == vb && (run->end - run->begin) * bs < kStreamWriterDataBytes) {
        run->end++;
        continue;
      }
      s = flush();
      run = DiffRange{vb, vb + 1, DiffKind::kRightOnly};
    }
    if (s.ok()) s = flush();
  } else if (s.ok()) {
    // Incremental: what differs from the base. Ranges the base has beyond
    // the new size need nothing: receive resizes first.
    auto base_walk = ResolvedWalk::Create(store, *devices, base->id, bs);
    if (!base_walk.ok()) {
      s = base_walk.status();
    } else {
      const uint64_t size = (*target)->size;
      s = DiffWalks(base_walk->get(), target_walk->get(), false, [&](const DiffRange& r) {
        const uint64_t offset = r.begin * bs;
        if (offset >= size) return Status::Ok();
        const uint64_t length = std::min(r.end * bs, size) - offset;
        Status st = r.kind == DiffKind::kLeftOnly
                        ? w.Hole(offset, length)
                        : SendData(*data, (*target)->size, &w, offset, length, bs, &buf);
        progress.ShowBytes(name.c_str(), w.bytes_written(), 0);
        return st;
      });
    }
  }
  if (s.ok()) s = w.End();
  if (s.ok() && regular && ::fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + out_name);
  if (fd != 1 && ::close(fd) != 0 && s.ok()) s = Status::FromErrno(errno, "close " + out_name);
  if (!s.ok()) {
    if (regular) ::unlink(out_name.c_str());
    return FailStatus(cl, s);
  }
  target_walk->reset();
  Status closed = p.Close();
  if (!closed.ok()) return FailStatus(cl, closed);
  if (cl.Get<bool>("verbose")) {
    std::cerr << "sent " << name << (base ? " since " + base->name : std::string()) << ": "
              << w.data_bytes() << " data bytes, " << w.hole_bytes() << " hole bytes, "
              << w.bytes_written() << " stream bytes" << std::endl;
  }
  return kExitOk;
}

// ---- receive --------------------------------------------------------------------

// The temporary name a receive of `name` builds under: fixed length, so any
// valid name has one, and recognisable in `thinfs list`.
std::string TempNameFor(const std::string& name) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH64(name.data(), name.size(), 0)));
  return std::string("thinfs-receive-") + hex + ".partial";
}

int Receive(const CommandLine& cl) {
  const std::string& name = cl.Arg(1);
  const bool force = cl.Get<bool>("force");
  if (Status v = Pool::ValidateName(name); !v.ok()) return FailStatus(cl, v);
  int fd = 0;
  std::string in_name = "standard input";
  uint64_t in_size = 0;
  if (cl.Has("input")) {
    in_name = cl.Get<std::string>("input");
    fd = ::open(in_name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cl.Fail(kExitFailure, "cannot open " + in_name + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) in_size = static_cast<uint64_t>(st.st_size);
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd > 0) ::close(fd);
    }
  } closer{fd};
  StreamReader reader([fd, &in_name](std::span<std::byte> buf) -> Result<size_t> {
    while (true) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) return Status::FromErrno(errno, "read " + in_name);
    }
  });
  Result<StreamHeader> h = reader.ReadHeader();
  if (!h.ok()) return FailStatus(cl, h.status());

  Result<std::unique_ptr<ReceiveTarget>> op = OpenReceiveTarget(cl.Arg(0));
  if (!op.ok()) return FailStatus(cl, op.status());
  ReceiveTarget& pool = **op;
  if (h->block_size != pool.block_size()) {
    return cl.Fail(kExitFailure, "stream block size " + FormatSize(h->block_size) +
                                     " differs from the pool's " + FormatSize(pool.block_size()) +
                                     " (re-blocking is not supported)");
  }
  Result<std::vector<DeviceRecord>> devices = pool.Devices();
  if (!devices.ok()) return FailStatus(cl, devices.status());
  if (FindNamed(*devices, name).ok() && !force) {
    return cl.Fail(kExitFailure, "device '" + name + "' exists (use --force to replace it)");
  }
  Result<StreamGuids> guids = StreamGuids::Load(pool.root());
  if (!guids.ok()) return FailStatus(cl, guids.status());
  const DeviceRecord* base = nullptr;
  if (h->incremental()) {
    const std::string* modified = nullptr;
    base = guids->FindByGuid(h->base_guid, *devices, &modified);
    if (base == nullptr) {
      return cl.Fail(kExitFailure,
                     modified != nullptr
                         ? "the base of this incremental stream, device '" + *modified +
                               "', was modified since it was received (guid " +
                               h->base_guid.Hex() + ")"
                         : "this pool has no device with the stream's base guid " +
                               h->base_guid.Hex() +
                               " (receive the base first, or send a full stream)");
    }
    if (base->size != h->base_size) {
      return cl.Fail(kExitFailure, "base '" + base->name + "' has size " +
                                       std::to_string(base->size) + ", the stream expects " +
                                       std::to_string(h->base_size));
    }
  }

  // A leftover of a crashed receive of the same name goes first.
  const std::string temp = TempNameFor(name);
  if (FindNamed(*devices, temp).ok()) {
    if (Status s = pool.DeleteDevice(temp); !s.ok()) return FailStatus(cl, s);
  }
  Status s = base != nullptr ? pool.CreateSnapshot(base->name, temp)
                             : pool.CreateDevice(temp, h->device_size);
  if (!s.ok()) return FailStatus(cl, s);
  uint64_t records = 0;
  {
    ProgressLine progress("receiving ");
    if (base != nullptr && base->size != h->device_size) {
      s = pool.ResizeDevice(temp, h->device_size);
    }
    if (s.ok()) s = pool.OpenData(temp);
    while (s.ok()) {
      Result<StreamRecord> r = reader.ReadRecord();
      if (!r.ok()) {
        s = r.status();
        break;
      }
      if (r->type == StreamRecordType::kEnd) break;
      s = r->type == StreamRecordType::kData ? pool.Write(r->offset, r->data)
                                             : pool.Punch(r->offset, r->length);
      if (!s.ok()) {
        s = s.WithContext("record " + std::to_string(r->number) + " at stream byte " +
                          std::to_string(reader.position()));
      }
      if ((++records & 63) == 0) progress.ShowBytes(name.c_str(), reader.position(), in_size);
    }
  }
  // Mounted, closing the device file fsyncs it: the data is committed.
  if (Status closed = pool.CloseData(); s.ok()) s = closed;
  if (s.ok()) s = pool.Commit();
  if (s.ok()) s = pool.RenameDevice(temp, name, force);
  if (s.ok()) s = pool.Commit();
  if (!s.ok()) {
    Status cleanup = pool.DeleteDevice(temp);
    if (cleanup.ok()) cleanup = pool.Commit();
    std::string msg = s.message();
    if (!cleanup.ok()) msg += "; removing the partial device " + temp + " failed: " + cleanup.message();
    return cl.Fail(kExitFailure, msg);
  }
  // The committed record of the device: what `send` and a later receive
  // compare the recorded mtime and size with, mounted or not.
  Result<std::vector<DeviceRecord>> after = pool.Devices();
  if (!after.ok()) return FailStatus(cl, after.status());
  Result<const DeviceRecord*> received = FindNamed(*after, name);
  if (!received.ok()) return FailStatus(cl, received.status());
  const ReceivedGuid entry{h->guid, (*received)->mtime_ns, (*received)->size};
  const uint64_t received_id = (*received)->id.value;
  Status closed = pool.Close();
  if (!closed.ok()) return FailStatus(cl, closed);
  // The device is in place; a crash before this line leaves it without its
  // stream guid (a later incremental onto it is refused, a full one works).
  s = guids->Record(received_id, entry, *after);
  if (!s.ok()) return cl.Fail(kExitFailure, "received, but recording its guid failed: " + s.message());
  if (cl.Get<bool>("verbose")) {
    std::cerr << "received " << name << (base ? " on top of " + base->name : std::string())
              << ": " << records << " records, guid " << h->guid.Hex() << std::endl;
  }
  return kExitOk;
}

}  // namespace

int RunDiff(const std::vector<std::string>& args) {
  CommandLine cl("diff", "POOL LEFT RIGHT [--format text|json|xml] [--same]",
                 "Shows the ranges where devices LEFT and RIGHT (typically two snapshots\n"
                 "of one lineage) read different data, from the metadata alone, like\n"
                 "thin_delta: blocks mapped on one side only (left_only, right_only) or\n"
                 "to different data blocks (different). Blocks that share a data block\n"
                 "are 'same'; blocks unmapped on both sides are not reported. Reads one\n"
                 "ordered pass of the block map per parent-chain level, no data.\n"
                 "On a mounted pool it reads a checkpoint of the committed metadata.");
  cl.Positional("POOL", "pool directory");
  cl.Positional("LEFT", "first device (e.g. the older snapshot)");
  cl.Positional("RIGHT", "second device");
  cl.AddOptions()
      ("format", po::value<std::string>()->default_value("text")->value_name("FMT"),
       "text (byte ranges), json, or xml (thin_delta's layout, in blocks)")
      ("same", po::bool_switch(), "also report the ranges that are the same");
  cl.SetEpilog(
      "Text columns: KIND OFFSET LENGTH (bytes), then the total that differs.\n"
      "JSON: {left, right, block_size, ranges: [{kind, offset, length}], differ_bytes}.\n\n"
      "Example:\n"
      "  thinfs diff /srv/pool vm1-monday vm1-tuesday\n"
      "  thinfs diff /srv/pool vm1-monday vm1 --format xml\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  return Diff(cl);
}

int RunSend(const std::vector<std::string>& args) {
  CommandLine cl("send", "POOL NAME [--from BASE] [-o FILE] [-v]",
                 "Writes device NAME as a self-describing stream (docs/send-stream.md) to\n"
                 "FILE or standard output: the whole device, or with --from only what\n"
                 "changed since snapshot BASE. Every record carries an XXH64 checksum;\n"
                 "holes are sent as HOLE records or not at all, never as zeros.\n"
                 "'thinfs receive' rebuilds the device in another pool. Works on a\n"
                 "mounted pool too (a checkpoint of the committed metadata, the data\n"
                 "read through the mount); NAME should be a snapshot nobody writes\n"
                 "meanwhile.");
  cl.Positional("POOL", "pool directory");
  cl.Positional("NAME", "device to send");
  cl.AddOptions()
      ("from", po::value<std::string>()->value_name("BASE"),
       "send only the difference from BASE (which the receiver must hold, as\n"
       "received from this pool, unchanged)")
      ("output,o", po::value<std::string>()->value_name("FILE"), "write to FILE, not stdout")
      ("verbose,v", po::bool_switch(), "print the totals on stderr");
  cl.SetEpilog(
      "Example:\n"
      "  thinfs send /srv/pool vm1-monday | ssh backup thinfs receive /srv/pool vm1-monday\n"
      "  thinfs send /srv/pool vm1-tuesday --from vm1-monday | \\\n"
      "      ssh backup thinfs receive /srv/pool vm1-tuesday\n"
      "  thinfs send /srv/pool vm1 -o /var/backups/vm1.thinfs\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  return Send(cl);
}

int RunReceive(const std::vector<std::string>& args) {
  CommandLine cl("receive", "POOL NAME [-i FILE] [--force] [-v]",
                 "Reads a stream written by 'thinfs send' from FILE or standard input and\n"
                 "creates device NAME from it, atomically. An incremental stream applies\n"
                 "on top of the device of this pool that was received with the stream's\n"
                 "base identity and has not changed since; it is refused otherwise.\n"
                 "Every record is verified; on any error (bad checksum, truncation, wrong\n"
                 "base or block size, records out of range) nothing is created and the\n"
                 "error names the stream byte offset and record. The device is built\n"
                 "under a temporary name (thinfs-receive-*.partial) and renamed into\n"
                 "place at the end; a crash leaves at most that, which the next receive\n"
                 "of NAME removes.\n\n"
                 "Works on a mounted pool too, while its other devices are in use: the\n"
                 "metadata changes go through the daemon's control socket, the data is\n"
                 "written through the mounted file of the temporary device, which is\n"
                 "fsync()ed and then renamed in the mount. With --force, a replaced\n"
                 "device still open in the mount (e.g. under a loop device) keeps\n"
                 "serving its old data to those who have it open until they close it,\n"
                 "as after rename(2) over an open file.");
  cl.Positional("POOL", "pool directory");
  cl.Positional("NAME", "device to create");
  cl.AddOptions()
      ("input,i", po::value<std::string>()->value_name("FILE"), "read FILE, not stdin")
      ("force", po::bool_switch(), "replace an existing device NAME")
      ("verbose,v", po::bool_switch(), "print what was received on stderr");
  cl.SetEpilog(
      "Example:\n"
      "  ssh prod thinfs send /srv/pool vm1-monday | thinfs receive /srv/backup vm1-monday\n"
      "  thinfs receive /srv/backup vm1 -i /var/backups/vm1.thinfs --force\n");
  if (std::optional<int> code = cl.Parse(args)) return *code;
  return Receive(cl);
}

}  // namespace thinfs::tools
