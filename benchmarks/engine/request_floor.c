/* The request floor without Python: the same Produce request, again and again, from C.
 *
 *     request_floor <host> <port> <request file> <requests> <in flight> [<answers per wake-up>]
 *
 * Reads one framed Produce request (size prefix included, as request_floor.py writes it), opens
 * a blocking TCP connection, sends <in flight> copies, then one more for each answer read whole,
 * until <requests> were answered. Every answer must carry the request's correlation id (the same
 * in every copy: Kafka does not require them to differ) and the first answer's size (the same
 * request gets the same answer), and is otherwise only framed, not decoded (request_floor.py
 * checks the error codes of the same request first).
 *
 * <answers per wake-up> N (default 1) does what the mirror's target.answers.per.wakeup does:
 * SO_RCVLOWAT at N answers' bytes, so the kernel wakes the reader once for N answers rather than
 * once for each (N is capped at <in flight> - 1, as in the mirror, so the broker always has a
 * request to work on). With N = 1 every answer costs a sleep and a wake-up, which a mirror that
 * waits for several does not pay; comparing the two says how much of a request's kernel time is
 * that wake-up.
 *
 * Prints one JSON line: requests, wall seconds, user and system CPU seconds, context switches
 * (all, and the voluntary ones: this thread slept), reads (the first answer takes two, its size
 * and its rest; then one per wake-up). What a client with no interpreter pays per request on
 * this machine: the system calls, the wake-ups and the broker's threads on the same cores. A
 * benchmark helper, compiled by request_floor.py with the system's C compiler; not part of the
 * product.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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

/* Reads made (poll, then recv): one per wake-up when every answer of a wake-up is there. */
static long reads = 0;

/* Read n bytes once the kernel holds them all, as the mirror's event loop does: SO_RCVLOWAT at
 * what is still missing, poll (readable only at the mark), then recv. A blocking recv alone
 * would not do: it takes what is queued, then sleeps until the *new* bytes reach the whole mark,
 * and when fewer than that are still to come it never wakes. *lowat is the mark now set. */
static void read_marked(int fd, uint8_t *buf, size_t n, int *lowat) {
    size_t got = 0;
    while (got < n) {
        int want = (int)(n - got);
        if (want != *lowat) {
            if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) != 0)
                die("SO_RCVLOWAT");
            *lowat = want;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, -1) != 1) die("poll");
        ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
        reads++;
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
    if (argc != 6 && argc != 7) {
        fprintf(stderr,
                "usage: %s host port request-file requests in-flight [answers-per-wakeup]\n",
                argv[0]);
        return 2;
    }
    long requests = atol(argv[4]), in_flight = atol(argv[5]);
    long per_wakeup = argc == 7 ? atol(argv[6]) : 1;
    if (requests < 1 || in_flight < 1 || per_wakeup < 1) {
        fprintf(stderr, "requests, in-flight and answers-per-wakeup must be at least 1\n");
        return 2;
    }
    if (per_wakeup > in_flight - 1) per_wakeup = in_flight > 1 ? in_flight - 1 : 1;
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

    struct rusage r0, r1;
    struct timespec t0, t1;
    getrusage(RUSAGE_SELF, &r0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long sent = 0, done = 0;
    for (; sent < in_flight && sent < requests; sent++) write_all(fd, request, size);
    /* The first answer alone, to learn the size every later one must have. */
    int lowat = 1;
    uint32_t be;
    read_marked(fd, (uint8_t *)&be, 4, &lowat);
    size_t n = ntohl(be), framed = n + 4;
    if (n < 4 || n > (1u << 20)) {
        fprintf(stderr, "answer 0: implausible size %zu\n", n);
        return 1;
    }
    uint8_t *answers = malloc(framed * (size_t)per_wakeup);
    if (!answers) die("malloc");
    memcpy(answers, &be, 4);
    read_marked(fd, answers + 4, n, &lowat);
    long got = 1;
    for (;;) {
        for (long i = 0; i < got; i++, done++) {
            const uint8_t *a = answers + (size_t)i * framed;
            uint32_t size_be;
            memcpy(&size_be, a, 4);
            if (ntohl(size_be) != n || memcmp(a + 4, &cid, 4) != 0) {
                fprintf(stderr, "answer %ld: unexpected size or correlation id\n", done);
                return 1;
            }
        }
        for (long i = 0; i < got && sent < requests; i++, sent++) write_all(fd, request, size);
        if (done >= requests) break;
        got = sent - done < per_wakeup ? sent - done : per_wakeup;
        read_marked(fd, answers, (size_t)got * framed, &lowat);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &r1);
    printf("{\"requests\": %ld, \"wall_s\": %.6f, \"user_s\": %.6f, \"system_s\": %.6f, "
           "\"context_switches\": %ld, \"voluntary_switches\": %ld, \"reads\": %ld}\n",
           requests, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
           seconds(r1.ru_utime) - seconds(r0.ru_utime),
           seconds(r1.ru_stime) - seconds(r0.ru_stime),
           (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw),
           r1.ru_nvcsw - r0.ru_nvcsw, reads);
    close(fd);
    freeaddrinfo(addr);
    return 0;
}
