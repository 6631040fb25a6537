/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_pod.c - see podnet_pod.h: entering a pod once podnetd named it
 * (the netns file check, the pod's private mounts: resolver and sysfs).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "podnet_pod.h"
#include "podnet_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PROC_SUPER_MAGIC
#define PROC_SUPER_MAGIC 0x9fa0
#endif
#ifndef NSFS_MAGIC
#define NSFS_MAGIC 0x6e736673
#endif

/* ======================================================================= */
/* Pod resolver                                                             */
/* ======================================================================= */

/* A pod/netns name: one path component of [A-Za-z0-9._-], 1..64 characters,
 * not "." or "..". what names it in the error ("pod", "netns"). */
static int check_name(const char *name, const char *what, char *why,
		      size_t whysz)
{
	size_t i, n = name ? strlen(name) : 0;

	if (n == 0 || n > 64 || !strcmp(name, ".") || !strcmp(name, "..")) {
		pn_fmt(why, whysz, "bad %s name", what);
		return -1;
	}
	for (i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_' ||
		      c == '.')) {
			pn_fmt(why, whysz, "bad character in %s name", what);
			return -1;
		}
	}
	return 0;
}

#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif

/* A detached copy of the mount tree at path (open_tree), or -1 (not a mount,
 * or a kernel without the new mount API). */
static int clone_tree(const char *path)
{
#ifdef SYS_open_tree
	struct stat a, b;

	if (stat("/sys", &a) < 0 || stat(path, &b) < 0 || a.st_dev == b.st_dev)
		return -1; /* not a mount point of its own */
	return (int) syscall(SYS_open_tree, AT_FDCWD, path,
			     OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
#else
	(void) path;
	return -1;
#endif
}

static void attach_tree(int fd, const char *path)
{
#ifdef SYS_move_mount
	if (fd >= 0)
		(void) syscall(SYS_move_mount, fd, "", AT_FDCWD, path,
			       MOVE_MOUNT_F_EMPTY_PATH);
#else
	(void) path;
#endif
	if (fd >= 0)
		close(fd);
}

int pn_enter_pod_resolver(const char *name, char *why, size_t whysz)
{
	char src[128];
	struct stat st;
	struct statvfs sv;
	unsigned long sysfs_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
	int cgroup;

	if (why && whysz)
		why[0] = '\0';
	if (check_name(name, "pod", why, whysz) < 0)
		return -1;
	if (unshare(CLONE_NEWNS) < 0) {
		pn_fmt(why, whysz, "unshare(CLONE_NEWNS): %s", strerror(errno));
		return -1;
	}
	/* never propagate our mounts back to the node */
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
		pn_fmt(why, whysz, "mount --make-rslave /: %s", strerror(errno));
		return -1;
	}
	snprintf(src, sizeof(src), "/etc/netns/%s/resolv.conf", name);
	if (lstat(src, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 &&
	    mount(src, "/etc/resolv.conf", NULL, MS_BIND, NULL) < 0) {
		pn_fmt(why, whysz, "bind %s: %s", src, strerror(errno));
		return -1;
	}
	/* the pod's own /sys (as `ip netns exec` does): a sysfs mounted now shows
	 * the network namespace we are in, the pod's, so /sys/class/net lists
	 * the pod's interfaces and not every user's bridge and VXLAN. The cgroup
	 * tree under the old /sys is carried over (hwloc, MPI read it). */
	if (statvfs("/sys", &sv) == 0 && (sv.f_flag & ST_RDONLY))
		sysfs_flags |= MS_RDONLY;
	cgroup = clone_tree("/sys/fs/cgroup");
	if (umount2("/sys", MNT_DETACH) < 0 && errno != EINVAL) {
		pn_fmt(why, whysz, "umount /sys: %s", strerror(errno));
		if (cgroup >= 0)
			close(cgroup);
		return -1;
	}
	if (mount(name, "/sys", "sysfs", sysfs_flags, NULL) < 0) {
		pn_fmt(why, whysz, "mount sysfs on /sys: %s", strerror(errno));
		if (cgroup >= 0)
			close(cgroup);
		return -1;
	}
	attach_tree(cgroup, "/sys/fs/cgroup");
	return 0;
}

/* ======================================================================= */
/* Netns path checks                                                        */
/* ======================================================================= */

/* Opens dir/name (dir ends in '/'), an nsfs file owned by root in a root-owned
 * directory closed to others; name already checked. -2 when it does not exist. */
static int open_ns_file(const char *dir, const char *name, char *why,
			size_t whysz)
{
	char path[PATH_MAX];
	struct stat st;
	struct statfs sfs;
	int fd;

	snprintf(path, sizeof(path), "%s%s", dir, name);
	/* the directory must be root's and not writable by anyone else */
	if (lstat(dir, &st) < 0) {
		pn_fmt(why, whysz, "%s: %s", dir, strerror(errno));
		return errno == ENOENT ? -2 : -1;
	}
	if (!S_ISDIR(st.st_mode) || st.st_uid != 0 ||
	    (st.st_mode & (S_IWGRP | S_IWOTH))) {
		pn_fmt(why, whysz, "%s is not a root-owned directory closed "
		       "to others", dir);
		return -1;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
	if (fd < 0) {
		pn_fmt(why, whysz, "%s: %s", path, strerror(errno));
		return errno == ENOENT ? -2 : -1;
	}
	if (fstat(fd, &st) < 0 || fstatfs(fd, &sfs) < 0) {
		pn_fmt(why, whysz, "%s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	if (st.st_uid != 0) {
		pn_fmt(why, whysz, "%s is not owned by root", path);
		close(fd);
		return -1;
	}
	if ((unsigned long) sfs.f_type != (unsigned long) NSFS_MAGIC) {
		pn_fmt(why, whysz, "%s is not a namespace (pod not set up?)",
		       path);
		close(fd);
		return -1;
	}
	return fd;
}

int pn_open_netns(const char *path, char *why, size_t whysz)
{
	const size_t plen = sizeof(PN_NETNS_DIR) - 1;
	int fd;

	if (why && whysz)
		why[0] = '\0';
	if (!path || strncmp(path, PN_NETNS_DIR, plen) != 0) {
		pn_fmt(why, whysz, "netns path is not under %s", PN_NETNS_DIR);
		return -1;
	}
	if (check_name(path + plen, "netns", why, whysz) < 0)
		return -1;
	fd = open_ns_file(PN_NETNS_DIR, path + plen, why, whysz);
	return fd == -2 ? -1 : fd;
}

int pn_open_pidns(const char *name, char *why, size_t whysz)
{
	if (why && whysz)
		why[0] = '\0';
	if (check_name(name, "pod", why, whysz) < 0)
		return -1;
	return open_ns_file(PN_PIDNS_DIR, name, why, whysz);
}

int pn_bind_pod_proc(const char *name, char *why, size_t whysz)
{
	char src[PATH_MAX];
	struct statfs sfs;

	if (why && whysz)
		why[0] = '\0';
	if (check_name(name, "pod", why, whysz) < 0)
		return -1;
	snprintf(src, sizeof(src), "%s%s.proc", PN_PIDNS_DIR, name);
	/* podnet-init mounted it; anything else there is not the pod's */
	if (statfs(src, &sfs) < 0 ||
	    (unsigned long) sfs.f_type != (unsigned long) PROC_SUPER_MAGIC) {
		pn_fmt(why, whysz, "%s is not a proc mount", src);
		return -1;
	}
	if (mount(src, "/proc", NULL, MS_BIND | MS_REC, NULL) < 0) {
		pn_fmt(why, whysz, "bind %s on /proc: %s", src, strerror(errno));
		return -1;
	}
	return 0;
}

int pn_mount_pod_proc(char *why, size_t whysz)
{
	if (why && whysz)
		why[0] = '\0';
	/* a proc of the PID namespace we are in; the old one stays below it */
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  NULL) < 0) {
		pn_fmt(why, whysz, "mount proc on /proc: %s", strerror(errno));
		return -1;
	}
	return 0;
}
