/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctest.h - the little harness of the C unit tests (tests/test_*.c): CHECK
 * prints TAP-like "ok N - ..." / "not ok N - ..." lines, REQ lines carry
 * request lines for the Python side (tests/unit/c) to check with a real JSON
 * parser, and a fake podnetd answers one connection the way a test asks.
 * Every test program: ctest_begin(), its checks, return ctest_end().
 */
#ifndef CTEST_H
#define CTEST_H

#include <stdio.h>
#include <sys/types.h>

extern int ctest_failures, ctest_checks;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		ctest_checks++;                                            \
		if (cond) {                                                \
			printf("ok %d - ", ctest_checks);                  \
		} else {                                                   \
			ctest_failures++;                                  \
			printf("not ok %d - (%s:%d) ", ctest_checks,       \
			       __FILE__, __LINE__);                        \
		}                                                          \
		printf(__VA_ARGS__);                                       \
		printf("\n");                                              \
	} while (0)

/* a private directory (ctest_dir) and a socket path in it (ctest_sock) */
extern char ctest_dir[];
extern char ctest_sock[108];
void ctest_begin(void);
/* removes the directory's files we made, prints "# N checks, N failed";
 * returns the exit status (failures, at most 100) */
int ctest_end(void);

/* prints "REQ <line>" (the line ends with '\n') */
void emit_req(const char *buf, long len);

/* fake podnetd on ctest_sock: one connection, behaviour chosen per test */
enum fake_mode {
	FAKE_REPLY,        /* read a line, send reply */
	FAKE_REPLY_SLOWLY, /* send the reply in 1-byte pieces */
	FAKE_CLOSE,        /* read a line, close */
	FAKE_PARTIAL,      /* send half a reply, close */
	FAKE_SILENT,       /* read a line, never answer */
	FAKE_FLOOD,        /* send > 64 KiB without newline */
	FAKE_REFUSE,       /* reply at once without reading, then hang up */
};

/* Starts the fake server (a child process); the request line it read is
 * written to record when record is not NULL. */
pid_t fake_server(enum fake_mode mode, const char *reply, const char *record);
/* kills and waits for it */
void reap(pid_t pid);

/* podnetd's reply with a pod of alice (uid 2001), docs/api.md's example */
extern const char *ok_pod;

#endif /* CTEST_H */
