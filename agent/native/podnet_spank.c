/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank.c - SPANK plugin: every Slurm job gets a network pod per node.
 *
 *   extern step (slurmstepd, root)   init_post_opt: job_up (pod ready on reply)
 *                                    exit:          job_down
 *   batch step, step 0..N            init_post_opt: job_get (job_up if the pod
 *                                    is missing), setns() of slurmstepd's main
 *                                    thread BEFORE the MPI plugin starts its
 *                                    threads and before the tasks fork
 *                                    task_init_privileged: verify the task is in
 *                                    the pod, or fail it with a readable message
 *   step on the host network         (--podnet=no, or no pod) init_post_opt to
 *                                    user_init: slurmstepd in the cgroup
 *                                    podnet-stepd, so that its connections to
 *                                    srun in a pod pass podnetd's host filter
 *   job_prolog (root)                --podnet=no: leave a marker for the
 *                                    extern step (which cannot see options);
 *                                    run by slurmd only if the plugin was in
 *                                    its plugstack when slurmd started
 *   job_epilog (root)                job_down (idempotent safety net)
 *   task_init (task, as the user)    --podnet-image (or the site's image):
 *                                    the task's program runs in the image
 *                                    through podnet-image-exec + Apptainer
 *   sbatch/salloc/srun               --podnet=yes|no (no only if allowed),
 *                                    --podnet-image=IMAGE|none
 *
 * See docs/roles/spank.md for why each step is where it is (measured on Slurm
 * 24.11). plugstack.conf arguments:
 *   socket=PATH       podnetd socket (default /run/podnet/podnetd.sock)
 *   timeout=SECONDS   bound for getting a pod (default 30, 1..3600)
 *   allow_opt_out=0|1 accept --podnet=no (default 0)
 *   policy=fail|warn  a step that cannot join its pod fails (default) or runs
 *                     on the host network with a warning
 *   image=PATH|none   the site's image for every step without --podnet-image
 *                     (default none)
 *   apptainer=PATH    Apptainer (default /usr/bin/apptainer)
 *   image_exec=PATH   podnet-image-exec (default
 *                     /usr/local/lib/podnet/podnet-image-exec)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "podnet_json.h"
#include "podnet_pod.h"
#include "podnet_transport.h"

SPANK_PLUGIN(podnet, 1);

#ifndef SLURM_EXTERN_CONT
#define SLURM_EXTERN_CONT (0xfffffffc)
#endif
#ifndef SLURM_BATCH_SCRIPT
#define SLURM_BATCH_SCRIPT (0xfffffffb)
#endif
#ifndef SLURM_INTERACTIVE_STEP
#define SLURM_INTERACTIVE_STEP (0xfffffffa)
#endif

enum policy { POLICY_FAIL, POLICY_WARN };

static struct {
	char socket[108];
	int timeout_s;
	int allow_opt_out;
	enum policy policy;
	char image[PATH_MAX];      /* the site's image ("": none) */
	char apptainer[PATH_MAX];
	char image_exec[PATH_MAX];
} cfg = { PN_DEFAULT_SOCKET, 30, 0, POLICY_FAIL, "", "/usr/bin/apptainer",
	  "/usr/local/lib/podnet/podnet-image-exec" };

/* per-process state (each slurmstepd loads the plugin afresh) */
static int opt_out;              /* --podnet=no given (and allowed) */
static int joined;               /* main thread is in the pod */
static dev_t pod_dev;            /* identity of the pod's netns */
static ino_t pod_ino;
static char pod_name[64];
static char pending_error[768];  /* reported to the user in the task */
static int pidns_fd = -1;        /* the pod's PID namespace (none: -1) */
static int host_pidns_fd = -1;   /* slurmstepd's own, to return to */
static ino_t pidns_ino;
static int pid_moved;            /* tasks fork into the pod's PID namespace */
static int pid_native;           /* slurmstepd is in it already (namespace/linux) */
static char user_image[PATH_MAX]; /* --podnet-image ("none": no image) */

static int opt_cb(int val, const char *optarg, int remote);
static int image_opt_cb(int val, const char *optarg, int remote);

static struct spank_option podnet_option = {
	"podnet", "yes|no",
	"Run the job in its private network pod (yes, the default) or on the "
	"host network (no; only where the site allows it).",
	1, 0, opt_cb
};

static struct spank_option image_option = {
	"podnet-image", "IMAGE|none",
	"Run the tasks in a container image inside the job's pod, with "
	"Apptainer: IMAGE is the absolute path of a SIF file or of an "
	"unpacked directory on the compute nodes; none: no image, not even "
	"the site's default.",
	1, 0, image_opt_cb
};

/* ---------------------------------------------------------------------- */

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* an absolute path of at most PATH_MAX - 1 bytes, or "none" */
static int image_arg_ok(const char *v)
{
	return v && (!strcmp(v, "none") ||
		     (v[0] == '/' && strlen(v) < PATH_MAX));
}

static int parse_args(int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		const char *a = av[i];
		unsigned long long v;

		if (!strncmp(a, "socket=", 7)) {
			const char *p = a + 7;
			if (p[0] != '/' || strlen(p) >= sizeof(cfg.socket)) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need an absolute path shorter "
					    "than %zu bytes", a,
					    sizeof(cfg.socket));
				return -1;
			}
			snprintf(cfg.socket, sizeof(cfg.socket), "%s", p);
		} else if (!strncmp(a, "timeout=", 8)) {
			if (pn_parse_uint(a + 8, 1, 3600, &v) < 0) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need seconds in 1..3600", a);
				return -1;
			}
			cfg.timeout_s = (int) v;
		} else if (!strncmp(a, "allow_opt_out=", 14)) {
			if (pn_parse_uint(a + 14, 0, 1, &v) < 0) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need 0 or 1", a);
				return -1;
			}
			cfg.allow_opt_out = (int) v;
		} else if (!strncmp(a, "image=", 6)) {
			if (!image_arg_ok(a + 6)) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need an absolute path or none", a);
				return -1;
			}
			snprintf(cfg.image, sizeof(cfg.image), "%s",
				 strcmp(a + 6, "none") ? a + 6 : "");
		} else if (!strncmp(a, "apptainer=", 10) ||
			   !strncmp(a, "image_exec=", 11)) {
			int app = a[0] == 'a';
			const char *p = strchr(a, '=') + 1;

			if (p[0] != '/' || strlen(p) >= PATH_MAX) {
				slurm_error("podnet: plugstack argument '%s': "
					    "need an absolute path", a);
				return -1;
			}
			snprintf(app ? cfg.apptainer : cfg.image_exec,
				 PATH_MAX, "%s", p);
		} else if (!strcmp(a, "policy=fail")) {
			cfg.policy = POLICY_FAIL;
		} else if (!strcmp(a, "policy=warn")) {
			cfg.policy = POLICY_WARN;
		} else {
			slurm_error("podnet: unknown plugstack argument '%s' "
				    "(known: socket= timeout= allow_opt_out= "
				    "policy=fail|warn image= apptainer= "
				    "image_exec=)", a);
			return -1;
		}
	}
	return 0;
}

static int opt_cb(int val, const char *optarg, int remote)
{
	(void) val;
	(void) remote;
	if (!optarg || !strcmp(optarg, "yes")) {
		opt_out = 0;
		return 0;
	}
	if (strcmp(optarg, "no") != 0) {
		slurm_error("podnet: --podnet=%s: use --podnet=yes or "
			    "--podnet=no", optarg);
		return -1;
	}
	if (!cfg.allow_opt_out) {
		slurm_error("podnet: --podnet=no is not allowed on this "
			    "cluster: every job runs in its network pod");
		return -1;
	}
	opt_out = 1;
	return 0;
}

static int image_opt_cb(int val, const char *optarg, int remote)
{
	(void) val;
	(void) remote;
	if (!image_arg_ok(optarg)) {
		slurm_error("podnet: --podnet-image=%s: give the absolute path of "
			    "a SIF file or of an image directory on the compute "
			    "nodes, or none", optarg ? optarg : "");
		return -1;
	}
	snprintf(user_image, sizeof(user_image), "%s", optarg);
	return 0;
}

/* Sends one request, retrying while podnetd says "try again" (EUNAVAIL) or
 * is briefly unreachable, until deadline. Returns a PN_CALL_* code. */
static int call_until(const char *req, size_t len, pn_reply_t *rep,
		      long long deadline, char *msg, size_t msgsz)
{
	int delay = 100, rc;

	for (;;) {
		int left = (int) (deadline - mono_ms());

		if (left <= 0) {
			if (!msg[0])
				snprintf(msg, msgsz, "no answer from podnetd "
					 "within %d s", cfg.timeout_s);
			return PN_CALL_E_TIMEOUT;
		}
		rc = pn_call(cfg.socket, req, len, rep, left, msg, msgsz);
		if (rc == PN_CALL_OK &&
		    (rep->ok || strcmp(rep->err_code, "EUNAVAIL") != 0))
			return rc;
		if (rc == PN_CALL_E_PROTO || rc == PN_CALL_E_USAGE)
			return rc;
		if (rc == PN_CALL_OK)
			snprintf(msg, msgsz, "%s", rep->err_msg);
		if (deadline - mono_ms() <= delay)
			return rc == PN_CALL_OK ? PN_CALL_E_TIMEOUT : rc;
		(void) poll(NULL, 0, delay);
		if (delay < 2000)
			delay *= 2;
	}
}

/* user name of uid, from the job record or the passwd database */
static int user_name(uid_t uid, const char *hint, char *out, size_t outsz)
{
	struct passwd pw, *res = NULL;
	char buf[4096];

	if (hint && hint[0] && strlen(hint) < outsz) {
		snprintf(out, outsz, "%s", hint);
		return 0;
	}
	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &res) != 0 || !res ||
	    strlen(pw.pw_name) >= outsz)
		return -1;
	snprintf(out, outsz, "%s", pw.pw_name);
	return 0;
}

/*
 * job_up for this node. The job's name, node list and user come from
 * slurmctld (slurm_load_job), not from the step's environment, which the
 * user controls and which the extern step does not have. node_index is this node's position in the job (S_JOB_NODEID of the
 * extern step) or, in other steps, our position in the job's node list.
 * Returns 0 with *rep filled, -1 on error (msg set).
 */
static int job_up(spank_t sp, uint32_t job_id, uid_t uid, int node_index,
		  const char *node_name, long long deadline, pn_reply_t *rep,
		  char *msg, size_t msgsz)
{
	job_info_msg_t *info = NULL;
	slurm_job_info_t *job = NULL;
	char user[256], *buf = NULL;
	pn_req_t r;
	long len;
	int rc = -1, n = 0, found = -1, i;
	uint32_t k;

	(void) sp;
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(26, 5, 0)
	/* 26.05: slurm_load_job takes a step id (job_id set, the rest NO_VAL) */
	slurm_step_id_t sid = SLURM_STEP_ID_INITIALIZER;

	sid.job_id = job_id;
	rc = slurm_load_job(&info, sid, SHOW_DETAIL);
#else
	rc = slurm_load_job(&info, job_id, SHOW_DETAIL);
#endif
	if (rc != 0 || !info) {
		snprintf(msg, msgsz, "cannot read job %u from slurmctld: %s",
			 job_id, slurm_strerror(errno));
		return -1;
	}
	rc = -1;
	for (k = 0; k < info->record_count; k++)
		if (info->job_array[k].job_id == job_id)
			job = &info->job_array[k];
	if (!job || !job->nodes) {
		snprintf(msg, msgsz, "slurmctld has no node list for job %u",
			 job_id);
		goto out;
	}
	if (user_name(uid, job->user_name, user, sizeof(user)) < 0) {
		snprintf(msg, msgsz, "no user name for uid %u", (unsigned) uid);
		goto out;
	}
	buf = malloc(PN_MAX_LINE + 1);
	if (!buf) {
		snprintf(msg, msgsz, "out of memory");
		goto out;
	}
	pn_req_begin(&r, buf, PN_MAX_LINE + 1, "job_up");
	pn_req_int(&r, "job_id", job_id);
	pn_req_str(&r, "user", user);
	pn_req_int(&r, "uid", (long long) uid);
	pn_req_str(&r, "job_name", job->name ? job->name : "");
	pn_req_list_begin(&r, "nodes");
	{
		__typeof__(slurm_hostlist_create(NULL)) hl =
			slurm_hostlist_create(job->nodes);
		char *h;

		if (!hl) {
			snprintf(msg, msgsz, "cannot parse node list '%s'",
				 job->nodes);
			goto out;
		}
		while ((h = slurm_hostlist_shift(hl))) {
			if (node_name && found < 0 && !strcmp(h, node_name))
				found = n;
			pn_req_list_str(&r, h);
			n++;
			free(h);
		}
		slurm_hostlist_destroy(hl);
	}
	pn_req_list_end(&r);
	if (node_index < 0)
		node_index = found;
	if (node_index < 0 || node_index >= n) {
		snprintf(msg, msgsz, "this node (%s) is not in job %u's node "
			 "list %s", node_name ? node_name : "?", job_id,
			 job->nodes);
		goto out;
	}
	pn_req_int(&r, "node_index", node_index);
	len = pn_req_end(&r);
	if (len < 0) {
		snprintf(msg, msgsz, "job_up request does not fit in %d bytes "
			 "(node list too long?)", PN_MAX_LINE);
		goto out;
	}
	i = call_until(buf, (size_t) len, rep, deadline, msg, msgsz);
	if (i != PN_CALL_OK)
		goto out;
	if (!rep->ok) {
		snprintf(msg, msgsz, "%s (%s)", rep->err_msg, rep->err_code);
		goto out;
	}
	rc = 0;
out:
	free(buf);
	slurm_free_job_info_msg(info);
	return rc;
}

static int simple_call(const char *op, uint32_t job_id, long long deadline,
		       pn_reply_t *rep, char *msg, size_t msgsz)
{
	char buf[256];
	pn_req_t r;
	long len;

	pn_req_begin(&r, buf, sizeof(buf), op);
	pn_req_int(&r, "job_id", job_id);
	len = pn_req_end(&r);
	if (len < 0) {
		snprintf(msg, msgsz, "internal error building %s", op);
		return PN_CALL_E_USAGE;
	}
	return call_until(buf, (size_t) len, rep, deadline, msg, msgsz);
}

/* ---------------------------------------------------------------------- */
/*
 * The extern step never sees user options (measured on 24.11), but the job
 * prolog does (spank_option_getopt) and runs before it on every node: the
 * prolog leaves a root-only marker that the extern step reads.
 */
#define MARK_DIR "/run/podnet-spank"

static void mark_path(uint32_t job_id, char *p, size_t sz)
{
	snprintf(p, sz, MARK_DIR "/optout.%u", job_id);
}

static void opt_out_mark(uint32_t job_id)
{
	char p[64];
	struct stat st;
	int fd;

	if (mkdir(MARK_DIR, 0700) < 0 && errno != EEXIST)
		return;
	if (lstat(MARK_DIR, &st) < 0 || !S_ISDIR(st.st_mode) ||
	    st.st_uid != 0 || (st.st_mode & 077))
		return;
	mark_path(job_id, p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
}

static int opt_out_marked(uint32_t job_id)
{
	char p[64];
	struct stat st;

	if (!cfg.allow_opt_out)
		return 0;
	if (lstat(MARK_DIR, &st) < 0 || !S_ISDIR(st.st_mode) ||
	    st.st_uid != 0 || (st.st_mode & 077))
		return 0;
	mark_path(job_id, p, sizeof(p));
	return lstat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0;
}

static void opt_out_clear(uint32_t job_id)
{
	char p[64];

	mark_path(job_id, p, sizeof(p));
	(void) unlink(p);
}

/*
 * Slurm's namespace/linux (>= 25.11, clone_ns_flags CLONE_NEWPID) gives the
 * job a PID namespace before the extern step's SPANK callbacks run: its PID 1,
 * "slurmstepd: [<job>:namespace]", is a child of this slurmstepd, and slurmd
 * starts every other step's slurmstepd inside it. Returns that child's PID (0:
 * none, the site does not run it).
 */
static pid_t slurm_job_pidns_init(void)
{
	char path[64], line[256], self_ns[64] = "", ns[64];
	FILE *f;
	long pid;
	ssize_t n;

	n = readlink("/proc/self/ns/pid", self_ns, sizeof(self_ns) - 1);
	if (n <= 0)
		return 0;
	self_ns[n] = '\0';
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int) getpid(),
		 (int) getpid());
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fscanf(f, "%ld", &pid) == 1) {
		FILE *st;
		int init = 0;

		snprintf(path, sizeof(path), "/proc/%ld/ns/pid", pid);
		n = readlink(path, ns, sizeof(ns) - 1);
		if (n <= 0)
			continue;
		ns[n] = '\0';
		if (!strcmp(ns, self_ns))
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/status", pid);
		st = fopen(path, "re");
		if (!st)
			continue;
		while (fgets(line, sizeof(line), st)) {
			size_t l;

			if (strncmp(line, "NSpid:", 6) != 0)
				continue;
			l = strlen(line);
			while (l && (line[l - 1] == '\n' || line[l - 1] == ' '))
				line[--l] = '\0';
			/* the last field is its PID in its own namespace */
			init = l >= 2 && line[l - 1] == '1' &&
			       (line[l - 2] == '\t' || line[l - 2] == ' ');
			break;
		}
		fclose(st);
		if (init) {
			fclose(f);
			return (pid_t) pid;
		}
	}
	fclose(f);
	return 0;
}

/* The pod's PID namespace becomes the job's own (Slurm's): podnetd pins it. */
static void adopt_slurm_pidns(uint32_t job_id)
{
	char buf[256], msg[600] = "";
	pn_reply_t rep;
	pn_req_t r;
	pid_t pid = slurm_job_pidns_init();
	long len;
	int rc;

	if (pid <= 0)
		return;
	pn_req_begin(&r, buf, sizeof(buf), "job_pidns");
	pn_req_int(&r, "job_id", job_id);
	pn_req_int(&r, "pid", pid);
	len = pn_req_end(&r);
	if (len < 0)
		return;
	rc = call_until(buf, (size_t) len, &rep,
			mono_ms() + cfg.timeout_s * 1000LL, msg, sizeof(msg));
	if (rc == PN_CALL_OK && rep.ok)
		slurm_info("podnet: job %u: the pod's PID namespace is the "
			   "job's (Slurm namespace/linux, PID 1 is %d)",
			   job_id, (int) pid);
	else
		slurm_error("podnet: job %u: cannot adopt Slurm's PID namespace "
			    "of the job (PID 1 is %d): %s", job_id, (int) pid,
			    rc == PN_CALL_OK ? rep.err_msg : msg);
}

static void extern_step_up(spank_t sp, uint32_t job_id)
{
	uint32_t nodeid = 0;
	uid_t uid;
	pn_reply_t rep;
	char msg[600] = "";
	long long t0 = mono_ms();
	int rc;

	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_NODEID, &nodeid) != ESPANK_SUCCESS) {
		slurm_error("podnet: job %u: cannot get uid/node id", job_id);
		return;
	}
	if (opt_out_marked(job_id)) {
		slurm_info("podnet: job %u opted out (--podnet=no): no pod",
			   job_id);
		return;
	}
	rc = job_up(sp, job_id, uid, (int) nodeid, NULL,
		    t0 + cfg.timeout_s * 1000LL, &rep, msg, sizeof(msg));
	if (rc == 0) {
		slurm_info("podnet: job %u: pod %s (%s) ready in %lld ms",
			   job_id, rep.pod_name, rep.pod_ip, mono_ms() - t0);
		adopt_slurm_pidns(job_id);
	} else {
		/*
		 * Do not fail the extern step: Slurm then requeues the job and
		 * holds it (launch_failed_requeued_held) while its batch script
		 * may already run elsewhere, and the user never sees why. The
		 * steps retry job_up and fail with this message instead.
		 */
		slurm_error("podnet: job %u: no pod on this node yet: %s "
			    "(steps will retry)", job_id, msg);
	}
}

static void set_pending(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));

static void set_pending(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(pending_error, sizeof(pending_error), fmt, ap);
	va_end(ap);
}

static int in_pod_pidns(void);

/*
 * The pod's PID namespace, for user_init to fork the tasks into. setns() of a
 * PID namespace changes only where the caller's future children go, and a
 * thread created meanwhile would fail (EINVAL): the window is kept to the
 * task forks, user_init to task_post_fork (docs/agent.md, "PID namespace").
 */
static void open_pidns(void)
{
	char why[512];
	struct stat st;

	pidns_fd = pn_open_pidns(pod_name, why, sizeof(why));
	if (pidns_fd == -2) {
		pidns_fd = -1; /* podnetd gives pods no PID namespace */
		return;
	}
	if (pidns_fd < 0 || fstat(pidns_fd, &st) < 0) {
		set_pending("podnet: cannot open the pod's PID namespace: %s",
			    why);
		return;
	}
	pidns_ino = st.st_ino;
	if (in_pod_pidns()) {
		/* Slurm's namespace/linux started this slurmstepd in the
		 * job's PID namespace, which podnetd adopted as the pod's:
		 * the tasks are born in it, nothing to move */
		pid_native = 1;
		return;
	}
	host_pidns_fd = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
	if (host_pidns_fd < 0) {
		set_pending("podnet: /proc/self/ns/pid: %s", strerror(errno));
		close(pidns_fd);
		pidns_fd = -1;
	}
}

/* Is the calling process in the pod's PID namespace? */
static int in_pod_pidns(void)
{
	struct stat st;

	return stat("/proc/self/ns/pid", &st) == 0 && st.st_ino == pidns_ino;
}

/*
 * Is this slurmstepd inside the job's namespaces of Slurm's namespace/linux?
 * There /proc is the job's: PID 1 is "slurmstepd: [<job>:namespace]".
 */
static int in_slurm_job_ns(void)
{
	char buf[128] = "";
	ssize_t n;
	int fd = open("/proc/1/cmdline", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return !strncmp(buf, "slurmstepd: [", 13) && strstr(buf, ":namespace]");
}

/* Puts the calling thread (slurmstepd's main thread) into the pod. */
static void step_join(spank_t sp, uint32_t job_id, uint32_t step_id)
{
	char msg[600] = "", why[512], node[256] = "", fallback[64];
	const char *netns = NULL;
	long long deadline = mono_ms() + cfg.timeout_s * 1000LL;
	pn_reply_t rep;
	struct stat st;
	uid_t uid;
	int rc, fd;

	if (opt_out) {
		slurm_info("podnet: job %u step %u: --podnet=no, host network",
			   job_id, step_id);
		return;
	}
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS) {
		set_pending("podnet: cannot get the job's uid");
		return;
	}
	rc = simple_call("job_get", job_id, deadline, &rep, msg, sizeof(msg));
	if (rc == PN_CALL_OK && !rep.ok && !strcmp(rep.err_code, "ENOENT")) {
		/* no pod (extern step failed or opted out): build it now */
		int idx = -1;
		if (step_id == SLURM_BATCH_SCRIPT)
			idx = 0; /* the batch host is the job's first node */
		else if (spank_getenv(sp, "SLURMD_NODENAME", node,
				      sizeof(node)) != ESPANK_SUCCESS)
			(void) gethostname(node, sizeof(node) - 1);
		msg[0] = '\0';
		rc = job_up(sp, job_id, uid, idx, node, deadline, &rep, msg,
			    sizeof(msg));
		rc = rc == 0 ? PN_CALL_OK : -1;
	} else if (rc == PN_CALL_OK && !rep.ok) {
		snprintf(msg, sizeof(msg), "%s (%s)", rep.err_msg,
			 rep.err_code);
		rc = -1;
	}
	if (rc == PN_CALL_OK) {
		netns = rep.pod_netns;
		snprintf(pod_name, sizeof(pod_name), "%s", rep.pod_name);
		if (rep.pod_uid >= 0 && rep.pod_uid != (long long) uid) {
			set_pending("podnet: podnetd returned a pod of another "
				    "user; refusing it");
			return;
		}
	} else if (rc == PN_CALL_E_CONNECT) {
		/* daemon down (restarting?): the pod may still exist */
		snprintf(fallback, sizeof(fallback), PN_NETNS_DIR "pn-j%u",
			 job_id);
		fd = pn_open_netns(fallback, why, sizeof(why));
		if (fd < 0) {
			set_pending("podnet: cannot join the job's network pod: "
				    "%s; %s", msg, why);
			return;
		}
		close(fd);
		slurm_error("podnet: %s; using %s", msg, fallback);
		netns = fallback;
		snprintf(pod_name, sizeof(pod_name), "pn-j%u", job_id);
	} else {
		set_pending("podnet: cannot join the job's network pod: %s",
			    msg);
		return;
	}

	fd = pn_open_netns(netns, why, sizeof(why));
	if (fd < 0) {
		set_pending("podnet: cannot join the job's network pod: %s%s",
			    why, in_slurm_job_ns() ?
			    " (Slurm's namespace/linux: namespace.yaml needs "
			    "shared: true)" : "");
		return;
	}
	if (fstat(fd, &st) < 0 || setns(fd, CLONE_NEWNET) < 0) {
		int err = errno;

		snprintf(why, sizeof(why), "setns(%s): %s", netns,
			 strerror(err));
		close(fd);
		set_pending("podnet: cannot join the job's network pod: %s%s",
			    why, err == EPERM && in_slurm_job_ns() ?
			    " (Slurm's namespace/linux: CLONE_NEWUSER is not "
			    "supported)" : "");
		return;
	}
	close(fd);
	pod_dev = st.st_dev;
	pod_ino = st.st_ino;
	joined = 1;
	slurm_info("podnet: job %u step %u joined pod %s", job_id, step_id,
		   pod_name);
	open_pidns();
}

/* Is the calling thread in the pod's network namespace? */
static int in_pod(void)
{
	struct stat st;

	if (stat("/proc/thread-self/ns/net", &st) < 0)
		return 0;
	return st.st_dev == pod_dev && st.st_ino == pod_ino;
}

/* ---------------------------------------------------------------------- */
/*
 * A step whose slurmstepd stays on the node's host network (--podnet=no, or a
 * pod it could not join): Slurm opens the step's connections to srun (IO, the
 * --pty terminal) with the user's effective uid, and srun in a login or job
 * pod is behind podnetd's host-side filter, which drops every user socket to
 * the pod network ("Slurmd could not connect IO"). The filter accepts sockets
 * created in the cgroup PN_STEPD_CGROUP, which podnetd creates and only root
 * can join: slurmstepd is in it from init_post_opt (before Slurm opens those
 * connections) to user_init (before it forks the tasks). The tasks are born
 * in slurmstepd's own cgroup and stay filtered (task_init_privileged checks).
 */
#define PN_STEPD_CGROUP "podnet-stepd"

static const char *const cg_mounts[] = { "/sys/fs/cgroup",
					 "/sys/fs/cgroup/unified" };
static const char *cg_mnt;          /* cgroup2 mount holding PN_STEPD_CGROUP */
static char cg_home[PATH_MAX];      /* slurmstepd's own cgroup (under cg_mnt) */
static pid_t cg_pid;                /* slurmstepd, to move back */
static int cg_moved;

/* the caller's cgroup v2 path ("0::/path" in /proc/self/cgroup) */
static int own_cgroup(char *out, size_t sz)
{
	char line[PATH_MAX + 8];
	FILE *f = fopen("/proc/self/cgroup", "re");
	int rc = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		size_t l = strlen(line);

		if (strncmp(line, "0::", 3) != 0)
			continue;
		while (l && line[l - 1] == '\n')
			line[--l] = '\0';
		if (strlen(line + 3) < sz) {
			snprintf(out, sz, "%s", line + 3);
			rc = 0;
		}
		break;
	}
	fclose(f);
	return rc;
}

static int cg_write_pid(const char *dir, pid_t pid, char *why, size_t whysz)
{
	char path[PATH_MAX + 32];
	int fd, rc = 0;

	if (snprintf(path, sizeof(path), "%s/cgroup.procs", dir) >=
	    (int) sizeof(path)) {
		snprintf(why, whysz, "%s: path too long", dir);
		return -1;
	}
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || dprintf(fd, "%d\n", (int) pid) < 0) {
		snprintf(why, whysz, "%s: %s", path, strerror(errno));
		rc = -1;
	}
	if (fd >= 0 && close(fd) < 0 && !rc) {
		snprintf(why, whysz, "%s: %s", path, strerror(errno));
		rc = -1;
	}
	return rc;
}

/* slurmstepd (root) into PN_STEPD_CGROUP; without it (podnetd made none: no
 * cgroup v2) the step runs as before, and srun in a pod gets no IO */
static void stepd_cgroup_enter(uint32_t job_id, uint32_t step_id)
{
	char dir[PATH_MAX], why[PATH_MAX + 64];
	size_t i;

	if (own_cgroup(cg_home, sizeof(cg_home)) < 0)
		return;
	for (i = 0; i < sizeof(cg_mounts) / sizeof(cg_mounts[0]); i++) {
		struct stat st;

		snprintf(dir, sizeof(dir), "%s/" PN_STEPD_CGROUP, cg_mounts[i]);
		if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
			cg_mnt = cg_mounts[i];
			break;
		}
	}
	if (!cg_mnt) {
		slurm_info("podnet: job %u step %u: no cgroup " PN_STEPD_CGROUP
			   " (podnetd: no cgroup v2): srun in a pod cannot "
			   "reach this step", job_id, step_id);
		return;
	}
	cg_pid = getpid();
	if (cg_write_pid(dir, cg_pid, why, sizeof(why)) < 0) {
		slurm_error("podnet: job %u step %u: %s", job_id, step_id, why);
		return;
	}
	cg_moved = 1;
}

/* slurmstepd back to its own cgroup, before the tasks fork (-1: it could not:
 * the step must not start tasks) */
static int stepd_cgroup_leave(void)
{
	char dir[2 * PATH_MAX], why[2 * PATH_MAX + 64];
	uid_t euid = geteuid();
	int rc;

	if (!cg_moved)
		return 0;
	snprintf(dir, sizeof(dir), "%s%s", cg_mnt, cg_home);
	if (euid != 0 && seteuid(0) < 0) {
		slurm_error("podnet: seteuid(0): %s", strerror(errno));
		return -1;
	}
	rc = cg_write_pid(dir, cg_pid, why, sizeof(why));
	if (euid != 0 && seteuid(euid) < 0) {
		slurm_error("podnet: seteuid(%u): %s", (unsigned) euid,
			    strerror(errno));
		return -1; /* never go on as root */
	}
	if (rc < 0) {
		slurm_error("podnet: cannot return slurmstepd to its cgroup: "
			    "%s", why);
		return -1;
	}
	cg_moved = 0;
	return 0;
}

/* Is the calling process in PN_STEPD_CGROUP (or below it)? */
static int in_stepd_cgroup(void)
{
	char cg[PATH_MAX];
	size_t n = strlen("/" PN_STEPD_CGROUP);

	return own_cgroup(cg, sizeof(cg)) == 0 &&
	       !strncmp(cg, "/" PN_STEPD_CGROUP, n) &&
	       (cg[n] == '\0' || cg[n] == '/');
}

/* ---------------------------------------------------------------------- */
/* SPANK entry points                                                      */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (parse_args(ac, av) < 0)
		return -1;
	if (spank_option_register(sp, &podnet_option) != ESPANK_SUCCESS ||
	    spank_option_register(sp, &image_option) != ESPANK_SUCCESS) {
		slurm_error("podnet: cannot register --podnet/--podnet-image");
		return -1;
	}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0, step_id = 0;

	(void) ac;
	(void) av;
	switch (spank_context()) {
	case S_CTX_REMOTE:
		break;
	default:
		return 0;
	}
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS) {
		set_pending("podnet: cannot get the job/step id");
		return 0;
	}
	if (step_id == SLURM_EXTERN_CONT)
		extern_step_up(sp, job_id);
	else
		step_join(sp, job_id, step_id);
	/* on the host network, srun may be in a pod (see stepd_cgroup_enter) */
	if (!joined && step_id != SLURM_EXTERN_CONT &&
	    step_id != SLURM_BATCH_SCRIPT)
		stepd_cgroup_enter(job_id, step_id);
	/* Never fail here: a failing batch step drains the node and requeues
	 * the job, and srun only prints "Plugin initialization failed".
	 * Errors are reported in task_init_privileged, where the task's
	 * stderr reaches the user. */
	if (pending_error[0])
		slurm_error("%s", pending_error);
	return 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	int task = -1;

	(void) ac;
	(void) av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	if (in_stepd_cgroup()) {
		/* a task there would reach pods from the host network */
		slurm_error("podnet: task in cgroup " PN_STEPD_CGROUP
			    " (slurmstepd did not leave it); not started");
		return -1;
	}
	if (opt_out)
		return 0;
	(void) spank_get_item(sp, S_TASK_ID, &task);
	if (pending_error[0]) {
		if (cfg.policy == POLICY_WARN) {
			if (task == 0)
				slurm_error("%s (warning: running on the host "
					    "network)", pending_error);
			return 0;
		}
		slurm_error("%s", pending_error);
		return -1;
	}
	if (joined && !in_pod()) {
		slurm_error("podnet: task is not in the network pod %s",
			    pod_name);
		return cfg.policy == POLICY_WARN ? 0 : -1;
	}
	if (pidns_fd >= 0 && !in_pod_pidns()) {
		slurm_error("podnet: task is not in the PID namespace of pod %s%s",
			    pod_name, pid_native ? "" :
			    " (Slurm's namespace/linux without podnet's extern "
			    "step adopting it? see docs/agent.md)");
		return cfg.policy == POLICY_WARN ? 0 : -1;
	}
	if (joined) {
		char why[256];

		/* names resolve with the pod's search path (job, user, admin) */
		if (pn_enter_pod_resolver(pod_name, why, sizeof(why)) < 0) {
			if (task == 0)
				slurm_error("podnet: %s (the task keeps the "
					    "node's resolv.conf)", why);
		} else if (pidns_fd >= 0 &&
			   pn_mount_pod_proc(why, sizeof(why)) < 0) {
			slurm_error("podnet: %s", why);
			return cfg.policy == POLICY_WARN ? 0 : -1;
		}
	}
	return 0;
}

/*
 * In the task, as the user, before Slurm runs the task prologs and execs the
 * task: with an image, the task's program becomes podnet-image-exec, which
 * execs `apptainer exec IMAGE PROGRAM ARGS` (podnet_image_exec.c). Slurm
 * still runs the prologs, sets the limits and execs with the job's
 * environment: the task process (its pid, cgroup, signals, exit status)
 * becomes the container's. A missing or unreadable image fails the task
 * here, with its path and the reason in the job's output. The batch script
 * and salloc's interactive step run in the pod without the image: they call
 * srun, which needs the node's Slurm and munge; their srun steps inherit the
 * option (Slurm passes sbatch's SPANK options on to them).
 */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	const char *image = user_image[0] ? user_image : cfg.image;
	uint32_t step_id = 0;
	struct stat st;
	char **argv = NULL, *exe;
	int argc = 0;

	(void) ac;
	(void) av;
	if (spank_context() != S_CTX_REMOTE || !image[0] ||
	    !strcmp(image, "none"))
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS ||
	    step_id == SLURM_BATCH_SCRIPT || step_id == SLURM_INTERACTIVE_STEP ||
	    step_id == SLURM_EXTERN_CONT)
		return 0;
	if (stat(image, &st) < 0 ||
	    access(image, S_ISDIR(st.st_mode) ? R_OK | X_OK : R_OK) < 0) {
		slurm_error("podnet: --podnet-image=%s: %s", image,
			    strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
		slurm_error("podnet: --podnet-image=%s: not a SIF file or an "
			    "image directory", image);
		return -1;
	}
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS ||
	    argc < 1 || !argv || !argv[0]) {
		slurm_error("podnet: --podnet-image: the task has no program");
		return -1;
	}
	exe = strdup(cfg.image_exec);
	if (!exe ||
	    spank_setenv(sp, "PODNET_IMAGE", image, 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "PODNET_IMAGE_ARGV0", argv[0], 1) !=
		    ESPANK_SUCCESS ||
	    spank_setenv(sp, "PODNET_APPTAINER", cfg.apptainer, 1) !=
		    ESPANK_SUCCESS) {
		slurm_error("podnet: --podnet-image: cannot set up the task");
		free(exe);
		return -1;
	}
	argv[0] = exe; /* this task's copy of the step's argv */
	return 0;
}

/*
 * slurmstepd's main thread, as the user (euid), right before it forks the
 * tasks: from here its children are born in the pod's PID namespace.
 * setns() needs CAP_SYS_ADMIN: the saved uid is root, so the effective uid
 * goes back to root for the call only.
 */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	uid_t euid = geteuid();
	int rc, err;

	(void) sp;
	(void) ac;
	(void) av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	if (stepd_cgroup_leave() < 0)
		return -1;
	if (pidns_fd < 0 || pid_moved || pid_native)
		return 0;
	if (euid != 0 && seteuid(0) < 0) {
		set_pending("podnet: cannot enter the pod's PID namespace: "
			    "seteuid: %s", strerror(errno));
		return 0;
	}
	rc = setns(pidns_fd, CLONE_NEWPID);
	err = errno;
	if (euid != 0 && seteuid(euid) < 0) {
		slurm_error("podnet: seteuid(%u): %s", (unsigned) euid,
			    strerror(errno));
		return -1; /* never go on as root */
	}
	if (rc < 0) {
		set_pending("podnet: cannot enter the pod's PID namespace: %s",
			    strerror(err));
		return 0;
	}
	pid_moved = 1;
	return 0;
}

/* In slurmstepd (root) once every task is forked: back to its own PID
 * namespace, so the threads it starts later can be created. */
int slurm_spank_task_post_fork(spank_t sp, int ac, char **av)
{
	(void) sp;
	(void) ac;
	(void) av;
	if (spank_context() != S_CTX_REMOTE || !pid_moved)
		return 0;
	if (setns(host_pidns_fd, CLONE_NEWPID) < 0) {
		slurm_error("podnet: setns back to slurmstepd's PID "
			    "namespace: %s", strerror(errno));
		return -1;
	}
	pid_moved = 0;
	return 0;
}

static void release(uint32_t job_id)
{
	pn_reply_t rep;
	char msg[600] = "";
	int rc;

	rc = simple_call("job_down", job_id,
			 mono_ms() + cfg.timeout_s * 1000LL, &rep, msg,
			 sizeof(msg));
	if (rc == PN_CALL_OK && (rep.ok || !strcmp(rep.err_code, "ENOENT")))
		return;
	if (rc == PN_CALL_OK)
		slurm_error("podnet: job_down %u: %s (%s)", job_id,
			    rep.err_msg, rep.err_code);
	else
		slurm_error("podnet: job_down %u: %s", job_id, msg);
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0, step_id = 0;

	(void) ac;
	(void) av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS)
		return 0;
	if (step_id == SLURM_EXTERN_CONT) {
		release(job_id);
		opt_out_clear(job_id);
	}
	return 0;
}

int slurm_spank_job_prolog(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0;
	char *arg = NULL;

	/* never fail: a failing prolog drains the node. slurm_spank_init is
	 * not called in this context: the plugstack arguments are read here */
	if (parse_args(ac, av) < 0 || !cfg.allow_opt_out ||
	    spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS || !job_id)
		return 0;
	if (spank_option_getopt(sp, &podnet_option, &arg) == ESPANK_SUCCESS &&
	    arg && !strcmp(arg, "no"))
		opt_out_mark(job_id);
	return 0;
}

int slurm_spank_job_epilog(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0;

	/* never fail: a failing epilog drains the node (arguments: see
	 * slurm_spank_job_prolog; the defaults serve if they are bad) */
	(void) parse_args(ac, av);
	if (spank_get_item(sp, S_JOB_ID, &job_id) == ESPANK_SUCCESS && job_id) {
		release(job_id);
		opt_out_clear(job_id);
	}
	return 0;
}
