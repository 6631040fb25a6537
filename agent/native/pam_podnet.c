/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pam_podnet.so - PAM module that puts an SSH session in the user's pod.
 *
 *   account  required  pam_podnet.so   (compute nodes: "no job on this node"
 *                                       as a clear message, before a session)
 *   session  required  pam_podnet.so   (enters the pod)
 *
 * sshd (OpenSSH with UsePAM yes) opens the PAM session in its privileged
 * per-connection monitor ("sshd-session: USER [priv]"), as root, after
 * authentication and BEFORE it forks the unprivileged child that runs
 * forwardings, ~/.ssh/rc, the shell, commands and subsystems (measured: see
 * docs/roles/sshd_hooks.md). setns(CLONE_NEWNET) here therefore moves all of
 * them into the pod before any user code runs.
 *
 * Session stage, for every user but root and members of admin_group:
 *   1. asks podnetd, as root, for the user's pod: login_acquire with the
 *      user's uid and this process's pid (the monitor lives as long as the
 *      connection: podnetd holds the login pod while it is alive) on login
 *      nodes; join of the user's job (SLURM_JOB_ID from the PAM environment,
 *      e.g. set by pam_slurm_adopt, else the user's most recent job pod on
 *      the node) on compute nodes;
 *   2. checks the pod is the user's (ask_podnetd_for, podnet_session.c),
 *      opens its netns file (pn_open_netns),
 *      setns(CLONE_NEWNET), then enters the pod's resolver (and what else
 *      pn_enter_pod_resolver sets up) in a private mount namespace.
 * No job, or a pod that is not the user's: PAM_SESSION_ERR (sshd closes the
 * connection). podnetd unreachable or failing: on_error=refuse (default,
 * PAM_SESSION_ERR) or host (PAM_SUCCESS, the session stays on the host).
 *
 * Account stage (compute mode only): the same join, without entering, so
 * that a user without a job is refused with a message sshd shows as a banner.
 *
 * root and admins: PAM_IGNORE, even when the configuration is broken (the
 * PAM lines also skip this module for them). No module arguments. No shell,
 * no environment read except the PAM environment's SLURM_JOB_ID.
 * Configuration: /etc/podnet/session.conf (podnet_session.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <pwd.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#define PAM_SM_ACCOUNT
#define PAM_SM_SESSION
#include <security/pam_ext.h>
#include <security/pam_modules.h>

#include "podnet_pod.h"
#include "podnet_session.h"

#define PN_EXPORT __attribute__((visibility("default")))

struct ctx {
	struct session_conf conf;
	struct passwd pw;
	char pwbuf[16384];
	int conf_ok;
	char why[512];
};

/*
 * Common start: the user, the configuration, the admin exemption.
 * Returns PAM_SUCCESS to go on, PAM_IGNORE for root/admins, or an error.
 */
static int begin(pam_handle_t *pamh, int argc, struct ctx *x)
{
	const char *user = NULL;
	struct passwd *res = NULL;

	if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || !user || !*user)
		return PAM_USER_UNKNOWN;
	if (getpwnam_r(user, &x->pw, x->pwbuf, sizeof(x->pwbuf), &res) != 0 ||
	    !res)
		return PAM_USER_UNKNOWN;
	if (x->pw.pw_uid == 0)
		return PAM_IGNORE;
	conf_defaults(&x->conf);
	x->why[0] = '\0';
	x->conf_ok = conf_load(PN_SESSION_CONF, &x->conf, x->why,
			       sizeof(x->why)) == 0;
	/* admins are never captured, even with a broken configuration */
	if (user_in_group(&x->pw, x->conf.admin_group))
		return PAM_IGNORE;
	if (!x->conf_ok) {
		pam_syslog(pamh, LOG_ERR, "configuration error: %s", x->why);
		return PAM_SERVICE_ERR;
	}
	if (argc != 0) {
		pam_syslog(pamh, LOG_ERR, "takes no arguments");
		return PAM_SERVICE_ERR;
	}
	if (geteuid() != 0) {
		pam_syslog(pamh, LOG_ERR, "must run as root");
		return PAM_SERVICE_ERR;
	}
	return PAM_SUCCESS;
}

static void tell(pam_handle_t *pamh, const char *msg)
{
	/* sshd shows account-stage messages as a banner; ignore failures */
	(void) pam_error(pamh, "podnet: %s", msg);
}

PN_EXPORT int pam_sm_acct_mgmt(pam_handle_t *pamh, int flags, int argc,
			       const char **argv)
{
	struct ctx x;
	pn_reply_t rep;
	char msg[768] = "";
	enum outcome out;
	int rc;

	(void) flags;
	(void) argv;
	rc = begin(pamh, argc, &x);
	if (rc == PAM_IGNORE)
		return PAM_IGNORE;
	if (rc != PAM_SUCCESS) {
		tell(pamh, "login refused: configuration error (ask your "
			   "administrator)");
		return PAM_PERM_DENIED;
	}
	if (x.conf.mode != MODE_COMPUTE)
		return PAM_IGNORE; /* login pods are made in the session stage */
	/* OUT_POD: the pod is this user's (ask_podnetd_for checks pod.uid) */
	out = ask_podnetd_for(&x.conf, pam_getenv(pamh, "SLURM_JOB_ID"),
			      (long long) x.pw.pw_uid, 0, &rep, msg,
			      sizeof(msg));
	if (out == OUT_POD)
		return PAM_SUCCESS;
	if (out == OUT_ERROR && x.conf.on_error == ON_ERROR_HOST) {
		pam_syslog(pamh, LOG_WARNING, "%s: %s (on_error=host)",
			   x.pw.pw_name, msg);
		return PAM_SUCCESS;
	}
	pam_syslog(pamh, LOG_NOTICE, "%s refused: %s", x.pw.pw_name, msg);
	tell(pamh, msg);
	return PAM_PERM_DENIED;
}

/*
 * The pod's PID namespace for everything this monitor forks from now on (the
 * session's child, then the shell): setns(CLONE_NEWPID) moves only future
 * children, and sshd starts no thread. /proc becomes the pod's (bound from
 * podnet-init's mount). 0 also when the pod has no PID namespace.
 */
static int enter_pidns(pam_handle_t *pamh, const char *pod)
{
	char why[512];
	int fd = pn_open_pidns(pod, why, sizeof(why));

	if (fd == -2)
		return 0;
	if (fd < 0) {
		pam_syslog(pamh, LOG_ERR, "%s: %s", pod, why);
		return -1;
	}
	if (setns(fd, CLONE_NEWPID) < 0) {
		pam_syslog(pamh, LOG_ERR, "%s: setns(pid): %s", pod,
			   strerror(errno));
		close(fd);
		return -1;
	}
	close(fd);
	if (pn_bind_pod_proc(pod, why, sizeof(why)) < 0) {
		pam_syslog(pamh, LOG_ERR, "%s: %s", pod, why);
		return -1;
	}
	return 0;
}

PN_EXPORT int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc,
				  const char **argv)
{
	struct ctx x;
	pn_reply_t rep;
	char msg[768] = "", why[512] = "";
	enum outcome out;
	int rc, fd;

	(void) flags;
	(void) argv;
	rc = begin(pamh, argc, &x);
	if (rc == PAM_IGNORE)
		return PAM_IGNORE;
	if (rc != PAM_SUCCESS)
		return PAM_SESSION_ERR; /* configuration errors always refuse */

	out = ask_podnetd_for(&x.conf,
			      x.conf.mode == MODE_COMPUTE
				      ? pam_getenv(pamh, "SLURM_JOB_ID")
				      : NULL,
			      (long long) x.pw.pw_uid, (long long) getpid(),
			      &rep, msg, sizeof(msg));
	if (out == OUT_POD) {
		fd = pn_open_netns(rep.pod_netns, why, sizeof(why));
		if (fd < 0) {
			snprintf(msg, sizeof(msg), "bad pod from podnetd: %s",
				 why);
			out = OUT_ERROR;
		} else if (setns(fd, CLONE_NEWNET) < 0) {
			snprintf(msg, sizeof(msg), "setns(%s): %s",
				 rep.pod_netns, strerror(errno));
			close(fd);
			out = OUT_ERROR;
		} else {
			close(fd);
			if (pn_enter_pod_resolver(rep.pod_name, why,
						  sizeof(why)) < 0)
				pam_syslog(pamh, LOG_WARNING,
					   "%s: %s (keeping the node's files)",
					   rep.pod_name, why);
			else if (enter_pidns(pamh, rep.pod_name) < 0) {
				snprintf(msg, sizeof(msg), "cannot enter the "
					 "PID namespace of pod %s",
					 rep.pod_name);
				pam_syslog(pamh, LOG_NOTICE, "%s refused: %s",
					   x.pw.pw_name, msg);
				tell(pamh, msg);
				return PAM_SESSION_ERR;
			}
			pam_syslog(pamh, LOG_INFO, "%s: session in pod %s (%s)",
				   x.pw.pw_name, rep.pod_name, rep.pod_ip);
			return PAM_SUCCESS;
		}
	}
	if (out == OUT_ERROR && x.conf.on_error == ON_ERROR_HOST) {
		pam_syslog(pamh, LOG_WARNING, "%s: %s; session on the host "
			   "network (on_error=host)", x.pw.pw_name, msg);
		return PAM_SUCCESS;
	}
	pam_syslog(pamh, LOG_NOTICE, "%s refused: %s", x.pw.pw_name, msg);
	tell(pamh, msg);
	return PAM_SESSION_ERR;
}

PN_EXPORT int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc,
				   const char **argv)
{
	/* podnetd notices the monitor's exit (login pods: pid references) */
	(void) pamh;
	(void) flags;
	(void) argc;
	(void) argv;
	return PAM_SUCCESS;
}
