/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of podnet_pod.c that need no privilege: the netns path checks of
 * pn_open_netns and the name check of pn_enter_pod_resolver (done before any
 * mount). The mounts themselves: pod_resolver_driver.c, as root, from
 * tests/unit/c/test_pod_resolver.py.
 */
#include <stdio.h>
#include <string.h>

#include "ctest.h"
#include "podnet_pod.h"

/* ---------------------------------------------------------------------- */
static void test_netns_checks(void)
{
	char why[256];

	CHECK(pn_open_netns("/tmp/x", why, sizeof(why)) == -1,
	      "netns: outside /run/netns refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/../../etc/shadow", why, sizeof(why)) == -1,
	      "netns: .. refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/a/b", why, sizeof(why)) == -1,
	      "netns: subdirectory refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/", why, sizeof(why)) == -1,
	      "netns: empty name refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/..", why, sizeof(why)) == -1,
	      "netns: '..' name refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/pn j", why, sizeof(why)) == -1,
	      "netns: space refused (%s)", why);
	CHECK(pn_open_netns("/run/netns/pn-does-not-exist-ctest", why,
			    sizeof(why)) == -1,
	      "netns: missing file refused (%s)", why);
	CHECK(pn_open_netns(NULL, why, sizeof(why)) == -1, "netns: NULL refused");
}

static void test_pod_name_checks(void)
{
	char why[256];

	CHECK(pn_enter_pod_resolver("../x", why, sizeof(why)) == -1 &&
		      strstr(why, "bad"),
	      "pod: '../x' refused before any mount (%s)", why);
	CHECK(pn_enter_pod_resolver("", why, sizeof(why)) == -1,
	      "pod: empty name refused (%s)", why);
	CHECK(pn_enter_pod_resolver(NULL, why, sizeof(why)) == -1,
	      "pod: NULL name refused (%s)", why);
	CHECK(pn_enter_pod_resolver("pn-j1/../../x", why, sizeof(why)) == -1,
	      "pod: slash refused (%s)", why);
	CHECK(pn_enter_pod_resolver("pn-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
				    "aaaaaaaaaaaaaaaaaaaaaaaa", why,
				    sizeof(why)) == -1,
	      "pod: name over 64 characters refused (%s)", why);
}

int main(void)
{
	ctest_begin();
	test_netns_checks();
	test_pod_name_checks();
	return ctest_end();
}
