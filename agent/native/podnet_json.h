/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_json.h - the podnetd wire format (docs/api.md) on the client side:
 * the JSON string escaper, the request builder and the reply parser.
 *
 * Part of the podnetd client shared by the SPANK plugin (podnet_spank.c) and
 * the PAM session module (pam_podnet.c); podnet_transport.h carries the lines,
 * podnet_pod.h enters the pod a reply names, podnet_util.h holds the UTF-8
 * and buffer helpers underneath. Pure functions over caller buffers: no I/O,
 * no allocation, no global state. Safe inside slurmstepd and in a privileged
 * process.
 *
 * Wire format: one JSON object per line each way, at most PN_MAX_LINE bytes.
 */
#ifndef PODNET_JSON_H
#define PODNET_JSON_H

#include <stddef.h>

#define PN_API_VERSION 1
#define PN_MAX_LINE 65536 /* docs/api.md: requests and replies <= 64 KiB */

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
	char pod_fqdn[256];  /* pod.fqdn: its unique DNS name (job: by job id) */
	char pod_domain[256]; /* pod.domain: a job pod's job domain (by job id) */
	int released;        /* "released": 1 true, 0 false, -1 absent */
	/* op "cni" (the podnet CNI plugin, podnet_cni.c): what the plugin prints
	 * and its exit status; cni_rc -1 if absent */
	char cni_out[8192];
	long long cni_rc;
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

#endif /* PODNET_JSON_H */
