/*
 * podnet_client.h - tiny client for the podnetd UNIX-socket API (docs/api.md).
 *
 * Shared by the SPANK plugin (roles/spank) and the setuid session helper
 * (roles/sshd_hooks builds it from roles/spank/files). No global state, no
 * signals, no threads; the only allocation is pn_call()'s bounded reply
 * buffer, freed before it returns. Safe inside slurmstepd and in a setuid
 * program.
 *
 * Wire format: one JSON object per line each way, at most PN_MAX_LINE bytes.
 */
#ifndef PODNET_CLIENT_H
#define PODNET_CLIENT_H

#include <stddef.h>

#define PN_API_VERSION 1
#define PN_MAX_LINE 65536 /* docs/api.md: requests and replies <= 64 KiB */
#define PN_DEFAULT_SOCKET "/run/podnet/podnetd.sock"
#define PN_NETNS_DIR "/run/netns/"

/* ---- request builder ------------------------------------------------------
 * pn_req_begin() writes {"v":1,"op":"<op>"; the add functions append members;
 * pn_req_end() closes the object and appends '\n'. Any overflow or invalid
 * argument sets r->err and every later call is a no-op, so callers check once,
 * at pn_req_end().
 */
typedef struct {
	char *buf;
	size_t cap;
	size_t len;
	int err;     /* 0 ok, else PN_REQ_E_* */
	int in_list; /* inside a pn_req_list_begin()/end() pair */
	int list_n;  /* items in the current list */
} pn_req_t;

enum { PN_REQ_OK = 0, PN_REQ_E_TOOBIG = 1, PN_REQ_E_USAGE = 2 };

void pn_req_begin(pn_req_t *r, char *buf, size_t cap, const char *op);
void pn_req_str(pn_req_t *r, const char *key, const char *val);
void pn_req_int(pn_req_t *r, const char *key, long long val);
void pn_req_list_begin(pn_req_t *r, const char *key);
void pn_req_list_str(pn_req_t *r, const char *val);
void pn_req_list_end(pn_req_t *r);
/* returns the line length (including '\n'), or -1 (see r->err) */
long pn_req_end(pn_req_t *r);

/*
 * JSON string escaper. Writes the escaped form of in[0..inlen) (without the
 * surrounding quotes) plus a NUL into out. Quotes, backslashes and control
 * characters are escaped; valid UTF-8 passes through; invalid UTF-8 bytes and
 * NUL become U+FFFD. Returns the output length, or -1 if out is too small.
 */
long pn_json_escape(char *out, size_t outsz, const char *in, size_t inlen);

/* ---- reply parser ----------------------------------------------------------
 * Validates the whole line as one JSON object (strict RFC 8259 grammar, depth
 * and size bounded) and extracts the members the C clients need.
 */
typedef struct {
	int ok;              /* value of "ok" (1 true, 0 false) */
	long long v;         /* value of "v" */
	char err_code[32];   /* error.code */
	char err_msg[512];   /* error.message (truncated if longer) */
	char pod_name[64];   /* pod.name */
	char pod_netns[256]; /* pod.netns */
	char pod_ip[64];     /* pod.ip */
	char pod_user[64];   /* pod.user */
	long long pod_uid;   /* pod.uid, -1 if absent */
	int released;        /* "released": 1 true, 0 false, -1 absent */
} pn_reply_t;

/*
 * Returns 0 when line[0..len) is a well-formed version-1 reply with a boolean
 * "ok" (and, when ok is false, an "error" object with string code and
 * message). Returns -1 otherwise, with a reason in why.
 * A trailing "\n" (or "\r\n") is accepted. Strings at the extracted paths
 * that do not fit their field make the reply malformed (never truncated
 * silently), except error.message, which is shortened with "...".
 */
int pn_parse_reply(const char *line, size_t len, pn_reply_t *out, char *why,
		   size_t whysz);

/* ---- transport --------------------------------------------------------------
 * pn_call(): connect to the UNIX socket, send one request line, read one reply
 * line, parse it. timeout_ms bounds the whole exchange (connect + write +
 * read). The socket is close-on-exec and closed before returning.
 */
enum {
	PN_CALL_OK = 0,         /* reply parsed: look at rep->ok */
	PN_CALL_E_CONNECT = 1,  /* socket missing / refused: daemon not running */
	PN_CALL_E_TIMEOUT = 2,  /* no complete reply in time */
	PN_CALL_E_IO = 3,       /* connection reset, short reply, EOF */
	PN_CALL_E_PROTO = 4,    /* reply is not valid (see msg) */
	PN_CALL_E_USAGE = 5,    /* bad arguments (path too long, ...) */
};

int pn_call(const char *sock_path, const char *req, size_t reqlen,
	    pn_reply_t *rep, int timeout_ms, char *msg, size_t msgsz);

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

/* Parses a base-10 unsigned integer in [min, max]; 0 ok, -1 bad. */
int pn_parse_uint(const char *s, unsigned long long min, unsigned long long max,
		  unsigned long long *out);

#endif /* PODNET_CLIENT_H */
