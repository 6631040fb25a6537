/* SPDX-License-Identifier: Apache-2.0 */
/*
 * standalone.c - a main() for the fuzz targets where libFuzzer is missing
 * (no clang): the Makefile builds fuzz_<target>.c with this file under
 * ASan/UBSan (gcc). It takes libFuzzer's command line (directories, and of
 * the -flags only -max_total_time, -runs, -max_len, -seed, -dict, -artifact_prefix),
 * runs every file of the directories, then random mutations of them (bit
 * flips, byte changes, inserts, deletes, copies, splices, dictionary words)
 * until the time is up. No coverage feedback: it is the "long random corpus"
 * fallback, not a replacement for libFuzzer. On a crash (a sanitizer report
 * or an abort()) the input is written to <artifact_prefix>crash-standalone
 * (fopen/fwrite from the handler: the process is dying anyway). Prints
 * libFuzzer's final stats lines (the Makefile's summary reads them).
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <sanitizer/common_interface_defs.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct buf {
	unsigned char *p;
	size_t n;
};

static struct buf *units, *words;
static size_t nunits, nwords;
static unsigned char *cur;
static size_t curlen;
static const char *artifact_prefix = "";

static void push(struct buf **v, size_t *n, const unsigned char *p, size_t len)
{
	struct buf *nv = realloc(*v, (*n + 1) * sizeof(**v));

	if (!nv)
		abort();
	*v = nv;
	nv[*n].p = malloc(len ? len : 1);
	if (!nv[*n].p)
		abort();
	memcpy(nv[*n].p, p, len);
	nv[*n].n = len;
	(*n)++;
}

static void load_dir(const char *dir)
{
	static unsigned char data[1 << 20];
	char path[4096];
	struct dirent *e;
	DIR *d = opendir(dir);

	while (d && (e = readdir(d))) {
		FILE *f;
		size_t n;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		f = fopen(path, "rb");
		if (!f)
			continue;
		n = fread(data, 1, sizeof(data), f);
		fclose(f);
		push(&units, &nunits, data, n);
	}
	if (d)
		closedir(d);
}

/* libFuzzer's dictionary format: one "quoted" word a line, \xNN escapes */
static void load_dict(const char *path)
{
	char line[1024];
	unsigned char w[512];
	FILE *f = fopen(path, "r");

	while (f && fgets(line, sizeof(line), f)) {
		char *s = strchr(line, '"'), *e = strrchr(line, '"');
		size_t n = 0;

		if (line[0] == '#' || !s || e <= s)
			continue;
		for (s++; s < e && n < sizeof(w); s++) {
			unsigned v;

			if (*s == '\\' && s[1] == 'x' && sscanf(s + 2, "%2x", &v) == 1) {
				w[n++] = (unsigned char) v;
				s += 3;
			} else if (*s == '\\' && s + 1 < e) {
				w[n++] = (unsigned char) *++s;
			} else {
				w[n++] = (unsigned char) *s;
			}
		}
		push(&words, &nwords, w, n);
	}
	if (f)
		fclose(f);
}

static void on_death(void)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%scrash-standalone", artifact_prefix);
	f = fopen(path, "wb");
	if (f) {
		fwrite(cur, 1, curlen, f);
		fclose(f);
		fprintf(stderr, "standalone: crashing input written to %s\n", path);
	}
}

/* the harness's own checks abort(): write the input too, then die */
static void on_signal(int sig)
{
	on_death();
	signal(sig, SIG_DFL);
	raise(sig);
}

static size_t rnd(size_t n)
{
	return n ? (size_t) random() % n : 0;
}

/* one to eight random edits of a copy of a random unit */
static size_t mutate(unsigned char *b, size_t max)
{
	struct buf *u = &units[rnd(nunits)];
	size_t n = u->n < max ? u->n : max, edits = 1 + rnd(8), i;

	memcpy(b, u->p, n);
	for (i = 0; i < edits; i++) {
		size_t at = rnd(n + 1), len = 1 + rnd(16);

		switch (rnd(7)) {
		case 0: /* flip a bit */
			if (n)
				b[rnd(n)] ^= (unsigned char) (1u << rnd(8));
			break;
		case 1: /* set a byte (interesting values often) */
			if (n) {
				static const unsigned char hot[] = {
					0, 0x1f, '"', '\\', 0x7f, 0x80, 0xbf, 0xc0,
					0xc2, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xff
				};
				b[rnd(n)] = rnd(2) ? hot[rnd(sizeof(hot))]
						   : (unsigned char) rnd(256);
			}
			break;
		case 2: /* insert random bytes */
			if (n + len <= max) {
				memmove(b + at + len, b + at, n - at);
				for (size_t k = 0; k < len; k++)
					b[at + k] = (unsigned char) rnd(256);
				n += len;
			}
			break;
		case 3: /* delete a range */
			if (at < n) {
				if (len > n - at)
					len = n - at;
				memmove(b + at, b + at + len, n - at - len);
				n -= len;
			}
			break;
		case 4: /* copy a range of itself elsewhere */
			if (n && n + len <= max) {
				size_t from = rnd(n);
				if (len > n - from)
					len = n - from;
				memmove(b + at + len, b + at, n - at);
				memmove(b + at, b + from + (from >= at ? len : 0), len);
				n += len;
			}
			break;
		case 5: { /* splice: the tail of another unit */
			struct buf *v = &units[rnd(nunits)];
			size_t from = rnd(v->n + 1), k = v->n - from;
			if (at + k > max)
				k = max - at;
			memcpy(b + at, v->p + from, k);
			n = at + k;
			break;
		}
		default: /* a dictionary word */
			if (nwords) {
				struct buf *w = &words[rnd(nwords)];
				if (n + w->n <= max) {
					memmove(b + at + w->n, b + at, n - at);
					memcpy(b + at, w->p, w->n);
					n += w->n;
				}
			}
			break;
		}
	}
	return n;
}

int main(int argc, char **argv)
{
	long seconds = 60, max_len = 4096;
	unsigned seed = (unsigned) time(NULL);
	unsigned long long runs = 0, max_runs = 0;
	struct timespec t0, t;
	double el;
	int i;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strncmp(a, "-max_total_time=", 16))
			seconds = atol(a + 16);
		else if (!strncmp(a, "-runs=", 6))
			max_runs = strtoull(a + 6, NULL, 10);
		else if (!strncmp(a, "-max_len=", 9))
			max_len = atol(a + 9);
		else if (!strncmp(a, "-seed=", 6))
			seed = (unsigned) atol(a + 6);
		else if (!strncmp(a, "-dict=", 6))
			load_dict(a + 6);
		else if (!strncmp(a, "-artifact_prefix=", 17))
			artifact_prefix = a + 17;
		else if (a[0] != '-')
			load_dir(a);
	}
	if (max_len < 1)
		max_len = 1;
	if (!nunits)
		push(&units, &nunits, (const unsigned char *) "", 0);
	srandom(seed);
	__sanitizer_set_death_callback(on_death);
	signal(SIGABRT, on_signal);
	cur = malloc((size_t) max_len);
	if (!cur)
		abort();
	fprintf(stderr, "standalone: %zu inputs, %zu words, %ld s, seed %u\n",
		nunits, nwords, seconds, seed);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < (int) nunits; i++) {
		curlen = units[i].n;
		memcpy(cur, units[i].p, curlen < (size_t) max_len ? curlen : (size_t) max_len);
		LLVMFuzzerTestOneInput(cur, curlen < (size_t) max_len ? curlen : (size_t) max_len);
		runs++;
	}
	for (;;) {
		unsigned k;

		for (k = 0; k < 256; k++) {
			unsigned char *exact;

			curlen = mutate(cur, (size_t) max_len);
			/* an exactly sized copy: ASan sees any read past the end */
			exact = malloc(curlen ? curlen : 1);
			if (!exact)
				abort();
			memcpy(exact, cur, curlen);
			LLVMFuzzerTestOneInput(exact, curlen);
			free(exact);
			runs++;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		el = (double) (t.tv_sec - t0.tv_sec) +
		     (double) (t.tv_nsec - t0.tv_nsec) / 1e9;
		if (el >= (double) seconds || (max_runs && runs >= max_runs))
			break;
	}
	fprintf(stderr, "Done %llu runs in %.0f second(s)\n", runs, el);
	fprintf(stderr, "stat::number_of_executed_units: %llu\n", runs);
	fprintf(stderr, "stat::average_exec_per_sec:     %.0f\n",
		el > 0 ? (double) runs / el : 0.0);
	return 0;
}
