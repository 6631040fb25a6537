/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_json.c - see podnet_json.h: the JSON string escaper, the request
 * builder and the reply parser (pure functions over caller buffers; no I/O).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "podnet_json.h"
#include "podnet_util.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#define PN_MAX_DEPTH 32

/* ======================================================================= */
/* JSON string escaping                                                     */
/* ======================================================================= */

long pn_json_escape(char *out, size_t outsz, const char *in, size_t inlen)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *s = (const unsigned char *) in;
	size_t i = 0, o = 0;

	if (!out || !outsz || (!in && inlen))
		return -1;
	while (i < inlen) {
		unsigned char c = s[i];
		char tmp[8];
		size_t tl = 0, seq = 1;
		const char *src = tmp;

		if (c == '"' || c == '\\') {
			tmp[0] = '\\';
			tmp[1] = (char) c;
			tl = 2;
		} else if (c == '\n') {
			memcpy(tmp, "\\n", 2);
			tl = 2;
		} else if (c == '\r') {
			memcpy(tmp, "\\r", 2);
			tl = 2;
		} else if (c == '\t') {
			memcpy(tmp, "\\t", 2);
			tl = 2;
		} else if (c == 0) {
			memcpy(tmp, "\\ufffd", 6);
			tl = 6;
		} else if (c < 0x20 || c == 0x7f) {
			memcpy(tmp, "\\u00", 4);
			tmp[4] = hex[c >> 4];
			tmp[5] = hex[c & 0xf];
			tl = 6;
		} else if (c < 0x80) {
			tmp[0] = (char) c;
			tl = 1;
		} else {
			seq = pn_utf8_len(s + i, inlen - i);
			if (seq) {
				src = (const char *) (s + i);
				tl = seq;
			} else {
				memcpy(tmp, "\\ufffd", 6);
				tl = 6;
				seq = 1;
			}
		}
		if (o + tl + 1 > outsz)
			return -1;
		memcpy(out + o, src, tl);
		o += tl;
		i += seq;
	}
	out[o] = '\0';
	return (long) o;
}

/* ======================================================================= */
/* Request builder                                                          */
/* ======================================================================= */

static void req_raw(pn_req_t *r, const char *s, size_t n)
{
	if (r->err)
		return;
	if (r->len + n + 1 > r->cap) {
		r->err = PN_REQ_E_TOOBIG;
		return;
	}
	memcpy(r->buf + r->len, s, n);
	r->len += n;
	r->buf[r->len] = '\0';
}

static void req_string(pn_req_t *r, const char *val)
{
	long n;

	if (r->err)
		return;
	if (!val) {
		r->err = PN_REQ_E_USAGE;
		return;
	}
	req_raw(r, "\"", 1);
	if (r->err)
		return;
	n = pn_json_escape(r->buf + r->len, r->cap - r->len, val,
			   strlen(val));
	if (n < 0) {
		r->err = PN_REQ_E_TOOBIG;
		return;
	}
	r->len += (size_t) n;
	req_raw(r, "\"", 1);
}

static void req_key(pn_req_t *r, const char *key)
{
	if (r->err)
		return;
	if (!key || r->in_list) {
		r->err = PN_REQ_E_USAGE;
		return;
	}
	req_raw(r, ",", 1);
	req_string(r, key);
	req_raw(r, ":", 1);
}

void pn_req_begin(pn_req_t *r, char *buf, size_t cap, const char *op)
{
	memset(r, 0, sizeof(*r));
	r->buf = buf;
	r->cap = cap;
	if (!buf || cap < 2 || !op) {
		r->err = PN_REQ_E_USAGE;
		return;
	}
	buf[0] = '\0';
	req_raw(r, "{\"v\":1,\"op\":", 12);
	req_string(r, op);
}

void pn_req_str(pn_req_t *r, const char *key, const char *val)
{
	req_key(r, key);
	req_string(r, val);
}

void pn_req_int(pn_req_t *r, const char *key, long long val)
{
	char num[32];
	int n;

	req_key(r, key);
	n = snprintf(num, sizeof(num), "%lld", val);
	if (n < 0 || (size_t) n >= sizeof(num)) {
		if (!r->err)
			r->err = PN_REQ_E_USAGE;
		return;
	}
	req_raw(r, num, (size_t) n);
}

void pn_req_list_begin(pn_req_t *r, const char *key)
{
	req_key(r, key);
	req_raw(r, "[", 1);
	r->in_list = 1;
	r->list_n = 0;
}

void pn_req_list_str(pn_req_t *r, const char *val)
{
	if (r->err)
		return;
	if (!r->in_list) {
		r->err = PN_REQ_E_USAGE;
		return;
	}
	if (r->list_n++)
		req_raw(r, ",", 1);
	req_string(r, val);
}

void pn_req_list_end(pn_req_t *r)
{
	if (r->err)
		return;
	if (!r->in_list) {
		r->err = PN_REQ_E_USAGE;
		return;
	}
	r->in_list = 0;
	req_raw(r, "]", 1);
}

long pn_req_end(pn_req_t *r)
{
	if (!r->err && r->in_list)
		r->err = PN_REQ_E_USAGE;
	req_raw(r, "}\n", 2);
	if (r->err)
		return -1;
	if (r->len > PN_MAX_LINE) {
		r->err = PN_REQ_E_TOOBIG;
		return -1;
	}
	return (long) r->len;
}

/* ======================================================================= */
/* Reply parser                                                             */
/* ======================================================================= */

enum jctx { J_OTHER, J_TOP, J_ERROR, J_POD };

typedef struct {
	const char *start;
	const char *p;
	const char *end;
	int depth;
	pn_reply_t *out;
	char *why;
	size_t whysz;
	int failed;
	/* members seen (duplicates are malformed) */
	int seen_v, seen_ok, seen_error, seen_pod, seen_released;
	int seen_code, seen_msg;
	int seen_name, seen_netns, seen_ip, seen_user, seen_uid, seen_fqdn,
	    seen_domain;
	int seen_cni_out, seen_cni_rc;
} jp_t;

static int jfail_at(jp_t *j, const char *what)
{
	if (!j->failed) {
		j->failed = 1;
		pn_fmt(j->why, j->whysz, "%s (byte %ld)", what,
		       (long) (j->p - j->start));
	}
	return -1;
}

static void jws(jp_t *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' ||
				 *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

static int read_hex4(jp_t *j, unsigned long *cp)
{
	int i, v;

	if (j->end - j->p < 4)
		return jfail_at(j, "truncated \\u escape");
	*cp = 0;
	for (i = 0; i < 4; i++) {
		v = pn_hexval(j->p[i]);
		if (v < 0)
			return jfail_at(j, "bad \\u escape");
		*cp = (*cp << 4) | (unsigned long) v;
	}
	j->p += 4;
	return 0;
}

/*
 * Parses a JSON string at j->p (which must be '"'). If o->dst is set the
 * decoded text is stored there; embedded NULs are refused in that case.
 */
static int jstring(jp_t *j, pn_buf_t *o)
{
	if (j->p >= j->end || *j->p != '"')
		return jfail_at(j, "expected a string");
	j->p++;
	while (j->p < j->end) {
		unsigned char c = (unsigned char) *j->p;

		if (c == '"') {
			j->p++;
			return 0;
		}
		if (c < 0x20)
			return jfail_at(j, "control character in string");
		if (c == '\\') {
			char b[4];
			unsigned long cp, lo;

			if (j->end - j->p < 2)
				return jfail_at(j, "truncated escape");
			j->p++;
			switch (*j->p) {
			case '"': pn_buf_put(o, "\"", 1); j->p++; break;
			case '\\': pn_buf_put(o, "\\", 1); j->p++; break;
			case '/': pn_buf_put(o, "/", 1); j->p++; break;
			case 'b': pn_buf_put(o, "\b", 1); j->p++; break;
			case 'f': pn_buf_put(o, "\f", 1); j->p++; break;
			case 'n': pn_buf_put(o, "\n", 1); j->p++; break;
			case 'r': pn_buf_put(o, "\r", 1); j->p++; break;
			case 't': pn_buf_put(o, "\t", 1); j->p++; break;
			case 'u':
				j->p++;
				if (read_hex4(j, &cp) < 0)
					return -1;
				if (cp >= 0xdc00 && cp <= 0xdfff)
					return jfail_at(j, "lone low surrogate");
				if (cp >= 0xd800 && cp <= 0xdbff) {
					if (j->end - j->p < 6 || j->p[0] != '\\' ||
					    j->p[1] != 'u')
						return jfail_at(j, "lone high surrogate");
					j->p += 2;
					if (read_hex4(j, &lo) < 0)
						return -1;
					if (lo < 0xdc00 || lo > 0xdfff)
						return jfail_at(j, "bad surrogate pair");
					cp = 0x10000 + ((cp - 0xd800) << 10) +
					     (lo - 0xdc00);
				}
				if (cp == 0 && o->dst)
					return jfail_at(j, "NUL character in string");
				pn_buf_put(o, b, pn_utf8_put(cp, b));
				break;
			default:
				return jfail_at(j, "invalid escape");
			}
			continue;
		}
		if (c >= 0x80) {
			size_t n = pn_utf8_len((const unsigned char *) j->p,
						(size_t) (j->end - j->p));
			if (!n)
				return jfail_at(j, "invalid UTF-8 in string");
			pn_buf_put(o, j->p, n);
			j->p += n;
			continue;
		}
		pn_buf_put(o, j->p, 1);
		j->p++;
	}
	return jfail_at(j, "unterminated string");
}

/* Parses a JSON number; if ival is set, it must be an integer that fits. */
static int jnumber(jp_t *j, long long *ival)
{
	const char *s = j->p;
	int neg = 0, is_int = 1, overflow = 0;
	unsigned long long acc = 0;

	if (j->p < j->end && *j->p == '-') {
		neg = 1;
		j->p++;
	}
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return jfail_at(j, "bad number");
	if (*j->p == '0') {
		j->p++;
	} else {
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
			unsigned d = (unsigned) (*j->p - '0');
			if (acc > (ULLONG_MAX - d) / 10)
				overflow = 1;
			else
				acc = acc * 10 + d;
			j->p++;
		}
	}
	if (j->p < j->end && *j->p == '.') {
		is_int = 0;
		j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return jfail_at(j, "bad number");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		is_int = 0;
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return jfail_at(j, "bad number");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (!ival)
		return 0;
	if (!is_int) {
		j->p = s;
		return jfail_at(j, "expected an integer");
	}
	if (overflow || (!neg && acc > (unsigned long long) LLONG_MAX) ||
	    (neg && acc > (unsigned long long) LLONG_MAX + 1ULL)) {
		j->p = s;
		return jfail_at(j, "integer out of range");
	}
	if (neg)
		*ival = (acc == (unsigned long long) LLONG_MAX + 1ULL)
				? LLONG_MIN
				: -(long long) acc;
	else
		*ival = (long long) acc;
	return 0;
}

static int jliteral(jp_t *j, const char *lit)
{
	size_t n = strlen(lit);

	if ((size_t) (j->end - j->p) < n || memcmp(j->p, lit, n) != 0)
		return jfail_at(j, "unexpected token");
	j->p += n;
	return 0;
}

static int jvalue(jp_t *j, enum jctx ctx);

/* Reads a boolean value; stores 1/0 in *b. */
static int jbool(jp_t *j, int *b)
{
	if (j->p < j->end && *j->p == 't') {
		*b = 1;
		return jliteral(j, "true");
	}
	if (j->p < j->end && *j->p == 'f') {
		*b = 0;
		return jliteral(j, "false");
	}
	return jfail_at(j, "expected true or false");
}

static int jstr_field(jp_t *j, int *seen, char *dst, size_t dstsz,
		      const char *name, int may_truncate)
{
	pn_buf_t o = { dst, dstsz, 0, 0 };
	char msg[96];

	if ((*seen)++) {
		pn_fmt(msg, sizeof(msg), "duplicate member \"%s\"", name);
		return jfail_at(j, msg);
	}
	if (j->p >= j->end || *j->p != '"') {
		pn_fmt(msg, sizeof(msg), "member \"%s\" is not a string", name);
		return jfail_at(j, msg);
	}
	dst[0] = '\0';
	if (jstring(j, &o) < 0)
		return -1;
	if (o.overflow) {
		if (!may_truncate) {
			pn_fmt(msg, sizeof(msg), "member \"%s\" is too long",
			       name);
			return jfail_at(j, msg);
		}
		/* cut at a UTF-8 boundary and mark the cut */
		o.len = dstsz - 4;
		while (o.len > 0 && ((unsigned char) dst[o.len] & 0xc0) == 0x80)
			o.len--;
		memcpy(dst + o.len, "...", 4);
	}
	return 0;
}

static int jint_field(jp_t *j, int *seen, long long *dst, const char *name)
{
	char msg[96];

	if ((*seen)++) {
		pn_fmt(msg, sizeof(msg), "duplicate member \"%s\"", name);
		return jfail_at(j, msg);
	}
	if (j->p >= j->end || (*j->p != '-' && (*j->p < '0' || *j->p > '9'))) {
		pn_fmt(msg, sizeof(msg), "member \"%s\" is not an integer",
		       name);
		return jfail_at(j, msg);
	}
	return jnumber(j, dst);
}

/* Handles one member value of an object in context ctx. */
static int jmember(jp_t *j, enum jctx ctx, const char *key, int key_ok)
{
	pn_reply_t *r = j->out;

	if (!key_ok) /* key too long to be one we know: just skip the value */
		return jvalue(j, J_OTHER);
	switch (ctx) {
	case J_TOP:
		if (!strcmp(key, "v"))
			return jint_field(j, &j->seen_v, &r->v, "v");
		if (!strcmp(key, "ok")) {
			if (j->seen_ok++)
				return jfail_at(j, "duplicate member \"ok\"");
			return jbool(j, &r->ok);
		}
		if (!strcmp(key, "released")) {
			if (j->seen_released++)
				return jfail_at(j, "duplicate member \"released\"");
			return jbool(j, &r->released);
		}
		if (!strcmp(key, "error")) {
			if (j->seen_error++)
				return jfail_at(j, "duplicate member \"error\"");
			if (j->p >= j->end || *j->p != '{')
				return jfail_at(j, "member \"error\" is not an object");
			return jvalue(j, J_ERROR);
		}
		if (!strcmp(key, "cni_out"))
			return jstr_field(j, &j->seen_cni_out, r->cni_out,
					  sizeof(r->cni_out), "cni_out", 0);
		if (!strcmp(key, "cni_rc"))
			return jint_field(j, &j->seen_cni_rc, &r->cni_rc, "cni_rc");
		if (!strcmp(key, "pod")) {
			if (j->seen_pod++)
				return jfail_at(j, "duplicate member \"pod\"");
			if (j->p >= j->end || *j->p != '{')
				return jfail_at(j, "member \"pod\" is not an object");
			return jvalue(j, J_POD);
		}
		break;
	case J_ERROR:
		if (!strcmp(key, "code"))
			return jstr_field(j, &j->seen_code, r->err_code,
					  sizeof(r->err_code), "code", 0);
		if (!strcmp(key, "message"))
			return jstr_field(j, &j->seen_msg, r->err_msg,
					  sizeof(r->err_msg), "message", 1);
		break;
	case J_POD:
		if (!strcmp(key, "name"))
			return jstr_field(j, &j->seen_name, r->pod_name,
					  sizeof(r->pod_name), "name", 0);
		if (!strcmp(key, "netns"))
			return jstr_field(j, &j->seen_netns, r->pod_netns,
					  sizeof(r->pod_netns), "netns", 0);
		if (!strcmp(key, "ip"))
			return jstr_field(j, &j->seen_ip, r->pod_ip,
					  sizeof(r->pod_ip), "ip", 0);
		if (!strcmp(key, "user"))
			return jstr_field(j, &j->seen_user, r->pod_user,
					  sizeof(r->pod_user), "user", 0);
		if (!strcmp(key, "uid"))
			return jint_field(j, &j->seen_uid, &r->pod_uid, "uid");
		if (!strcmp(key, "fqdn"))
			return jstr_field(j, &j->seen_fqdn, r->pod_fqdn,
					  sizeof(r->pod_fqdn), "fqdn", 0);
		if (!strcmp(key, "domain"))
			return jstr_field(j, &j->seen_domain, r->pod_domain,
					  sizeof(r->pod_domain), "domain", 0);
		break;
	case J_OTHER:
		break;
	}
	return jvalue(j, J_OTHER);
}

static int jobject(jp_t *j, enum jctx ctx)
{
	j->p++; /* '{' */
	jws(j);
	if (j->p < j->end && *j->p == '}') {
		j->p++;
		return 0;
	}
	for (;;) {
		char key[32];
		pn_buf_t o = { key, sizeof(key), 0, 0 };

		key[0] = '\0'; /* jstring writes nothing for "" */
		jws(j);
		if (jstring(j, &o) < 0)
			return -1;
		jws(j);
		if (j->p >= j->end || *j->p != ':')
			return jfail_at(j, "expected ':'");
		j->p++;
		jws(j);
		if (jmember(j, ctx, key, !o.overflow) < 0)
			return -1;
		jws(j);
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		if (j->p < j->end && *j->p == '}') {
			j->p++;
			return 0;
		}
		return jfail_at(j, "expected ',' or '}'");
	}
}

static int jarray(jp_t *j)
{
	j->p++; /* '[' */
	jws(j);
	if (j->p < j->end && *j->p == ']') {
		j->p++;
		return 0;
	}
	for (;;) {
		jws(j);
		if (jvalue(j, J_OTHER) < 0)
			return -1;
		jws(j);
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		if (j->p < j->end && *j->p == ']') {
			j->p++;
			return 0;
		}
		return jfail_at(j, "expected ',' or ']'");
	}
}

static int jvalue(jp_t *j, enum jctx ctx)
{
	int rc, b;
	pn_buf_t none = { NULL, 0, 0, 0 };

	jws(j);
	if (j->p >= j->end)
		return jfail_at(j, "unexpected end of reply");
	switch (*j->p) {
	case '{':
		if (++j->depth > PN_MAX_DEPTH)
			return jfail_at(j, "nesting too deep");
		rc = jobject(j, ctx);
		j->depth--;
		return rc;
	case '[':
		if (++j->depth > PN_MAX_DEPTH)
			return jfail_at(j, "nesting too deep");
		rc = jarray(j);
		j->depth--;
		return rc;
	case '"':
		return jstring(j, &none);
	case 't':
	case 'f':
		return jbool(j, &b);
	case 'n':
		return jliteral(j, "null");
	default:
		return jnumber(j, NULL);
	}
}

int pn_parse_reply(const char *line, size_t len, pn_reply_t *out, char *why,
		   size_t whysz)
{
	jp_t j;

	memset(out, 0, sizeof(*out));
	out->pod_uid = -1;
	out->cni_rc = -1;
	out->released = -1;
	out->v = -1;
	if (why && whysz)
		why[0] = '\0';
	if (!line) {
		pn_fmt(why, whysz, "no reply");
		return -1;
	}
	if (len > PN_MAX_LINE) {
		pn_fmt(why, whysz, "reply longer than %d bytes", PN_MAX_LINE);
		return -1;
	}
	memset(&j, 0, sizeof(j));
	j.p = line;
	j.end = line + len;
	j.out = out;
	j.why = why;
	j.whysz = whysz;
	j.start = line;

	if (memchr(line, '\0', len)) {
		pn_fmt(why, whysz, "NUL byte in reply");
		return -1;
	}
	jws(&j);
	if (j.p >= j.end || *j.p != '{') {
		jfail_at(&j, "reply is not a JSON object");
		return -1;
	}
	if (jvalue(&j, J_TOP) < 0)
		return -1;
	jws(&j);
	if (j.p != j.end) {
		jfail_at(&j, "trailing data after the reply object");
		return -1;
	}
	if (!j.seen_v) {
		pn_fmt(why, whysz, "reply has no \"v\"");
		return -1;
	}
	if (out->v != PN_API_VERSION) {
		pn_fmt(why, whysz, "unsupported reply version %lld", out->v);
		return -1;
	}
	if (!j.seen_ok) {
		pn_fmt(why, whysz, "reply has no \"ok\"");
		return -1;
	}
	if (!out->ok && (!j.seen_error || !j.seen_code)) {
		pn_fmt(why, whysz, "error reply without error.code");
		return -1;
	}
	if (!out->ok && !j.seen_msg)
		pn_fmt(out->err_msg, sizeof(out->err_msg), "%s",
		       out->err_code);
	return 0;
}
