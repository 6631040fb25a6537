/* SPDX-License-Identifier: Apache-2.0 */
/*
 * podnet_spank_env.c - the plugin's environment (podnet_spank_env.h): the
 * variables that tell a task its pod, and the environment forms of the
 * options.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "podnet_spank_env.h"
#include "podnet_util.h"

const struct pns_env_form pns_env_forms[PNS_ENV_FORMS] = {
	{ "PODNET", "podnet" },
	{ "PODNET_IMAGE", "podnet-image" },
};

/* a DNS name as podnetd writes them: [A-Za-z0-9._-], no empty label, no
 * leading or trailing dot, at most 253 bytes */
static int dns_name_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 253 || s[0] == '.' || s[n - 1] == '.')
		return 0;
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char) s[i];

		if (!(isalnum(c) || c == '-' || c == '_' || c == '.'))
			return 0;
		if (c == '.' && s[i + 1] == '.')
			return 0;
	}
	return 1;
}

int pns_pod_env(const pn_reply_t *rep, struct pns_pod_env *out, char *why,
		size_t whysz)
{
	struct in_addr a;
	const char *dot;

	memset(out, 0, sizeof(*out));
	if (!rep->pod_fqdn[0] || !rep->pod_domain[0]) {
		pn_fmt(why, whysz, "podnetd's reply has no pod name or job domain "
		       "(podnetd older than the plugin?)");
		return -1;
	}
	if (!dns_name_ok(rep->pod_fqdn) || !dns_name_ok(rep->pod_domain)) {
		pn_fmt(why, whysz, "pod name or job domain is not a DNS name");
		return -1;
	}
	dot = strchr(rep->pod_fqdn, '.');
	if (!dot || strcmp(dot + 1, rep->pod_domain) != 0) {
		pn_fmt(why, whysz, "job domain %s is not the domain of %s",
		       rep->pod_domain, rep->pod_fqdn);
		return -1;
	}
	if (inet_pton(AF_INET, rep->pod_ip, &a) != 1) {
		pn_fmt(why, whysz, "pod address '%s' is not an IPv4 address",
		       rep->pod_ip);
		return -1;
	}
	snprintf(out->name, sizeof(out->name), "%s", rep->pod_fqdn);
	snprintf(out->domain, sizeof(out->domain), "%s", rep->pod_domain);
	snprintf(out->ip, sizeof(out->ip), "%s", rep->pod_ip);
	return 0;
}

int pns_slurm_option_env(const char *plugin, const char *option, char *out,
			 size_t outsz)
{
	pn_buf_t b = { out, outsz, 0, 0 };
	const char *parts[2] = { plugin, option };
	int k;

	if (!out || !outsz)
		return -1;
	out[0] = '\0';
	pn_buf_put(&b, "SLURM_SPANK__SLURM_SPANK_OPTION_", 32);
	for (k = 0; k < 2; k++) {
		const char *p;

		if (k)
			pn_buf_put(&b, "_", 1);
		for (p = parts[k]; *p; p++) {
			char c = isalnum((unsigned char) *p) ? *p : '_';

			pn_buf_put(&b, &c, 1);
		}
	}
	return b.overflow ? -1 : 0;
}

unsigned pns_env_forms_apply(const char *plugin)
{
	unsigned set = 0;
	char var[160];
	int i;

	for (i = 0; i < PNS_ENV_FORMS; i++) {
		const char *v = getenv(pns_env_forms[i].env);

		if (!v || !*v ||
		    pns_slurm_option_env(plugin, pns_env_forms[i].option, var,
					 sizeof(var)) < 0)
			continue;
		if (getenv(var))
			continue; /* Slurm's own form, set by the user, wins */
		if (setenv(var, v, 0) == 0)
			set |= 1u << i;
	}
	return set;
}

void pns_env_forms_clear(const char *plugin, unsigned set)
{
	char var[160];
	int i;

	for (i = 0; i < PNS_ENV_FORMS; i++)
		if ((set & (1u << i)) &&
		    pns_slurm_option_env(plugin, pns_env_forms[i].option, var,
					 sizeof(var)) == 0)
			(void) unsetenv(var);
}
