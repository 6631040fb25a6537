/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_session.h - what pam_podnet.so needs besides the podnetd client:
 * /etc/podnet/session.conf, the admin-group check, and the podnetd request
 * for "this user's pod on this node" (login pod or job pod).
 *
 * Configuration: /etc/podnet/session.conf (root-owned, not writable by
 * others), lines "key=value", '#' comments:
 *   mode=login|compute       which request to make (required)
 *   socket=PATH              podnetd socket (/run/podnet/podnetd.sock)
 *   admin_group=NAME         never captured (podnet-admins)
 *   on_error=refuse|host     podnetd unreachable/failing: refuse the login
 *                            (default) or let it run on the host network
 *   timeout=SECONDS          bound for podnetd's answer, 1..3600 (30)
 * Unknown keys, bad values and lines without '=' are errors.
 */
#ifndef PODNET_SESSION_H
#define PODNET_SESSION_H

#include <pwd.h>
#include <stddef.h>

#include "podnet_json.h"
#include "podnet_transport.h"

#ifndef PN_SESSION_CONF
#define PN_SESSION_CONF "/etc/podnet/session.conf"
#endif
#define PN_DEFAULT_ADMIN_GROUP "podnet-admins"

enum mode { MODE_UNSET, MODE_LOGIN, MODE_COMPUTE };
enum on_error { ON_ERROR_REFUSE, ON_ERROR_HOST };

struct session_conf {
	enum mode mode;
	enum on_error on_error;
	char socket[108];
	char admin_group[64];
	int timeout_s;
};

void conf_defaults(struct session_conf *c);
/* Parses the text of the file; 0, or -1 with the line and problem in why.
 * Keys before a bad line are applied (admin_group stays usable). */
int conf_parse(const char *text, struct session_conf *c, char *why,
	       size_t whysz);
/* Reads path (a regular file owned by root, not group/other-writable). */
int conf_load(const char *path, struct session_conf *c, char *why,
	      size_t whysz);

/* Is the user in group name (primary or supplementary)? Unknown group: no. */
int user_in_group(const struct passwd *pw, const char *name);

/*
 * The request for this node's mode: login_acquire, or join of the user's job
 * (job_env: SLURM_JOB_ID, parsed strictly, or NULL). uid > 0 names the user
 * (root asking for someone), pid > 0 is the process that holds a login-pod
 * session reference. Returns the line length or -1 (reason in why).
 */
long build_request_for(const struct session_conf *c, const char *job_env,
		       long long uid, long long pid, char *buf, size_t sz,
		       char *why, size_t whysz);
/* build_request_for() for the caller itself (uid and pid from the socket) */
long build_request(const struct session_conf *c, const char *job_env,
		   char *buf, size_t sz, char *why, size_t whysz);

enum outcome {
	OUT_POD,    /* rep has the pod */
	OUT_REFUSE, /* no pod for this user: always refuse */
	OUT_ERROR,  /* podnetd unreachable/failing: on_error decides */
};

/* Asks podnetd (see build_request_for); fills rep and a message for the
 * user. When uid > 0 names the user, OUT_POD also means the pod is that
 * user's (pod.uid present and equal): a pod of anyone else is OUT_REFUSE. */
enum outcome ask_podnetd_for(const struct session_conf *c, const char *job_env,
			     long long uid, long long pid, pn_reply_t *rep,
			     char *msg, size_t msgsz);
enum outcome ask_podnetd(const struct session_conf *c, const char *job_env,
			 pn_reply_t *rep, char *msg, size_t msgsz);

#endif /* PODNET_SESSION_H */
