/* SPDX-License-Identifier: Apache-2.0 */
/*
 * json_filter - podnet_json.c as a filter, for the differential tests in
 * tests/unit/c/test_native.py (Python's json module is the reference).
 *
 *   json_filter escape   each record -> pn_json_escape(record) + "\n"
 *   json_filter reply    each record -> "ERR\n", or
 *                        "OK <ok> <v> <released> <pod_uid> <code> <message>
 *                            <name> <netns> <ip> <user> <fqdn> <domain>\n"
 *                        (strings in hex, "-" when empty)
 * Records on stdin: a 4-byte little-endian length, then that many bytes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "podnet_json.h"

static void hex(const char *s)
{
	if (!*s) {
		fputs(" -", stdout);
		return;
	}
	putchar(' ');
	for (; *s; s++)
		printf("%02x", (unsigned char) *s);
}

int main(int argc, char **argv)
{
	static char in[PN_MAX_LINE + 16], out[6 * sizeof(in) + 1];
	unsigned char lb[4];
	int escape;

	if (argc != 2 || (strcmp(argv[1], "escape") && strcmp(argv[1], "reply")))
		return 2;
	escape = !strcmp(argv[1], "escape");
	while (fread(lb, 1, 4, stdin) == 4) {
		uint32_t n = (uint32_t) lb[0] | (uint32_t) lb[1] << 8 |
			     (uint32_t) lb[2] << 16 | (uint32_t) lb[3] << 24;
		pn_reply_t r;
		char why[256];

		if (n > sizeof(in) || fread(in, 1, n, stdin) != n)
			return 3;
		if (escape) {
			if (pn_json_escape(out, sizeof(out), in, n) < 0)
				return 4;
			printf("%s\n", out);
			continue;
		}
		if (pn_parse_reply(in, n, &r, why, sizeof(why)) < 0) {
			puts("ERR");
			continue;
		}
		printf("OK %d %lld %d %lld", r.ok, r.v, r.released, r.pod_uid);
		hex(r.err_code);
		hex(r.err_msg);
		hex(r.pod_name);
		hex(r.pod_netns);
		hex(r.pod_ip);
		hex(r.pod_user);
		hex(r.pod_fqdn);
		hex(r.pod_domain);
		putchar('\n');
	}
	return 0;
}
