/* SPDX-License-Identifier: Apache-2.0 */
/* Driver for tests/unit/c/test_pod_resolver.py: run as root in a fresh network namespace and
 * a private mount namespace (unshare -m -n). Puts a tmpfs on /etc holding a
 * node resolv.conf and a pod one, calls pn_enter_pod_resolver(argv[1]) and
 * prints what a task would see: resolv.conf, /sys/class/net, /sys/fs/cgroup. */
#define _GNU_SOURCE
#include "podnet_pod.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

static int put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

static int is_mount(const char *path)
{
	struct stat a, b;

	return stat("/sys", &a) == 0 && stat(path, &b) == 0 && a.st_dev != b.st_dev;
}

int main(int argc, char **argv)
{
	char why[256], dir[128], path[160], line[256];
	struct dirent *e;
	DIR *d;
	FILE *f;
	int had_cgroup = is_mount("/sys/fs/cgroup");

	if (argc != 2)
		return 2;
	if (mount("none", "/etc", "tmpfs", 0, "mode=0755") < 0) {
		perror("tmpfs /etc");
		return 2;
	}
	snprintf(dir, sizeof(dir), "/etc/netns/%s", argv[1]);
	snprintf(path, sizeof(path), "%s/resolv.conf", dir);
	if (mkdir("/etc/netns", 0755) < 0 || mkdir(dir, 0755) < 0 ||
	    put("/etc/resolv.conf", "nameserver 127.0.0.99\n") < 0 ||
	    put(path, "nameserver 203.0.113.53\n") < 0) {
		perror("setup");
		return 2;
	}
	if (pn_enter_pod_resolver(argv[1], why, sizeof(why)) < 0) {
		printf("error %s\n", why);
		return 1;
	}
	f = fopen("/etc/resolv.conf", "r");
	if (f && fgets(line, sizeof(line), f))
		printf("resolv %s", line);
	if (f)
		fclose(f);
	d = opendir("/sys/class/net");
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.')
			printf("net %s\n", e->d_name);
	if (d)
		closedir(d);
	printf("cgroup %d %d\n", had_cgroup, is_mount("/sys/fs/cgroup"));
	return 0;
}
