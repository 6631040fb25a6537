/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the SPANK plugin's options and environment
 * (podnet_spank_opts.c, podnet_spank_env.c), with stand-ins for the Slurm
 * calls they make (slurm_error, spank_context, spank_option_register):
 *   - what a task is told of its pod, from podnetd's reply, and what is
 *     refused;
 *   - the environment forms PODNET= and PODNET_IMAGE=: copied to Slurm's own
 *     form (which srun, sbatch and salloc read before the command line), never
 *     over a Slurm form the user set, in srun/sbatch/salloc only, removed
 *     again after the options are read; their values go through the options'
 *     callbacks, so PODNET=no is refused where the site does not allow
 *     opt-out, exactly like --podnet=no.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctest.h"
#include "podnet_spank_opts.h"

/* ---- stand-ins for Slurm ---- */
static spank_context_t ctx = S_CTX_LOCAL;
static char last_error[1024];
static int registered;

spank_context_t spank_context(void)
{
	return ctx;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
	(void) sp;
	(void) opt;
	registered++;
	return ESPANK_SUCCESS;
}

void slurm_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
}

void slurm_info(const char *fmt, ...)
{
	(void) fmt;
}

/* what srun does after the plugin's init (spank_process_env_options): the
 * option's callback with the value of its Slurm form, if set; 1: none set */
static int slurm_reads_env(struct pn_spank *st, const char *option)
{
	char var[160];
	const char *v;

	if (pns_slurm_option_env("podnet", option, var, sizeof(var)) < 0)
		return -2;
	v = getenv(var);
	if (!v)
		return 1;
	return !strcmp(option, "podnet") ? pns_opt_podnet(st, v) :
					    pns_opt_image(st, v);
}

static void clear_env(void)
{
	unsetenv("PODNET");
	unsetenv("PODNET_IMAGE");
	unsetenv("SLURM_SPANK__SLURM_SPANK_OPTION_podnet_podnet");
	unsetenv("SLURM_SPANK__SLURM_SPANK_OPTION_podnet_podnet_image");
}

static void test_pod_env(void)
{
	pn_reply_t rep;
	struct pns_pod_env e;
	char why[256];

	memset(&rep, 0, sizeof(rep));
	snprintf(rep.pod_fqdn, sizeof(rep.pod_fqdn), "pod1.42.alice.lab");
	snprintf(rep.pod_domain, sizeof(rep.pod_domain), "42.alice.lab");
	snprintf(rep.pod_ip, sizeof(rep.pod_ip), "198.18.0.5");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) == 0 &&
		      !strcmp(e.name, "pod1.42.alice.lab") &&
		      !strcmp(e.ip, "198.18.0.5") &&
		      !strcmp(e.domain, "42.alice.lab"),
	      "pod env: name, address, domain from the reply (%s)", why);

	snprintf(rep.pod_fqdn, sizeof(rep.pod_fqdn), "pod0.7.john.doe_2.lab");
	snprintf(rep.pod_domain, sizeof(rep.pod_domain), "7.john.doe_2.lab");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) == 0,
	      "pod env: a user name with '.' and '_' (%s)", why);

	snprintf(rep.pod_domain, sizeof(rep.pod_domain), "43.alice.lab");
	snprintf(rep.pod_fqdn, sizeof(rep.pod_fqdn), "pod1.42.alice.lab");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) < 0 && strstr(why, "not the domain") &&
		      !e.name[0] && !e.ip[0],
	      "pod env: a domain that is not the name's is refused (%s)", why);

	snprintf(rep.pod_domain, sizeof(rep.pod_domain), "42.alice.lab");
	snprintf(rep.pod_ip, sizeof(rep.pod_ip), "198.18.0.500");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) < 0 && strstr(why, "IPv4"),
	      "pod env: a bad address is refused (%s)", why);
	snprintf(rep.pod_ip, sizeof(rep.pod_ip), "198.18.0.5; rm -rf /");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) < 0,
	      "pod env: an address with more in it is refused");

	snprintf(rep.pod_ip, sizeof(rep.pod_ip), "198.18.0.5");
	snprintf(rep.pod_fqdn, sizeof(rep.pod_fqdn), "pod1.42.al\nice.lab");
	snprintf(rep.pod_domain, sizeof(rep.pod_domain), "42.al\nice.lab");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) < 0 && strstr(why, "DNS name"),
	      "pod env: a name with a control character is refused (%s)", why);
	snprintf(rep.pod_fqdn, sizeof(rep.pod_fqdn), "pod1..alice.lab");
	snprintf(rep.pod_domain, sizeof(rep.pod_domain), ".alice.lab");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) < 0,
	      "pod env: an empty label is refused");

	memset(&rep, 0, sizeof(rep));
	snprintf(rep.pod_ip, sizeof(rep.pod_ip), "198.18.0.5");
	CHECK(pns_pod_env(&rep, &e, why, sizeof(why)) < 0 && strstr(why, "older"),
	      "pod env: a reply without them (older podnetd) gives none (%s)", why);
}

static void test_slurm_form(void)
{
	char var[160], small[20];

	CHECK(pns_slurm_option_env("podnet", "podnet-image", var, sizeof(var)) == 0 &&
		      !strcmp(var, "SLURM_SPANK__SLURM_SPANK_OPTION_podnet_podnet_image"),
	      "Slurm's form of --podnet-image: %s", var);
	CHECK(pns_slurm_option_env("pod.net", "x-y", var, sizeof(var)) == 0 &&
		      !strcmp(var, "SLURM_SPANK__SLURM_SPANK_OPTION_pod_net_x_y"),
	      "Slurm's form: every other character as '_': %s", var);
	CHECK(pns_slurm_option_env("podnet", "podnet", small, sizeof(small)) < 0,
	      "Slurm's form: too small a buffer is an error");
}

static void test_env_forms(void)
{
	struct pn_spank st = PNS_INIT;
	char *av[] = { (char *) "allow_opt_out=0" };
	int rc;

	/* srun with PODNET_IMAGE=/i.sif: Slurm sees its own form, the callback
	 * takes it, the form goes after init_post_opt */
	clear_env();
	setenv("PODNET_IMAGE", "/i.sif", 1);
	ctx = S_CTX_LOCAL;
	registered = 0;
	CHECK(pns_init(&st, NULL, 1, av, (struct spank_option[2]){ { 0 } }) == 0 &&
		      registered == 2,
	      "init in srun: options registered");
	CHECK(slurm_reads_env(&st, "podnet-image") == 0 &&
		      !strcmp(st.user_image, "/i.sif"),
	      "PODNET_IMAGE reaches --podnet-image's callback");
	CHECK(slurm_reads_env(&st, "podnet") == 1, "PODNET unset: no --podnet");
	/* the command line comes after the environment and wins */
	CHECK(pns_opt_image(&st, "none") == 0 && !strcmp(st.user_image, "none"),
	      "--podnet-image=none after PODNET_IMAGE wins");
	pns_local_post_opt(&st);
	CHECK(!getenv("SLURM_SPANK__SLURM_SPANK_OPTION_podnet_podnet_image") &&
		      getenv("PODNET_IMAGE"),
	      "after the options: Slurm's form gone, PODNET_IMAGE kept");

	/* a relative path in the environment is refused like on the command line */
	struct pn_spank st2 = PNS_INIT;
	clear_env();
	setenv("PODNET_IMAGE", "x.sif", 1);
	(void) pns_init(&st2, NULL, 0, NULL, (struct spank_option[2]){ { 0 } });
	last_error[0] = '\0';
	CHECK(slurm_reads_env(&st2, "podnet-image") < 0 &&
		      strstr(last_error, "PODNET_IMAGE") &&
		      strstr(last_error, "absolute path"),
	      "PODNET_IMAGE=x.sif refused, naming it (%s)", last_error);

	/* Slurm's own form, set by the user, is left alone */
	struct pn_spank st3 = PNS_INIT;
	clear_env();
	setenv("PODNET_IMAGE", "/a.sif", 1);
	setenv("SLURM_SPANK__SLURM_SPANK_OPTION_podnet_podnet_image", "/b.sif", 1);
	(void) pns_init(&st3, NULL, 0, NULL, (struct spank_option[2]){ { 0 } });
	CHECK(slurm_reads_env(&st3, "podnet-image") == 0 &&
		      !strcmp(st3.user_image, "/b.sif"),
	      "the user's SLURM_SPANK_ form wins over PODNET_IMAGE");
	pns_local_post_opt(&st3);
	CHECK(getenv("SLURM_SPANK__SLURM_SPANK_OPTION_podnet_podnet_image") != NULL,
	      "the user's own Slurm form is not removed");

	/* PODNET=no where the site does not allow opt-out: refused, as
	 * --podnet=no; where it does, taken */
	struct pn_spank st4 = PNS_INIT;
	clear_env();
	setenv("PODNET", "no", 1);
	(void) pns_init(&st4, NULL, 1, av, (struct spank_option[2]){ { 0 } });
	last_error[0] = '\0';
	rc = slurm_reads_env(&st4, "podnet");
	CHECK(rc < 0 && !st4.opt_out && strstr(last_error, "not allowed"),
	      "PODNET=no without allow_opt_out refused (%s)", last_error);
	struct pn_spank st5 = PNS_INIT;
	char *allow[] = { (char *) "allow_opt_out=1" };
	(void) pns_init(&st5, NULL, 1, allow, (struct spank_option[2]){ { 0 } });
	CHECK(slurm_reads_env(&st5, "podnet") == 0 && st5.opt_out,
	      "PODNET=no with allow_opt_out=1 opts out");
	CHECK(pns_opt_podnet(&st5, "yes") == 0 && !st5.opt_out,
	      "--podnet=yes after PODNET=no wins");
	setenv("PODNET", "maybe", 1);
	struct pn_spank st6 = PNS_INIT;
	clear_env();
	setenv("PODNET", "maybe", 1);
	(void) pns_init(&st6, NULL, 1, allow, (struct spank_option[2]){ { 0 } });
	CHECK(slurm_reads_env(&st6, "podnet") < 0 && strstr(last_error, "PODNET=maybe"),
	      "PODNET=maybe refused naming it (%s)", last_error);

	/* an empty value is no value */
	struct pn_spank st7 = PNS_INIT;
	clear_env();
	setenv("PODNET_IMAGE", "", 1);
	(void) pns_init(&st7, NULL, 0, NULL, (struct spank_option[2]){ { 0 } });
	CHECK(slurm_reads_env(&st7, "podnet-image") == 1 && st7.env_forms_set == 0,
	      "PODNET_IMAGE= (empty) sets nothing");

	/* slurmd and slurmstepd never read the job's PODNET_* this way: there
	 * the options come from Slurm (checked again by the callbacks) */
	const spank_context_t remote[] = { S_CTX_REMOTE, S_CTX_SLURMD,
					   S_CTX_JOB_SCRIPT };
	for (size_t i = 0; i < sizeof(remote) / sizeof(remote[0]); i++) {
		struct pn_spank sr = PNS_INIT;

		clear_env();
		setenv("PODNET", "no", 1);
		setenv("PODNET_IMAGE", "/i.sif", 1);
		ctx = remote[i];
		(void) pns_init(&sr, NULL, 1, allow,
				(struct spank_option[2]){ { 0 } });
		CHECK(sr.env_forms_set == 0 &&
			      slurm_reads_env(&sr, "podnet") == 1 &&
			      slurm_reads_env(&sr, "podnet-image") == 1,
		      "context %d: PODNET_* not read", (int) remote[i]);
	}
	ctx = S_CTX_ALLOCATOR;
	struct pn_spank sa = PNS_INIT;
	clear_env();
	setenv("PODNET_IMAGE", "/i.sif", 1);
	(void) pns_init(&sa, NULL, 0, NULL, (struct spank_option[2]){ { 0 } });
	CHECK(slurm_reads_env(&sa, "podnet-image") == 0 &&
		      !strcmp(sa.user_image, "/i.sif"),
	      "sbatch and salloc read PODNET_IMAGE too");
	clear_env();
}

int main(void)
{
	ctest_begin();
	test_pod_env();
	test_slurm_form();
	test_env_forms();
	return ctest_end();
}
