/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_pod.h - entering a pod that podnetd named: the netns file check
 * (before setns) and the pod's private mounts (after setns). Used as root by
 * the SPANK plugin (slurmstepd) and pam_podnet.so (sshd's monitor).
 */
#ifndef PODNET_POD_H
#define PODNET_POD_H

#include <stddef.h>

#define PN_NETNS_DIR "/run/netns/"
/* podnetd's pidns_dir: one file per pod, its PID namespace (PID 1 podnet-init) */
#define PN_PIDNS_DIR "/run/podnet/pidns/"

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

/*
 * Opens the pod's PID namespace file PN_PIDNS_DIR<name> with the same checks
 * as pn_open_netns. Returns an O_CLOEXEC descriptor; -2 when the pod has none
 * (podnetd runs without pid_init); -1 with a reason in why.
 */
int pn_open_pidns(const char *name, char *why, size_t whysz);

/*
 * Mounts a fresh proc on /proc: the PID namespace of the calling process, so
 * `ps` lists the pod's processes only. After pn_enter_pod_resolver (its
 * private mount namespace), by a process already in the pod's PID namespace.
 */
int pn_mount_pod_proc(char *why, size_t whysz);

/*
 * Binds the pod's proc (PN_PIDNS_DIR<name>.proc, mounted by podnet-init) on
 * /proc, for a process that is not itself in the pod's PID namespace but
 * whose children will be (pam_podnet in sshd's monitor). After
 * pn_enter_pod_resolver. Returns 0, -1 with a reason in why.
 */
int pn_bind_pod_proc(const char *name, char *why, size_t whysz);

#endif /* PODNET_POD_H */
