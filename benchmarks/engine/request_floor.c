/* The request floor without Python: the same Produce request, again and again, from C.
 *
 *     request_floor <host> <port> <request file> <requests> <in flight>
 *
 * Reads one framed Produce request (size prefix included, as request_floor.py writes it), opens
 * a blocking TCP connection, sends <in flight> copies, then one more after each answer is read
 * whole, until <requests> were answered. Every answer must carry the request's correlation id
 * (the same in every copy: Kafka does not require them to differ) and is otherwise only framed,
 * not decoded (request_floor.py checks the error codes of the same request first). Prints one
 * JSON line: requests, wall seconds, user and system CPU seconds, context switches. What a client
 * with no interpreter pays per request on this machine: the system calls, the wake-ups and the
 * broker's threads on the same cores. A benchmark helper, compiled by request_floor.py with the
 * system's C compiler; not part of the product.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void read_exact(int fd, uint8_t *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r <= 0) die("recv");
        got += (size_t)r;
    }
}

static void write_all(int fd, const uint8_t *buf, size_t n) {
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = send(fd, buf + sent, n - sent, 0);
        if (w <= 0) die("send");
        sent += (size_t)w;
    }
}

static double seconds(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s host port request-file requests in-flight\n", argv[0]);
        return 2;
    }
    long requests = atol(argv[4]), in_flight = atol(argv[5]);
    FILE *f = fopen(argv[3], "rb");
    if (!f) die("request file");
    struct stat st;
    if (fstat(fileno(f), &st) != 0) die("stat");
    size_t size = (size_t)st.st_size;
    uint8_t *request = malloc(size);
    if (!request || fread(request, 1, size, f) != size) die("read request");
    fclose(f);
    /* Framed request: int32 size, int16 api key, int16 version, int32 correlation id. */
    uint32_t cid;
    memcpy(&cid, request + 8, 4);

    struct addrinfo hints = {0}, *addr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(argv[1], argv[2], &hints, &addr) != 0) die("getaddrinfo");
    int fd = socket(addr->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, addr->ai_addr, addr->ai_addrlen) != 0) die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    size_t capacity = 1 << 16;
    uint8_t *answer = malloc(capacity);
    struct rusage r0, r1;
    struct timespec t0, t1;
    getrusage(RUSAGE_SELF, &r0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long sent = 0;
    for (; sent < in_flight && sent < requests; sent++) write_all(fd, request, size);
    for (long done = 0; done < requests; done++) {
        uint32_t be;
        read_exact(fd, (uint8_t *)&be, 4);
        size_t n = ntohl(be);
        if (n > capacity) {
            capacity = n;
            answer = realloc(answer, capacity);
            if (!answer) die("realloc");
        }
        read_exact(fd, answer, n);
        if (n < 4 || memcmp(answer, &cid, 4) != 0) {
            fprintf(stderr, "answer %ld: unexpected correlation id\n", done);
            return 1;
        }
        if (sent < requests) {
            write_all(fd, request, size);
            sent++;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &r1);
    printf("{\"requests\": %ld, \"wall_s\": %.6f, \"user_s\": %.6f, \"system_s\": %.6f, "
           "\"context_switches\": %ld}\n",
           requests, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
           seconds(r1.ru_utime) - seconds(r0.ru_utime),
           seconds(r1.ru_stime) - seconds(r0.ru_stime),
           (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw));
    close(fd);
    freeaddrinfo(addr);
    return 0;
}
