// The control socket end to end: CLI management commands against a mounted
// pool (the mount shows each change at once), hostile clients on
// control.sock, crash-consistent snapshots of a live ext4 on a loop device,
// and fio verification while snapshots come and go.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/admin.h"
#include "tests/tools/json_parser.h"
#include "tests/util/e2e_util.h"

namespace thinfs::testing {
namespace {

// Connects to `path`; the fd, or -errno.
int Connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    close(fd);
    return -ENAMETOOLONG;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    close(fd);
    return -err;
  }
  return fd;
}

void SendRaw(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the daemon may hang up on a bad request
    done += static_cast<size_t>(n);
  }
}

// Everything the daemon sends until it closes (or `timeout` passes).
std::string ReadUntilClosed(int fd, std::chrono::seconds timeout) {
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
  ADD_FAILURE() << "the daemon kept the connection open past " << timeout.count() << " s";
  return out;
}

class ControlTest : public E2eTest {
 protected:
  std::string Socket() const { return pool_ + "/control.sock"; }

  // stat(2) in the mount: size, or -1 when the file does not exist.
  int64_t SizeInMount(const std::string& name) {
    struct stat st {};
    if (stat(Vol(name).c_str(), &st) != 0) return -1;
    return st.st_size;
  }

  void ExpectOk(const CommandResult& r, const std::string& what) {
    EXPECT_EQ(r.exit_code, 0) << what << ":\n" << r.output;
  }

  // Sends `bytes` raw, half-closes, and returns what comes back decoded (or
  // nullopt when the daemon just closed the connection).
  std::optional<AdminReply> RawExchange(const std::string& bytes, bool half_close = true) {
    int fd = Connect(Socket());
    EXPECT_GE(fd, 0) << strerror(-fd);
    if (fd < 0) return std::nullopt;
    SendRaw(fd, bytes);
    if (half_close) shutdown(fd, SHUT_WR);
    std::string reply = ReadUntilClosed(fd, std::chrono::seconds(20));
    close(fd);
    if (reply.empty()) return std::nullopt;
    Result<AdminReply> r = DecodeAdminReply(reply);
    EXPECT_TRUE(r.ok()) << "undecodable reply: " << r.status().ToString();
    if (!r.ok()) return std::nullopt;
    return *r;
  }

  // The daemon still serves a well-formed request.
  void ExpectServing() {
    CommandResult r = Thinfs({"list", pool_, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(ParseJson(r.output).type, JsonValue::Type::kArray) << r.output;
  }
};

TEST_F(ControlTest, CommandsWhileMountedShowInTheMountAtOnce) {
  FormatPool("256M");
  ASSERT_EQ(MountForeground(), "");
  struct stat st {};
  ASSERT_EQ(lstat(Socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);

  EXPECT_EQ(SizeInMount("vol"), -1);
  CommandResult r = Thinfs({"create", pool_, "vol", "--size", "4M", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ParseJson(r.output)["size"].AsUint(), 4u << 20);
  EXPECT_EQ(SizeInMount("vol"), 4 << 20);

  // Data written through the mount (not fsynced) is in a snapshot taken
  // right after.
  const std::vector<char> data = Pattern(7, 0, 3 * 65536 + 100);
  {
    int fd = open(Vol("vol").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    close(fd);
  }
  EXPECT_EQ(SizeInMount("snap"), -1);
  r = Thinfs({"snapshot", pool_, "vol", "snap"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(SizeInMount("snap"), 4 << 20);
  CommandResult cmp = RunCommand("cmp " + ShellQuote(Vol("vol")) + " " + ShellQuote(Vol("snap")));
  EXPECT_EQ(cmp.exit_code, 0) << cmp.output;

  // The kernel has the size cached for a second; resize must show at once.
  r = Thinfs({"resize", pool_, "vol", "--size", "8M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(SizeInMount("vol"), 8 << 20);
  r = Thinfs({"resize", pool_, "vol", "--size", "1M"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(SizeInMount("vol"), 1 << 20);

  r = Thinfs({"rename", pool_, "snap", "snap2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(SizeInMount("snap"), -1);
  EXPECT_EQ(SizeInMount("snap2"), 4 << 20);
  EXPECT_EQ(RunCommand("ls " + ShellQuote(mnt_)).output, "snap2\nvol\n");

  r = Thinfs({"list", pool_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  JsonValue list = ParseJson(r.output);
  ASSERT_EQ(list.array.size(), 2u) << r.output;
  EXPECT_EQ(list.array[0]["name"].string, "snap2");
  EXPECT_EQ(list.array[0]["parent"].string, "vol");
  EXPECT_EQ(list.array[0]["mapped_blocks"].AsUint(), 4u);

  r = Thinfs({"status", pool_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  JsonValue status = ParseJson(r.output);
  EXPECT_TRUE(status["mounted"].boolean);
  EXPECT_EQ(status["mountpoint"].string, mnt_);
  EXPECT_EQ(status["devices"].AsUint(), 2u);
  EXPECT_GE(status["counters"]["writes"].AsUint(), 1u);
  EXPECT_GE(status["counters"]["commits"].AsUint(), 1u);
  r = Thinfs({"status", pool_});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mounted on:      " + mnt_), std::string::npos) << r.output;

  r = Thinfs({"delete", pool_, "snap2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(SizeInMount("snap2"), -1);
  EXPECT_EQ(RunCommand("ls " + ShellQuote(mnt_)).output, "vol\n");

  // Bad input through the socket: one line, the right code, nothing changed.
  r = Thinfs({"create", pool_, "vol", "--size", "1M"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "thinfs create: device 'vol' already exists\n");
  r = Thinfs({"snapshot", pool_, "nope", "s"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "thinfs snapshot: no device named 'nope'\n");
  r = Thinfs({"rename", pool_, "vol", ".x"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(SizeInMount("vol"), 1 << 20);

  ASSERT_EQ(Unmount(), "");
  EXPECT_NE(lstat(Socket().c_str(), &st), 0) << "control.sock left behind";
  // Unmounted, the same commands open the pool directly.
  r = Thinfs({"list", pool_, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ParseJson(r.output).array.size(), 1u);
}

// 4 KiB writes into a snapshot through the mount copy on write; by default
// the copies are left to the commit (deferred_copy), with -o
// deferred_copy=0 they are made at once. Either way the snapshot reads
// what was written over its origin's data, before and after a remount,
// and the origin does not change.
TEST_F(ControlTest, SnapshotCowWritesReadBackWithCopiesDeferredOrNot) {
  FormatPool("256M", "64K");
  for (const std::string options : {"", "deferred_copy=0"}) {
    SCOPED_TRACE("mount options '" + options + "'");
    ASSERT_EQ(MountForeground(options), "");
    ExpectOk(Thinfs({"create", pool_, "o", "--size", "4M"}), "create");
    const std::vector<char> origin = Pattern(3, 0, 4 << 20);
    std::vector<char> snap = origin;
    {
      int fd = open(Vol("o").c_str(), O_WRONLY);
      ASSERT_GE(fd, 0) << strerror(errno);
      ASSERT_EQ(pwrite(fd, origin.data(), origin.size(), 0), static_cast<ssize_t>(origin.size()));
      close(fd);
    }
    ExpectOk(Thinfs({"snapshot", pool_, "o", "s"}), "snapshot");
    {
      int fd = open(Vol("s").c_str(), O_WRONLY);
      ASSERT_GE(fd, 0) << strerror(errno);
      for (int i = 0; i < 64; ++i) {  // one 4 KiB write into each 64 KiB block
        const off_t off = i * 65536 + (i % 16) * 4096;
        const std::vector<char> w = Pattern(100 + i, 0, 4096);
        ASSERT_EQ(pwrite(fd, w.data(), w.size(), off), 4096);
        std::memcpy(snap.data() + off, w.data(), w.size());
      }
      EXPECT_EQ(fsync(fd), 0) << strerror(errno);  // commits: owed copies are made
      close(fd);
    }
    auto read_all = [&](const std::string& name) {
      std::vector<char> buf(4 << 20);
      int fd = open(Vol(name).c_str(), O_RDONLY);
      EXPECT_GE(fd, 0) << strerror(errno);
      EXPECT_EQ(pread(fd, buf.data(), buf.size(), 0), static_cast<ssize_t>(buf.size()));
      close(fd);
      return buf;
    };
    EXPECT_TRUE(read_all("s") == snap);
    EXPECT_TRUE(read_all("o") == origin);
    CommandResult r = Thinfs({"status", pool_, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    JsonValue counters = ParseJson(r.output)["counters"];
    EXPECT_EQ(counters["cow_copies"].AsUint(), 64u);
    EXPECT_EQ(counters["deferred_copies"].AsUint(), options.empty() ? 64u : 0u);
    ASSERT_EQ(Unmount(), "");
    ASSERT_EQ(MountForeground(options), "");
    EXPECT_TRUE(read_all("s") == snap) << "after remount";
    EXPECT_TRUE(read_all("o") == origin);
    ExpectOk(Thinfs({"delete", pool_, "s"}), "delete s");
    ExpectOk(Thinfs({"delete", pool_, "o"}), "delete o");
    ASSERT_EQ(Unmount(), "");
  }
  CommandResult check = Thinfs({"check", pool_});
  EXPECT_EQ(check.exit_code, 0) << check.output;
}

// Status asked on the control socket by this process: a written fd can
// stay open and nothing forks, as any close of it (even a forked child's)
// sends FLUSH, which commits.
class StatusCountersTest : public ControlTest {
 protected:
  JsonValue StatusJson() {
    Result<std::string> request = EncodeAdminRequest(AdminRequest{"status", {}});
    EXPECT_TRUE(request.ok());
    if (!request.ok()) return JsonValue{};
    std::optional<AdminReply> reply = RawExchange(*request);
    EXPECT_TRUE(reply.has_value());
    if (!reply) return JsonValue{};
    EXPECT_EQ(reply->exit_code, kAdminOk) << reply->error;
    return ParseJson(reply->json);
  }
  JsonValue Counters() { return StatusJson()["counters"]; }
  uint64_t TransactionId() { return StatusJson()["transaction_id"].AsUint(); }

  // Creates 1 MiB volume "v" on the mounted pool and opens it for writing,
  // with its first 64 KiB block written and fsynced. Returns the fd, or -1
  // after a failure.
  int OpenWithACommittedBlock() {
    ExpectOk(Thinfs({"create", pool_, "v", "--size", "1M"}), "create");
    int fd = open(Vol("v").c_str(), O_WRONLY);
    EXPECT_GE(fd, 0) << strerror(errno);
    if (fd < 0) return -1;
    const std::vector<char> block = Pattern(1, 0, 65536);
    EXPECT_EQ(pwrite(fd, block.data(), block.size(), 0), 65536);
    EXPECT_EQ(fsync(fd), 0) << strerror(errno);
    return fd;
  }
};

// fdatasync(2) through the mount syncs the data and leaves a write's new
// times to a later commit; fsync(2) commits them (lever 26). Without a
// periodic commit, the transaction id shows which commits wrote metadata.
TEST_F(StatusCountersTest, FdatasyncLeavesAWritesTimesFsyncCommitsThem) {
  FormatPool("64M", "64K");
  ASSERT_EQ(MountForeground("commit_interval=0"), "");
  int fd = OpenWithACommittedBlock();
  ASSERT_GE(fd, 0);
  const uint64_t txn = TransactionId();
  const uint64_t syncs = Counters()["data_syncs"].AsUint();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a tick: the times move
  const std::vector<char> w = Pattern(2, 0, 4096);
  ASSERT_EQ(pwrite(fd, w.data(), w.size(), 8192), 4096);  // in place
  ASSERT_EQ(fdatasync(fd), 0) << strerror(errno);
  EXPECT_EQ(Counters()["data_syncs"].AsUint(), syncs + 1) << "fdatasync syncs the data";
  EXPECT_EQ(TransactionId(), txn) << "and leaves the new times";
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);
  EXPECT_EQ(TransactionId(), txn + 1) << "fsync commits them";
  // After an fdatasync, the close of the written file commits the times.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(pwrite(fd, w.data(), w.size(), 8192), 4096);
  ASSERT_EQ(fdatasync(fd), 0) << strerror(errno);
  EXPECT_EQ(TransactionId(), txn + 1);
  ASSERT_EQ(close(fd), 0) << strerror(errno);
  EXPECT_EQ(TransactionId(), txn + 2) << "close commits what fdatasync left";
  ASSERT_EQ(Unmount(), "");
}

// The periodic commit syncs the data file for overwrites in place unless
// -o sync_overwrites=off, where they wait for fsync (PoolOptions::
// sync_overwrites). Seen through status's counters.
class SyncOverwritesTest : public StatusCountersTest, public ::testing::WithParamInterface<bool> {};

TEST_P(SyncOverwritesTest, PeriodicCommitSyncsOverwritesUnlessTurnedOff) {
  const bool sync_overwrites = GetParam();
  FormatPool("64M", "64K");
  ASSERT_EQ(MountForeground(sync_overwrites ? "commit_interval=20ms"
                                            : "commit_interval=20ms,sync_overwrites=off"),
            "");
  int fd = OpenWithACommittedBlock();  // the new block: synced
  ASSERT_GE(fd, 0);
  const uint64_t syncs = Counters()["data_syncs"].AsUint();
  const uint64_t commits = Counters()["commits"].AsUint();
  EXPECT_GE(syncs, 1u);
  const std::vector<char> w = Pattern(2, 0, 4096);
  // A write within the clock's tick of the last keeps the device's times
  // (and then nothing is left for a periodic commit without
  // sync_overwrites): let a tick pass.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(pwrite(fd, w.data(), w.size(), 8192), 4096);  // in place
  // The write's new mtime makes the next periodic commit write something;
  // wait for it (up to 20 s on a loaded machine).
  JsonValue c = Counters();
  for (int i = 0; i < 2000 && c["commits"].AsUint() == commits; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    c = Counters();
  }
  ASSERT_GT(c["commits"].AsUint(), commits) << "no periodic commit ran";
  EXPECT_EQ(c["data_syncs"].AsUint(), sync_overwrites ? syncs + 1 : syncs);
  // fsync syncs what the periodic commit left, and nothing twice.
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);
  EXPECT_EQ(Counters()["data_syncs"].AsUint(), syncs + 1);
  close(fd);
  ASSERT_EQ(Unmount(), "");
}

INSTANTIATE_TEST_SUITE_P(Modes, SyncOverwritesTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Default" : "SyncOverwritesOff";
                         });

// `thinfs umount` returns only once the daemon has made its final commit
// and let go of the pool, so the next command can use the pool at once. A
// stopped daemon makes the window as wide as the test wants: the kernel
// unmounts without it, and `thinfs umount` must keep waiting until it runs
// again and exits.
TEST_F(ControlTest, UmountReturnsOnceThePoolIsFree) {
  FormatPool("64M");
  ExpectOk(MountDaemon(), "mount");
  ExpectOk(Thinfs({"create", pool_, "v", "--size", "1M"}), "create");
  std::vector<pid_t> daemons = FindMountDaemons(pool_);
  ASSERT_EQ(daemons.size(), 1u);
  ASSERT_EQ(kill(daemons[0], SIGSTOP), 0);
  std::atomic<bool> returned{false};
  CommandResult umount;
  std::thread t([&] {
    umount = Thinfs({"umount", mnt_});
    returned.store(true);
  });
  // Unmounted by the kernel, but the daemon has not exited: still waiting.
  for (int i = 0; i < 100 && IsThinfsMounted(mnt_); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(IsThinfsMounted(mnt_));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_FALSE(returned.load()) << "thinfs umount returned while the daemon still held the pool";
  kill(daemons[0], SIGCONT);
  t.join();
  EXPECT_EQ(umount.exit_code, 0) << umount.output;
  CommandResult check = Thinfs({"check", pool_});
  EXPECT_EQ(check.exit_code, 0) << check.output;
  // Not a thinfs mount: unmounted as before, nothing to wait for.
  const std::string tmpfs = mnt_ + "-tmpfs";
  ASSERT_EQ(mkdir(tmpfs.c_str(), 0755), 0);
  ASSERT_EQ(RunCommand("mount -t tmpfs none " + ShellQuote(tmpfs)).exit_code, 0);
  CommandResult other = Thinfs({"umount", tmpfs});
  EXPECT_EQ(other.exit_code, 0) << other.output;
  if (other.exit_code != 0) RunCommand("umount " + ShellQuote(tmpfs));
  rmdir(tmpfs.c_str());
}

TEST_F(ControlTest, DeleteOfAnOpenDeviceKeepsItWorkingUntilClose) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ExpectOk(Thinfs({"create", pool_, "v", "--size", "1M"}), "create");
  int fd = open(Vol("v").c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << strerror(errno);
  ExpectOk(Thinfs({"delete", pool_, "v"}), "delete");
  EXPECT_EQ(SizeInMount("v"), -1);
  const std::vector<char> data = Pattern(3, 0, 8192);
  EXPECT_EQ(pwrite(fd, data.data(), data.size(), 4096), 8192) << strerror(errno);
  std::vector<char> back(8192);
  EXPECT_EQ(pread(fd, back.data(), back.size(), 4096), 8192) << strerror(errno);
  EXPECT_EQ(back, data);
  close(fd);
  ExpectServing();
}

TEST_F(ControlTest, HostileMessagesGetAnErrorAndTheDaemonKeepsServing) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ExpectOk(Thinfs({"create", pool_, "v", "--size", "1M"}), "create");

  // Text instead of a frame: its first bytes read as a huge length.
  std::optional<AdminReply> r = RawExchange("hello, daemon\n");
  if (r) {
    EXPECT_NE(r->exit_code, 0);
    EXPECT_NE(r->error.find("exceeds"), std::string::npos) << r->error;
  }
  ExpectServing();

  // An oversized frame is refused from its header.
  std::string header(4, '\0');
  header[2] = '\x10';  // 1 MiB
  r = RawExchange(header);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, kAdminUsage);
  EXPECT_NE(r->error.find("exceeds"), std::string::npos) << r->error;
  ExpectServing();

  // Truncated: the header promises more than arrives.
  Result<std::string> good = EncodeAdminRequest(AdminRequest{"delete", {{"name", "v"}}});
  ASSERT_TRUE(good.ok());
  for (size_t cut : {size_t{2}, size_t{4}, good->size() / 2, good->size() - 1}) {
    r = RawExchange(good->substr(0, cut));
    ASSERT_TRUE(r.has_value()) << cut;
    EXPECT_EQ(r->exit_code, kAdminUsage) << cut;
    EXPECT_NE(r->error.find("truncated"), std::string::npos) << r->error;
  }
  EXPECT_GE(SizeInMount("v"), 0) << "a truncated delete must not run";

  // Well framed, malformed inside.
  std::string body = "thinfs-admin=1\ncommand=de lete\nname=v\n";
  std::string frame(4, '\0');
  frame[0] = static_cast<char>(body.size());
  r = RawExchange(frame + body);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, kAdminUsage);
  EXPECT_NE(r->error.find("malformed"), std::string::npos) << r->error;

  // Random bytes of every length up to a few KiB.
  std::vector<char> noise = Pattern(99, 0, 8192);
  for (size_t n : {size_t{1}, size_t{3}, size_t{5}, size_t{100}, size_t{8192}}) {
    (void)RawExchange(std::string(noise.data(), n));
  }

  // A client that connects and sends nothing is dropped after the timeout.
  int fd = Connect(Socket());
  ASSERT_GE(fd, 0);
  SendRaw(fd, "\x05");
  std::string reply = ReadUntilClosed(fd, std::chrono::seconds(20));
  close(fd);
  if (!reply.empty()) {
    Result<AdminReply> decoded = DecodeAdminReply(reply);
    ASSERT_TRUE(decoded.ok());
    EXPECT_NE(decoded->error.find("timed out"), std::string::npos) << decoded->error;
  }

  EXPECT_GE(SizeInMount("v"), 0);
  ExpectServing();
  ExpectOk(Thinfs({"delete", pool_, "v"}), "delete");
  EXPECT_EQ(SizeInMount("v"), -1);
}

TEST_F(ControlTest, OnlyRootAndThePoolOwnerAreServed) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(geteuid(), 0u) << "this test runs as root (it switches to nobody)";
  // Let nobody reach the socket's directory; the socket itself stays 0600.
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  ASSERT_EQ(chmod(pool_.c_str(), 0755), 0);
  Result<std::string> request = EncodeAdminRequest(AdminRequest{"list", {}});
  ASSERT_TRUE(request.ok());
  const std::string path = Socket();

  // Child exit codes: 0 refused as expected, else what went wrong.
  auto as_nobody = [&](bool expect_connect_refused) {
    pid_t pid = fork();
    if (pid == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
      int fd = Connect(path);
      if (expect_connect_refused) _exit(fd == -EACCES ? 0 : 11);
      if (fd < 0) _exit(12);
      SendRaw(fd, *request);
      shutdown(fd, SHUT_WR);
      std::string reply;
      char buf[4096];
      ssize_t n;
      while ((n = recv(fd, buf, sizeof buf, 0)) > 0) reply.append(buf, static_cast<size_t>(n));
      Result<AdminReply> r = DecodeAdminReply(reply);
      if (!r.ok()) _exit(13);
      if (r->exit_code == 0) _exit(14);  // served!
      if (r->error.find("permission denied") == std::string::npos) _exit(15);
      _exit(0);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + status;
  };
  // Mode 0600 keeps others from connecting at all.
  EXPECT_EQ(as_nobody(true), 0);
  // Even when the mode lets them in, SO_PEERCRED refuses them.
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  EXPECT_EQ(as_nobody(false), 0);
  ExpectServing();
  EXPECT_NE(Log().find("refused uid 65534"), std::string::npos) << Log();
}

TEST_F(ControlTest, StaleSocketAfterKillIsReplaced) {
  FormatPool("64M");
  ASSERT_EQ(MountForeground(), "");
  ExpectOk(Thinfs({"create", pool_, "a", "--size", "1M"}), "create");
  KillDaemonHard();
  struct stat st {};
  ASSERT_EQ(lstat(Socket().c_str(), &st), 0) << "kill -9 leaves the socket";
  // Nobody listens: the CLI opens the pool itself.
  ExpectOk(Thinfs({"create", pool_, "b", "--size", "1M"}), "create unmounted");
  ASSERT_EQ(MountForeground(), "");
  ExpectOk(Thinfs({"create", pool_, "c", "--size", "1M"}), "create mounted");
  EXPECT_EQ(RunCommand("ls " + ShellQuote(mnt_)).output, "a\nb\nc\n");
}

// Issue 4, test 2: a snapshot of a frozen ext4 on a loop device is a clean
// file system with the same files, and stays so while the origin changes.
class ControlLoopTest : public ControlTest, public ::testing::WithParamInterface<bool> {};

TEST_P(ControlLoopTest, SnapshotOfAFrozenExt4IsCleanAndStable) {
  const bool direct_io = GetParam();
  RequireLoopDevices();
  FormatPool("1G");
  ASSERT_EQ(MountForeground(), "");
  ExpectOk(Thinfs({"create", pool_, "disk", "--size", "256M"}), "create");
  std::string loop = AttachLoop(Vol("disk"), direct_io);
  ASSERT_FALSE(loop.empty());
  CommandResult mkfs = RunCommand("mkfs.ext4 -q -F " + ShellQuote(loop));
  ASSERT_EQ(mkfs.exit_code, 0) << mkfs.output;
  const std::string fs = dir_ + "/fs";
  const std::string snapfs = dir_ + "/snapfs";
  const std::string sums = dir_ + "/sums";
  ASSERT_EQ(mkdir(fs.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(snapfs.c_str(), 0755), 0);
  ASSERT_EQ(RunCommand("mount " + ShellQuote(loop) + " " + ShellQuote(fs)).exit_code, 0);
  // A tree of files of assorted sizes.
  CommandResult fill = RunCommand(
      "cd " + ShellQuote(fs) +
      " && for d in a b c/d; do mkdir -p $d; for i in 1 2 3 4 5; do "
      "head -c $((i * 37000 + 11)) /dev/urandom > $d/f$i; done; done"
      " && head -c 20M /dev/urandom > big"
      " && find . -type f ! -path './lost+found/*' -print0 | sort -z | xargs -0 sha256sum > " +
      ShellQuote(sums));
  ASSERT_EQ(fill.exit_code, 0) << fill.output;

  // Freeze, snapshot, thaw: unfreeze even when the snapshot fails.
  CommandResult snap = RunCommand("fsfreeze -f " + ShellQuote(fs) + " && { " +
                                  ShellQuote(ThinfsBinary()) + " snapshot " + ShellQuote(pool_) +
                                  " disk snap; rc=$?; fsfreeze -u " + ShellQuote(fs) +
                                  "; exit $rc; }");
  ASSERT_EQ(snap.exit_code, 0) << snap.output;

  std::string loop2 = AttachLoop(Vol("snap"), direct_io);
  ASSERT_FALSE(loop2.empty());
  CommandResult fsck = RunCommand("e2fsck -fn " + ShellQuote(loop2));
  EXPECT_EQ(fsck.exit_code, 0) << fsck.output;
  auto check_snapshot = [&](const char* when) {
    ASSERT_EQ(RunCommand("mount -o ro " + ShellQuote(loop2) + " " + ShellQuote(snapfs)).exit_code,
              0)
        << when;
    CommandResult c = RunCommand("cd " + ShellQuote(snapfs) + " && sha256sum --quiet -c " +
                                 ShellQuote(sums));
    EXPECT_EQ(c.exit_code, 0) << when << ":\n" << c.output;
    EXPECT_EQ(RunCommand("umount " + ShellQuote(snapfs)).exit_code, 0);
  };
  check_snapshot("right after the snapshot");

  // Overwrite every file in the origin; the snapshot does not change.
  CommandResult overwrite = RunCommand(
      "cd " + ShellQuote(fs) +
      " && find . -type f ! -path './lost+found/*' | while read f; do "
      "head -c $(stat -c %s \"$f\") /dev/urandom > \"$f\"; done && sync");
  ASSERT_EQ(overwrite.exit_code, 0) << overwrite.output;
  CommandResult origin = RunCommand("cd " + ShellQuote(fs) + " && sha256sum --quiet -c " +
                                    ShellQuote(sums) + " 2>&1");
  EXPECT_NE(origin.exit_code, 0) << "the origin's files were not overwritten";
  check_snapshot("after overwriting the origin");
  fsck = RunCommand("e2fsck -fn " + ShellQuote(loop2));
  EXPECT_EQ(fsck.exit_code, 0) << fsck.output;
}

INSTANTIATE_TEST_SUITE_P(BufferedAndDirect, ControlLoopTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("DirectIo") : std::string("Buffered");
                         });

// Issue 4, test 6: fio verifies its data while snapshots are taken and
// deleted through the control socket.
TEST_F(ControlTest, FioVerifiesWhileSnapshotsComeAndGo) {
  FormatPool("1G");
  ASSERT_EQ(MountForeground(), "");
  ExpectOk(Thinfs({"create", pool_, "vol", "--size", "128M"}), "create");
  std::atomic<bool> fio_done{false};
  CommandResult fio;
  std::thread runner([&] {
    fio = RunCommand("fio --name=verify --filename=" + ShellQuote(Vol("vol")) +
                         " --rw=randwrite --bs=16k --size=24M --numjobs=4 --offset_increment=32M"
                         " --ioengine=psync --verify=crc32c --do_verify=1 --verify_fatal=1"
                         // No local-verify-*.state files in the working directory.
                         " --verify_state_save=0"
                         " --fsync=32 --group_reporting 2>&1",
                     std::chrono::seconds(300));
    fio_done.store(true);
  });
  int taken = 0;
  std::vector<std::string> failures;
  while (!fio_done.load()) {
    // Not "s" + ...: gcc 12's -Wrestrict false positive (GCC bug 105329).
    std::string name = std::string("s") + std::to_string(taken);
    CommandResult r = Thinfs({"snapshot", pool_, "vol", name});
    if (r.exit_code != 0) failures.push_back("snapshot " + name + ": " + r.output);
    if (taken >= 2) {
      std::string old = "s" + std::to_string(taken - 2);
      r = Thinfs({"delete", pool_, old});
      if (r.exit_code != 0) failures.push_back("delete " + old + ": " + r.output);
    }
    ++taken;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  runner.join();
  EXPECT_EQ(fio.exit_code, 0) << fio.output;
  for (const char* bad : {"verify failed", "bad magic", "bad header"}) {
    EXPECT_EQ(fio.output.find(bad), std::string::npos) << bad << ":\n" << fio.output;
  }
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_GE(taken, 3) << "fio ended before snapshots overlapped it:\n" << fio.output;
  std::printf("%d snapshots taken while fio ran\n", taken);
  // Unmounted, the pool is consistent after all that.
  ASSERT_EQ(Unmount(), "");
  CommandResult check = Thinfs({"check", pool_});
  EXPECT_EQ(check.exit_code, 0) << check.output;
}

}  // namespace
}  // namespace thinfs::testing

namespace thinfs::testing {
namespace {

TEST_F(ControlTest, CheckReadOnlyWorksWhileMounted) {
  FormatPool("256M");
  ASSERT_EQ(MountForeground(), "");
  ASSERT_EQ(Thinfs({"create", pool_, "vol", "--size", "4M"}).exit_code, 0);
  {
    const std::vector<char> data = Pattern(3, 0, 3 * 65536);
    int fd = open(Vol("vol").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    close(fd);
  }
  ASSERT_EQ(Thinfs({"snapshot", pool_, "vol", "snap"}).exit_code, 0);
  CommandResult r = Thinfs({"check", pool_, "--read-only", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(ParseJson(r.output)["clean"].boolean) << r.output;
  EXPECT_EQ(ParseJson(r.output)["devices"].AsUint(), 2u) << r.output;
  // The checkpoint is gone afterwards.
  CommandResult ls = RunCommand("ls -A " + ShellQuote(pool_));
  EXPECT_EQ(ls.output.find(".check-"), std::string::npos) << ls.output;
  // A check that would write needs the pool unmounted.
  r = Thinfs({"check", pool_});
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("--read-only"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace thinfs::testing
