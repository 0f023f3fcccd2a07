/*
 * createload DIR N THREADS [BYTES]: THREADS threads create N files in DIR
 * between them (open O_CREAT|O_EXCL, one write of BYTES, default 16 KiB,
 * close) and print the rate in files per second. DIR is made first.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *dir;
static long n, threads;
static size_t bytes = 16384;
static char *buf;

static void *worker(void *arg)
{
	char path[4096];
	for (long i = (long)arg; i < n; i += threads) {
		snprintf(path, sizeof path, "%s/f%ld", dir, i);
		int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644);
		if (fd < 0) {
			perror(path);
			exit(1);
		}
		if (write(fd, buf, bytes) != (ssize_t)bytes) {
			perror("write");
			exit(1);
		}
		if (close(fd)) {
			perror("close");
			exit(1);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t[256];
	struct timespec a, b;

	if (argc < 4) {
		fprintf(stderr, "usage: createload DIR N THREADS [BYTES]\n");
		return 2;
	}
	dir = argv[1];
	n = atol(argv[2]);
	threads = atol(argv[3]);
	if (argc > 4)
		bytes = strtoul(argv[4], NULL, 10);
	if (threads < 1 || threads > 256 || n < 1) {
		fprintf(stderr, "createload: 1-256 threads, at least 1 file\n");
		return 2;
	}
	buf = calloc(1, bytes ? bytes : 1);
	if (mkdir(dir, 0755)) {
		perror(dir);
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, worker, (void *)i);
	for (long i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%.0f\n", n / (b.tv_sec - a.tv_sec + (b.tv_nsec - a.tv_nsec) / 1e9));
	return 0;
}
