/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_init.c - PID 1 of a pod's PID namespace (podnet-init).
 *
 *   podnet-init NAME [PROCDIR]
 *
 * Run by podnetd (root) when it builds a pod. Creates a new PID namespace and
 * forks its first process, the pod's init, which:
 *   - reaps every process re-parented to it (orphans of steps and sessions),
 *   - lives as long as the pod: podnetd ends it with SIGTERM (or SIGKILL),
 *     and the kernel then kills every process left in the namespace.
 * With PROCDIR (an existing directory), the init first mounts the
 * namespace's proc there, in podnetd's mount namespace: pam_podnet binds it
 * on /proc for SSH sessions (their sshd monitor is not in the namespace and
 * cannot mount it). The outer process waits for that, prints the init's PID
 * (as seen from podnetd) on stdout and exits; the init runs in its own
 * session, with stdio on /dev/null.
 * slurmstepd and sshd forks tasks and shells into the namespace
 * (setns(CLONE_NEWPID) before fork: docs/agent.md, "PID namespace").
 * NAME only labels the process (argv) for ps on the host.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static int run_init(const char *procdir, int ready)
{
	sigset_t set;
	siginfo_t si;
	char ok = 1;
	int fd;

	if (procdir && mount("proc", procdir, "proc",
			     MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
		fprintf(stderr, "podnet-init: mount proc on %s: %s\n", procdir,
			strerror(errno));
		return 1;
	}
	if (write(ready, &ok, 1) != 1)
		return 1;
	close(ready);

	/* no controlling terminal, nothing inherited */
	(void) setsid();
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		(void) dup2(fd, 0);
		(void) dup2(fd, 1);
		(void) dup2(fd, 2);
		if (fd > 2)
			close(fd);
	}
	(void) prctl(PR_SET_NAME, "podnet-init", 0, 0, 0);
	(void) prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);

	sigfillset(&set);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return 1;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	for (;;) {
		if (sigwaitinfo(&set, &si) < 0) {
			if (errno == EINTR)
				continue;
			return 1;
		}
		if (si.si_signo != SIGCHLD)
			return 0; /* end of the pod */
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	}
}

/*
 * podnet-init --join PID PROCDIR: mounts a proc of the PID namespace whose init
 * is PID (Slurm's namespace/linux job namespace, which podnetd adopts as the
 * pod's) on PROCDIR, in the caller's mount namespace. A proc shows the PID
 * namespace of the process mounting it: a child forked after setns does it.
 */
static int join_mount_proc(const char *pid, const char *procdir)
{
	char path[64];
	int fd, st;
	pid_t child;

	if (!pid[0] || strspn(pid, "0123456789") != strlen(pid) ||
	    strlen(pid) > 10) {
		fprintf(stderr, "podnet-init: --join: not a PID: %s\n", pid);
		return 2;
	}
	snprintf(path, sizeof(path), "/proc/%s/ns/pid", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || setns(fd, CLONE_NEWPID) < 0) {
		fprintf(stderr, "podnet-init: %s: %s\n", path, strerror(errno));
		return 1;
	}
	close(fd);
	child = fork();
	if (child < 0) {
		fprintf(stderr, "podnet-init: fork: %s\n", strerror(errno));
		return 1;
	}
	if (child == 0) {
		if (mount("proc", procdir, "proc",
			  MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
			fprintf(stderr, "podnet-init: mount proc on %s: %s\n",
				procdir, strerror(errno));
			_exit(1);
		}
		_exit(0);
	}
	if (waitpid(child, &st, 0) < 0)
		return 1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(int argc, char **argv)
{
	pid_t pid;
	int pipefd[2];
	char ok = 0;

	if (argc == 4 && !strcmp(argv[1], "--join") && argv[3][0])
		return join_mount_proc(argv[2], argv[3]);
	if (argc < 2 || argc > 3 || !argv[1][0] || (argc == 3 && !argv[2][0])) {
		fprintf(stderr, "usage: podnet-init NAME [PROCDIR] | --join PID PROCDIR\n");
		return 2;
	}
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		fprintf(stderr, "podnet-init: pipe: %s\n", strerror(errno));
		return 1;
	}
	if (unshare(CLONE_NEWPID) < 0) {
		fprintf(stderr, "podnet-init: unshare(CLONE_NEWPID): %s\n",
			strerror(errno));
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "podnet-init: fork: %s\n", strerror(errno));
		return 1;
	}
	if (pid == 0) {
		close(pipefd[0]);
		_exit(run_init(argc == 3 ? argv[2] : NULL, pipefd[1]));
	}
	close(pipefd[1]);
	if (read(pipefd[0], &ok, 1) != 1 || !ok) {
		(void) waitpid(pid, NULL, 0);
		return 1; /* the init said why on stderr */
	}
	printf("%d\n", (int) pid);
	return fflush(stdout) == 0 ? 0 : 1;
}
