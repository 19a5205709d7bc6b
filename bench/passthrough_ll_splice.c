/* libfuse's passthrough_ll example with splice turned on both ways: the A/B
 * peer of fio_compare.py's fuse-passthrough target for the "splice
 * read/write" lever (docs/benchmarks.md, "Levers tried" 12).
 *
 * Unchanged, passthrough_ll does not splice: libfuse 3.14 leaves
 * FUSE_CAP_SPLICE_WRITE/MOVE/READ out of conn->want unless the file system
 * asks (checked with strace: pread64 + writev per read, read + pwrite per
 * write). Its read replies are file-descriptor buffers and it implements
 * write_buf, so with the capabilities on, libfuse moves a read's data from
 * the backing file to /dev/fuse through a pipe (one copy less) and a write's
 * data from /dev/fuse to the file likewise. This wrapper includes the
 * example's source as it is and only adds those three capabilities after the
 * example's own init callback. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <string.h>

static void (*splice_inner_init)(void *userdata, struct fuse_conn_info *conn);
static struct fuse_lowlevel_ops splice_ops;

static void splice_init(void *userdata, struct fuse_conn_info *conn) {
	if (splice_inner_init)
		splice_inner_init(userdata, conn);
	conn->want |= conn->capable &
		      (FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

static struct fuse_session *splice_session_new(struct fuse_args *args,
					       const struct fuse_lowlevel_ops *op,
					       size_t op_size, void *userdata) {
	memcpy(&splice_ops, op, op_size < sizeof(splice_ops) ? op_size : sizeof(splice_ops));
	splice_inner_init = splice_ops.init;
	splice_ops.init = splice_init;
	return fuse_session_new(args, &splice_ops, sizeof(splice_ops), userdata);
}

#define fuse_session_new splice_session_new
#include "passthrough_ll.c"
