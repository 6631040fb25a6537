/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_reply.c - fuzz target for pn_parse_reply (podnet_json.c), the code
 * that reads podnetd's answers inside slurmstepd and sshd's monitor.
 * Besides memory and undefined-behaviour errors (ASan/UBSan), it aborts when:
 *  - a refusal has no reason, or the reason is not NUL-terminated;
 *  - an accepted reply has v != 1, ok not 0/1, released not -1/0/1, or an
 *    extracted string that is not NUL-terminated, well-formed UTF-8;
 *  - parsing is not deterministic (same input, same result, same reason);
 *  - the same reply with a trailing newline (the wire form) reads differently;
 *  - an accepted reply cut before its closing brace is still accepted.
 * Built by `make fuzz` (Makefile) with libFuzzer, or with fuzz/standalone.c.
 */
#include "podnet_json.c"

#include <stdint.h>
#include <stdlib.h>

#include "fuzz_ref.h"

#define FIELD_OK(f) (memchr((f), '\0', sizeof(f)) && ref_utf8_valid((f), strlen(f)))

static int same(const pn_reply_t *a, const pn_reply_t *b)
{
	return a->ok == b->ok && a->v == b->v && a->released == b->released &&
	       a->pod_uid == b->pod_uid && !strcmp(a->err_code, b->err_code) &&
	       !strcmp(a->err_msg, b->err_msg) &&
	       !strcmp(a->pod_name, b->pod_name) &&
	       !strcmp(a->pod_netns, b->pod_netns) &&
	       !strcmp(a->pod_ip, b->pod_ip) && !strcmp(a->pod_user, b->pod_user) &&
	       !strcmp(a->pod_fqdn, b->pod_fqdn) &&
	       !strcmp(a->pod_domain, b->pod_domain);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *line = (const char *) data;
	pn_reply_t a, b;
	char why[128], why2[128];
	int rc, rc2;
	size_t k;
	char *nl;

	memset(why, 'x', sizeof(why));
	rc = pn_parse_reply(line, size, &a, why, sizeof(why));
	if (rc != 0 && rc != -1)
		abort();
	if (!memchr(why, '\0', sizeof(why)) || (rc < 0 && !why[0]))
		abort();
	rc2 = pn_parse_reply(line, size, &b, why2, sizeof(why2));
	if (rc2 != rc || strcmp(why, why2) || (rc == 0 && !same(&a, &b)))
		abort();
	if (rc < 0)
		return 0;

	if (a.v != PN_API_VERSION || (a.ok != 0 && a.ok != 1) ||
	    a.released < -1 || a.released > 1)
		abort();
	if (!FIELD_OK(a.err_code) || !FIELD_OK(a.err_msg) ||
	    !FIELD_OK(a.pod_name) || !FIELD_OK(a.pod_netns) ||
	    !FIELD_OK(a.pod_ip) || !FIELD_OK(a.pod_user) ||
	    !FIELD_OK(a.pod_fqdn) || !FIELD_OK(a.pod_domain))
		abort();

	/* the wire form: the same object and a newline */
	if (size < PN_MAX_LINE) {
		nl = malloc(size + 1);
		if (!nl)
			abort();
		memcpy(nl, data, size);
		nl[size] = '\n';
		if (pn_parse_reply(nl, size + 1, &b, why2, sizeof(why2)) != 0 ||
		    !same(&a, &b))
			abort();
		free(nl);
	}

	/* cut before the closing brace: never a reply */
	k = size;
	while (k > 0 && (line[k - 1] == ' ' || line[k - 1] == '\t' ||
			 line[k - 1] == '\n' || line[k - 1] == '\r'))
		k--;
	if (k == 0 || line[k - 1] != '}')
		abort();
	if (pn_parse_reply(line, k - 1, &b, why2, sizeof(why2)) != -1)
		abort();
	return 0;
}
