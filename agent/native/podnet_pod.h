/*
 * podnet_pod.h - entering a pod that podnetd named: the netns file check
 * (before setns) and the pod's private mounts (after setns). Used as root by
 * the SPANK plugin (slurmstepd) and pam_podnet.so (sshd's monitor).
 */
#ifndef PODNET_POD_H
#define PODNET_POD_H

#include <stddef.h>

#define PN_NETNS_DIR "/run/netns/"

/*
 * Checks that path names a network namespace file under /run/netns/ (one
 * component, [A-Za-z0-9._-], not "." or ".."), opens it without following
 * symlinks, and verifies it is an nsfs file owned by root. Returns an open
 * O_CLOEXEC descriptor, or -1 with a reason in why.
 */
int pn_open_netns(const char *path, char *why, size_t whysz);

/*
 * The pod's mounts (what `ip netns exec` does), after setns into the pod: in a
 * private mount namespace of the calling process (always, MS_SLAVE|MS_REC on /),
 * bind-mounts /etc/netns/<name>/resolv.conf onto /etc/resolv.conf when it
 * exists, and mounts a fresh sysfs on /sys (the pod's interfaces only; the
 * cgroup tree under /sys/fs/cgroup is kept). name is the netns name (checked
 * like pn_open_netns). Returns 0, -1 with a reason in why. Must run as root,
 * single-threaded, in the process that will exec the user's program.
 */
int pn_enter_pod_resolver(const char *name, char *why, size_t whysz);

#endif /* PODNET_POD_H */
