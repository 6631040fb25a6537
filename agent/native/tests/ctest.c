/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ctest.c - see ctest.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "ctest.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "podnet_json.h"

int ctest_failures, ctest_checks;
char ctest_dir[] = "/tmp/pn-ctest-XXXXXX";
char ctest_sock[108];

const char *ok_pod =
	"{\"v\":1,\"ok\":true,\"pod\":{\"kind\":\"job\",\"name\":\"pn-j42\","
	"\"netns\":\"/run/netns/pn-j42\",\"ip\":\"198.18.0.5\",\"prefix\":15,"
	"\"user\":\"alice\",\"uid\":2001,\"job_id\":42,\"index\":0,"
	"\"names\":[]}}\n";

void ctest_begin(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!mkdtemp(ctest_dir)) {
		perror("mkdtemp");
		exit(99);
	}
	snprintf(ctest_sock, sizeof(ctest_sock), "%s/podnetd.sock", ctest_dir);
}

int ctest_end(void)
{
	char rec[160];

	snprintf(rec, sizeof(rec), "%s/req", ctest_dir);
	unlink(rec);
	unlink(ctest_sock);
	rmdir(ctest_dir);
	printf("# %d checks, %d failed\n", ctest_checks, ctest_failures);
	return ctest_failures > 100 ? 100 : ctest_failures;
}

void emit_req(const char *buf, long len)
{
	if (len > 0)
		printf("REQ %.*s", (int) len, buf); /* ends with '\n' */
}

pid_t fake_server(enum fake_mode mode, const char *reply, const char *record)
{
	struct sockaddr_un sa;
	int lfd, ready[2];
	pid_t pid;
	char c;

	unlink(ctest_sock);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", ctest_sock);
	if (lfd < 0 || bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) < 0 ||
	    listen(lfd, 4) < 0 || pipe(ready) < 0) {
		perror("fake server");
		exit(99);
	}
	pid = fork();
	if (pid == 0) {
		char line[PN_MAX_LINE + 1];
		size_t got = 0;
		ssize_t n;
		int fd;

		close(ready[0]);
		if (write(ready[1], "x", 1) != 1)
			_exit(98);
		fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			_exit(97);
		if (mode == FAKE_REFUSE) {
			/* as podnetd refusing a connection: answer, hang up */
			if (write(fd, reply, strlen(reply)) < 0)
				_exit(96);
			close(fd);
			_exit(0);
		}
		while (got < sizeof(line) - 1 &&
		       (n = read(fd, line + got, sizeof(line) - 1 - got)) > 0) {
			got += (size_t) n;
			if (memchr(line, '\n', got))
				break;
		}
		line[got] = '\0';
		if (record) {
			FILE *f = fopen(record, "w");
			if (f) {
				fputs(line, f);
				fclose(f);
			}
		}
		switch (mode) {
		case FAKE_REPLY:
			if (write(fd, reply, strlen(reply)) < 0)
				_exit(96);
			break;
		case FAKE_REPLY_SLOWLY:
			for (n = 0; reply[n]; n++) {
				if (write(fd, reply + n, 1) < 0)
					_exit(96);
				usleep(1000);
			}
			break;
		case FAKE_PARTIAL:
			if (write(fd, reply, strlen(reply) / 2) < 0)
				_exit(96);
			break;
		case FAKE_CLOSE:
		case FAKE_REFUSE:
			break;
		case FAKE_SILENT:
			sleep(5);
			break;
		case FAKE_FLOOD: {
			static char blob[PN_MAX_LINE + 100];
			memset(blob, 'a', sizeof(blob));
			if (write(fd, blob, sizeof(blob)) < 0)
				_exit(0); /* client hung up: fine */
			break;
		}
		}
		close(fd);
		_exit(0);
	}
	close(ready[1]);
	close(lfd);
	if (read(ready[0], &c, 1) != 1) {
		fprintf(stderr, "fake server did not start\n");
		exit(99);
	}
	close(ready[0]);
	return pid;
}

void reap(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
}
