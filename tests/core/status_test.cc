#include "core/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

namespace thinfs {
namespace {

TEST(StatusTest, ToStringNamesTheCodeThenTheMessage) {
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  EXPECT_EQ(Status::NotFound("volume vm1").ToString(), "Not found: volume vm1");
  EXPECT_EQ(Status::FromErrno(EIO, "read pool/data").ToString(),
            "I/O error: read pool/data: Input/output error");
  EXPECT_EQ(Status::FromErrno(EWOULDBLOCK, "lock pool/lock").ToString(),
            "Busy: lock pool/lock: Resource temporarily unavailable");
}

TEST(StatusTest, ToStringSaysAnErrnoThatIsTheCodesNameOnce) {
  // strerror(EACCES) and strerror(EINVAL) are the names of the codes they
  // map to: "Permission denied: open X: Permission denied" said it twice.
  EXPECT_EQ(Status::FromErrno(EACCES, "open /dev/cpu_dma_latency").ToString(),
            "open /dev/cpu_dma_latency: Permission denied");
  EXPECT_EQ(Status::FromErrno(EINVAL, "fallocate").ToString(), "fallocate: Invalid argument");
  // Only as the message's last part, after ": ".
  EXPECT_EQ(Status::InvalidArgument("Invalid argument").ToString(),
            "Invalid argument: Invalid argument");
  EXPECT_EQ(Status::InvalidArgument("size: not a valid argument").ToString(),
            "Invalid argument: size: not a valid argument");
}

}  // namespace
}  // namespace thinfs
