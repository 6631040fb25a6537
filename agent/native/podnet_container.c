/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet-container - a container's own network namespace on the caller's
 * private podnet network, for Apptainer without a setuid starter (docs/hpk.md).
 *
 *   podnet-container [--name NAME] [--] PROGRAM [ARGS...]
 *   e.g. podnet-container --name web -- apptainer exec --fakeroot x.sif cmd
 *
 * Installed setuid root. It asks podnetd, with the caller's identity (the
 * effective uid is the caller's while it connects: podnetd reads it with
 * SO_PEERCRED), for a container network namespace (`container_add` without a
 * path: podnetd makes /run/netns/pn-c..., wires an interface with an address
 * of the node's block and the name NAME.<user>.<cluster>, and ties its life to
 * this process, which PROGRAM becomes). Then, as root: setns into that
 * namespace (checked like a pod's: a root-owned nsfs file under /run/netns/),
 * a private mount namespace with the namespace's resolv.conf and sysfs; then it
 * drops every privilege for good (gid, uid; supplementary groups stay the
 * caller's) and execs PROGRAM as the caller. It never runs a program as root
 * and never runs a shell. The socket is fixed at build time (PN_DEFAULT_SOCKET):
 * a caller cannot point it at a daemon of their own.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "podnet_json.h"
#include "podnet_pod.h"
#include "podnet_transport.h"

#define TIMEOUT_MS 60000

static void usage(void)
{
	fprintf(stderr,
		"usage: podnet-container [--name NAME] [--] PROGRAM [ARGS...]\n"
		"  runs PROGRAM (e.g. apptainer exec --fakeroot IMAGE CMD) in a "
		"network\n  namespace of its own on your podnet network, named "
		"NAME.<you>.<cluster>\n");
}

static int die(const char *what, const char *why)
{
	fprintf(stderr, "podnet-container: %s%s%s\n", what, why && *why ? ": " : "",
		why ? why : "");
	return 126;
}

/* a DNS label: [a-z0-9-], 1..63, no edge dash (podnetd checks it again) */
static int label_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
		return 0;
	for (i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '-'))
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	uid_t ruid = getuid();
	gid_t rgid = getgid();
	const char *name = NULL;
	char req[512], cid[64], msg[600] = "", why[256] = "";
	pn_req_t r;
	pn_reply_t rep;
	long len;
	int i = 1, rc, fd;

	while (i < argc && argv[i][0] == '-') {
		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		}
		if (!strcmp(argv[i], "--name") && i + 1 < argc) {
			name = argv[i + 1];
			i += 2;
			continue;
		}
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage();
			return 0;
		}
		usage();
		return 2;
	}
	if (i >= argc) {
		usage();
		return 2;
	}
	if (name && !label_ok(name))
		return die("--name must be a DNS label ([a-z0-9-], 1-63)", NULL);
	if (geteuid() != 0)
		return die("not installed setuid root", NULL);
	if (ruid == 0)
		return die("run it as the container's user (root's containers are "
			   "not on a user network)", NULL);

	/* ask podnetd as the caller: SO_PEERCRED takes the effective uid */
	if (setresuid((uid_t) -1, ruid, 0) != 0)
		return die("setresuid", strerror(errno));
	snprintf(cid, sizeof(cid), "podnet-container-%ld", (long) getpid());
	pn_req_begin(&r, req, sizeof(req), "container_add");
	pn_req_str(&r, "container_id", cid);
	pn_req_str(&r, "ifname", "eth0");
	if (name)
		pn_req_str(&r, "name", name);
	len = pn_req_end(&r);
	if (len < 0)
		return die("request too large", NULL);
	memset(&rep, 0, sizeof(rep));
	rc = pn_call(PN_DEFAULT_SOCKET, req, (size_t) len, &rep, TIMEOUT_MS, msg,
		     sizeof(msg));
	if (setresuid((uid_t) -1, 0, 0) != 0)
		return die("setresuid", strerror(errno));
	if (rc != PN_CALL_OK)
		return die("podnetd", msg);
	if (!rep.ok) {
		fprintf(stderr, "podnet-container: podnetd refused: %s (%s)\n",
			rep.err_msg, rep.err_code);
		return 126;
	}
	if (rep.pod_uid != (long long) ruid || !rep.pod_netns[0] ||
	    !rep.pod_name[0])
		return die("podnetd's reply names no container of yours", NULL);

	fd = pn_open_netns(rep.pod_netns, why, sizeof(why));
	if (fd < 0)
		return die(rep.pod_netns, why);
	if (setns(fd, CLONE_NEWNET) != 0)
		return die("setns", strerror(errno));
	close(fd);
	if (pn_enter_pod_resolver(rep.pod_name, why, sizeof(why)) != 0)
		return die("container mounts", why);

	/* for good: real, effective and saved ids are the caller's */
	if (setresgid(rgid, rgid, rgid) != 0 || setresuid(ruid, ruid, ruid) != 0)
		return die("dropping privileges", strerror(errno));
	if (setresuid(0, 0, 0) == 0 || geteuid() == 0)
		return die("privileges could be regained", NULL);

	execvp(argv[i], argv + i);
	return die(argv[i], strerror(errno));
}
