/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet-image-exec - runs a Slurm task in a container image with Apptainer.
 *
 * The SPANK plugin (task_init, in the task, as the user) makes this program
 * argv[0] of the task of a step with an image (--podnet-image, or the site's
 * default) and moves the task's own argv[0] to PODNET_IMAGE_ARGV0. Slurm then
 * runs the site's and the user's task prologs, sets TMPDIR and the user's
 * limits, and execs this program with the job's environment; it execs
 *
 *   apptainer exec [--bind DIR]... IMAGE ARGV0 ARGV1...
 *
 * so the task becomes the container's process: same pod (network and PID
 * namespaces: Apptainer is not asked for new ones), same uid, same cgroup,
 * and Slurm's signals, exit status and accounting unchanged. DIR: the PMIx
 * server's rendezvous directories named in the environment, so MPI with
 * PMIx works in the image. Environment:
 *   PODNET_IMAGE         the image (SIF file or directory), kept for the task
 *   PODNET_IMAGE_ARGV0   the task's program (removed before the exec)
 *   PODNET_APPTAINER     apptainer's path (removed before the exec)
 * Runs as the user and is not setuid; it runs no shell.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* environment variables naming PMIx rendezvous directories (Slurm's mpi/pmix
 * and PMIx itself) */
static const char *const bind_vars[] = {
	"PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR", "SLURM_PMIX_TMPDIR",
};
#define N_BIND (sizeof(bind_vars) / sizeof(bind_vars[0]))

static int is_dir(const char *p)
{
	struct stat st;

	return p && p[0] == '/' && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int main(int argc, char **argv)
{
	const char *image = getenv("PODNET_IMAGE");
	char *argv0 = getenv("PODNET_IMAGE_ARGV0");
	char *apptainer = getenv("PODNET_APPTAINER");
	char **av;
	size_t n = 0, i, k;

	if (!image || image[0] != '/' || !argv0 || !argv0[0] || !apptainer ||
	    apptainer[0] != '/') {
		fprintf(stderr, "podnet-image-exec: run by the podnet SPANK "
			"plugin only (PODNET_IMAGE, PODNET_IMAGE_ARGV0 and "
			"PODNET_APPTAINER must be set)\n");
		return 127;
	}
	argv0 = strdup(argv0);
	apptainer = strdup(apptainer);
	if (!argv0 || !apptainer) {
		fprintf(stderr, "podnet-image-exec: out of memory\n");
		return 127;
	}
	(void) unsetenv("PODNET_IMAGE_ARGV0");
	(void) unsetenv("PODNET_APPTAINER");

	av = calloc((size_t) argc + 4 + 2 * N_BIND + 1, sizeof(*av));
	if (!av) {
		fprintf(stderr, "podnet-image-exec: out of memory\n");
		return 127;
	}
	av[n++] = "apptainer";
	av[n++] = "exec";
	for (k = 0; k < N_BIND; k++) {
		char *d = getenv(bind_vars[k]);
		int seen = 0;

		if (!is_dir(d) || !(d = strdup(d)))
			continue;
		for (i = 2; i < n; i += 2)
			seen |= !strcmp(av[i + 1], d);
		if (seen)
			continue;
		av[n++] = "--bind";
		av[n++] = d;
	}
	av[n++] = (char *) image;
	av[n++] = argv0;
	for (i = 1; i < (size_t) argc; i++)
		av[n++] = argv[i];
	av[n] = NULL;
	execv(apptainer, av);
	fprintf(stderr, "podnet: --podnet-image=%s: cannot run %s: %s\n", image,
		apptainer, strerror(errno));
	return 127;
}
