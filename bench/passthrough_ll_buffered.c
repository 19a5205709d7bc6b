/* libfuse's passthrough_ll example serving every file from the host's page
 * cache: the FUSE server of fio_compare.py's passthrough-loop-ext4 target
 * (target 4's ceiling, docs/benchmarks.md "Targets").
 *
 * Unchanged, passthrough_ll opens the host file with the caller's flags,
 * O_DIRECT included, and writes the request's buffer as libfuse received it,
 * 40 bytes past a page boundary: with util-linux 2.38's
 * `losetup --direct-io=on`, which opens its backing file with O_DIRECT,
 * every write fails with EINVAL and mkfs.ext4 with EIO. This wrapper
 * includes the example's source as it is and only clears O_DIRECT from the
 * flags of open and create before the example's own handlers see them. The
 * kernel still sends the loop device's I/O as direct FUSE requests (O_DIRECT
 * on the FUSE file is the client's, kept); the server then reads and writes
 * the host file through its page cache, as thinfs does its data file. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 34
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <string.h>

static struct fuse_lowlevel_ops buffered_ops;
static void (*buffered_inner_open)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*buffered_inner_create)(fuse_req_t, fuse_ino_t, const char *, mode_t,
				     struct fuse_file_info *);

static void buffered_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
	fi->flags &= ~O_DIRECT;
	buffered_inner_open(req, ino, fi);
}

static void buffered_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			    struct fuse_file_info *fi) {
	fi->flags &= ~O_DIRECT;
	buffered_inner_create(req, parent, name, mode, fi);
}

static struct fuse_session *buffered_session_new(struct fuse_args *args,
						 const struct fuse_lowlevel_ops *op,
						 size_t op_size, void *userdata) {
	memcpy(&buffered_ops, op,
	       op_size < sizeof(buffered_ops) ? op_size : sizeof(buffered_ops));
	buffered_inner_open = buffered_ops.open;
	buffered_inner_create = buffered_ops.create;
	buffered_ops.open = buffered_open;
	buffered_ops.create = buffered_create;
	return fuse_session_new(args, &buffered_ops, sizeof(buffered_ops), userdata);
}

#define fuse_session_new buffered_session_new
#include "passthrough_ll.c"
