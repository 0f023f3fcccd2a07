/*
 * A FUSE floor on libfuse's low-level API: it answers the requests of a
 * create + write + close loop and stores nothing, so that
 * scripts/floor_compare.sh can set it beside `ordo fuse-floor` (the same
 * kind of server on fuser, ordo's FUSE crate) and the kernel's ext4.
 *
 * It mirrors what `ordo fuse-floor` asks of the kernel where it matters to
 * that loop: `default_permissions` (given on the command line), atomic
 * O_TRUNC, no write-back cache, a 1 s entry and attribute lifetime,
 * negative entries for missing names, direct I/O on the handle a create
 * returns (so no security.capability GETXATTR per write), ENOSYS to FLUSH.
 * Directories made with mkdir are remembered (up to MAX_DIRS) so that their
 * names can be looked up again after the lifetime runs out; files are not.
 *
 *   libfuse_floor [-o OPTIONS] MOUNTPOINT     one thread (fuse_session_loop)
 *   MT=1 libfuse_floor ...                    fuse_session_loop_mt, cloned
 *                                             descriptors, at most 2 threads
 */
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 34
#endif
#include <fuse_lowlevel.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_DIRS 64
#define TTL 1.0

struct dir {
	fuse_ino_t parent, ino;
	char name[256];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct dir dirs[MAX_DIRS];
static int ndirs;
static fuse_ino_t next_ino = 2;

/* Whether ino is a directory (the root or one made with mkdir). */
static int is_dir(fuse_ino_t ino)
{
	int found = ino == FUSE_ROOT_ID;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < ndirs && !found; i++)
		found = dirs[i].ino == ino;
	pthread_mutex_unlock(&lock);
	return found;
}

static void fill(struct stat *st, fuse_ino_t ino, int dir)
{
	memset(st, 0, sizeof *st);
	st->st_ino = ino;
	st->st_mode = dir ? S_IFDIR | 0755 : S_IFREG | 0644;
	st->st_nlink = dir ? 2 : 1;
	st->st_blksize = 4096;
}

static void entry(fuse_req_t req, fuse_ino_t ino, int dir)
{
	struct fuse_entry_param e;
	memset(&e, 0, sizeof e);
	e.ino = ino;
	e.entry_timeout = TTL;
	e.attr_timeout = TTL;
	if (ino)
		fill(&e.attr, ino, dir);
	fuse_reply_entry(req, &e);
}

static void op_init(void *data, struct fuse_conn_info *conn)
{
	(void)data;
	conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	fuse_ino_t ino = 0;
	pthread_mutex_lock(&lock);
	for (int i = 0; i < ndirs && !ino; i++)
		if (dirs[i].parent == parent && !strcmp(dirs[i].name, name))
			ino = dirs[i].ino;
	pthread_mutex_unlock(&lock);
	entry(req, ino, 1); /* ino 0: a negative entry, cached for TTL */
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	(void)fi;
	fill(&st, ino, is_dir(ino));
	fuse_reply_attr(req, &st, TTL);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	fuse_ino_t ino;
	(void)mode;
	if (strlen(name) >= sizeof dirs[0].name) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	pthread_mutex_lock(&lock);
	if (ndirs == MAX_DIRS) {
		pthread_mutex_unlock(&lock);
		fuse_reply_err(req, ENOSPC);
		return;
	}
	ino = next_ino++;
	dirs[ndirs].parent = parent;
	dirs[ndirs].ino = ino;
	strcpy(dirs[ndirs].name, name);
	ndirs++;
	pthread_mutex_unlock(&lock);
	entry(req, ino, 1);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct fuse_entry_param e;
	(void)parent, (void)name, (void)mode;
	memset(&e, 0, sizeof e);
	pthread_mutex_lock(&lock);
	e.ino = next_ino++;
	pthread_mutex_unlock(&lock);
	e.entry_timeout = TTL;
	e.attr_timeout = TTL;
	fill(&e.attr, e.ino, 0);
	fi->direct_io = 1;
	fuse_reply_create(req, &e, fi);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	(void)ino, (void)buf, (void)off, (void)fi;
	fuse_reply_write(req, size);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino, (void)fi;
	fuse_reply_err(req, 0);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino, (void)fi;
	fuse_reply_err(req, ENOSYS);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	(void)ino, (void)name, (void)size;
	fuse_reply_err(req, ENODATA);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.mkdir = op_mkdir,
	.create = op_create,
	.write = op_write,
	.release = op_release,
	.flush = op_flush,
	.getxattr = op_getxattr,
};

int main(int argc, char **argv)
{
	struct fuse_args args;
	struct fuse_session *se;
	int ret;

	if (argc < 2)
		return 2;
	args = (struct fuse_args)FUSE_ARGS_INIT(argc - 1, argv);
	se = fuse_session_new(&args, &ops, sizeof ops, NULL);
	if (!se || fuse_session_mount(se, argv[argc - 1]))
		return 1;
	if (getenv("MT")) {
		struct fuse_loop_config *cfg = fuse_loop_cfg_create();
		fuse_loop_cfg_set_clone_fd(cfg, 1);
		fuse_loop_cfg_set_max_threads(cfg, 2);
		ret = fuse_session_loop_mt(se, cfg);
		fuse_loop_cfg_destroy(cfg);
	} else {
		ret = fuse_session_loop(se);
	}
	fuse_session_unmount(se);
	fuse_session_destroy(se);
	return ret ? 1 : 0;
}
