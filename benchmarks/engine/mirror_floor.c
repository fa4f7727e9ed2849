/* The mirror floor: the whole shallow-mirror cycle from C, with no interpreter.
 *
 *     mirror_floor <source host> <source port> <target host> <target port> <topic>
 *                  <target topic> <end offsets, comma-separated, one per partition>
 *                  [<in flight> [<answers per wake-up> [<partition fetch bytes> [<budget>]]]]
 *
 * Fetches every batch of <topic> (partitions 0..n-1, from offset 0 to the given end offsets)
 * from the source broker and produces it, unchanged, to the same partition of <target topic> on
 * the target broker: Fetch v4 answers split into batches (each checked: magic 2, CRC-32C over
 * [21, end) with the codec's own CRC code; base offset set to 0 in place), one batch per
 * partition per Produce v3 request (stock Kafka's rule), the batch bytes sent from the Fetch
 * answer's own buffer (writev, no copy), up to <in flight> requests outstanding (default 5), the
 * target socket waking the loop once per <answers per wake-up> answers (default 3, SO_RCVLOWAT,
 * as the mirror's target.answers.per.wakeup), every answer's error codes checked, a Fetch
 * answer's memory freed once its last batch is acknowledged, no more fetched while <budget>
 * bytes (default 64 MiB, the mirror's buffer.memory) are held. One thread, one poll over both
 * sockets; 2 MiB per partition per Fetch by default.
 *
 * What it leaves out of the mirror's work: the producer-identity stamp (the loaded batches are
 * forwarded with their own producer id and sequences, which a target that never saw that
 * producer accepts in order), offsets, metrics, retries. So what it costs per batch is a floor
 * under any mirror of stock Kafka on this machine: the system calls, the wake-ups and the
 * copies, with the least user-space work. Single-broker clusters only (every partition's leader
 * is the bootstrap broker).
 *
 * Prints one JSON line: batches, bytes, Fetch and Produce requests, wall seconds, user and system
 * CPU seconds, context switches, and the target's reads. A benchmark helper, compiled by
 * bench_mirror.py (--phases floor) with the system's C compiler; not part of the product.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_PARTITIONS 256
#define MAX_IN_FLIGHT 16
#define FRAME_WAKE_BYTES (1 << 20)
#define CLIENT_ID "floor"

static void die(const char *what) {
    perror(what);
    exit(1);
}

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "mirror_floor: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(1);
}

/* ---- big-endian fields ---------------------------------------------------------------- */
static uint8_t *put16(uint8_t *p, int v) {
    uint16_t x = htons((uint16_t)v);
    memcpy(p, &x, 2);
    return p + 2;
}
static uint8_t *put32(uint8_t *p, int32_t v) {
    uint32_t x = htonl((uint32_t)v);
    memcpy(p, &x, 4);
    return p + 4;
}
static uint8_t *put64(uint8_t *p, int64_t v) {
    return put32(put32(p, (int32_t)(v >> 32)), (int32_t)v);
}
static uint8_t *putstr(uint8_t *p, const char *s) {
    size_t n = strlen(s);
    p = put16(p, (int)n);
    memcpy(p, s, n);
    return p + n;
}
static int16_t get16(const uint8_t *p) { uint16_t x; memcpy(&x, p, 2); return (int16_t)ntohs(x); }
static int32_t get32(const uint8_t *p) { uint32_t x; memcpy(&x, p, 4); return (int32_t)ntohl(x); }
static int64_t get64(const uint8_t *p) {
    return ((int64_t)get32(p) << 32) | (uint32_t)get32(p + 4);
}

/* ---- CRC-32C: the codec's own (native/crc32c_hw.h, three streams of the SSE4.2 instruction),
 * its stream-joining tables made as native/_crecords.pyx makes them ---------------------- */
#include "../../native/crc32c_hw.h"

#define CRC32C_POLY 0x82F63B78u     /* bit-reflected Castagnoli polynomial */
#define X0 0x80000000u              /* x**0, bit-reflected */
static uint32_t x2n[32], x8n[4][256];

static uint32_t multiply(uint32_t a, uint32_t b) {     /* a * b mod P; a is a power of x */
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) return p;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
}

static uint32_t shift_zeros(uint32_t crc, uint32_t n) {   /* over n zero bytes */
    uint32_t power = X0;
    if (crc == 0 || n == 0) return crc;
    for (int j = 0; j < 4; j++) {
        unsigned byte = (n >> (8 * j)) & 0xFF;
        if (byte) power = power == X0 ? x8n[j][byte] : multiply(x8n[j][byte], power);
    }
    return multiply(power, crc);
}

static void init_crc(void) {
    uint32_t p = 1u << 30;          /* x**1 */
    for (int k = 0; k < 32; k++) {
        x2n[k] = p;
        p = multiply(p, p);
    }
    for (int j = 0; j < 4; j++) {
        x8n[j][0] = X0;
        x8n[j][1] = x2n[3 + 8 * j];
        for (int k = 2; k < 256; k++) x8n[j][k] = multiply(x8n[j][k - 1], x8n[j][1]);
    }
    for (int j = 0; j < 4; j++)
        for (int k = 0; k < 256; k++) {
            sm_crc32c_long[j][k] = shift_zeros((uint32_t)k << (8 * j), SM_CRC32C_LONG);
            sm_crc32c_short[j][k] = shift_zeros((uint32_t)k << (8 * j), SM_CRC32C_SHORT);
        }
    sm_crc32c_have_hw = sm_crc32c_cpu_has_hw();
    if (!sm_crc32c_have_hw) {
        fprintf(stderr, "mirror_floor: this CPU has no SSE4.2 CRC-32C instruction\n");
        exit(2);
    }
}

static uint32_t crc32c(const uint8_t *p, size_t n) { return sm_crc32c_hw(0, p, n); }

/* ---- state ------------------------------------------------------------------------------ */
typedef struct Frame {              /* one Fetch answer, freed with its last batch */
    uint8_t *base;                  /* malloc'd: its size prefix, then the answer */
    long size;                      /* of the answer, counted in ``held`` */
    long holders;
} Frame;

typedef struct Batch {
    const uint8_t *data;
    int32_t size, partition;
    Frame *frame;
    struct Batch *next;             /* in its partition's queue */
} Batch;

typedef struct {
    int64_t next_offset, end;
    Batch *head, *tail;
} Partition;

typedef struct {                    /* a Produce request in flight */
    Batch *batches[MAX_PARTITIONS];
    int count;
    size_t answer_bytes;
} Request;

static Partition parts[MAX_PARTITIONS];
static int n_parts;
static const char *topic, *target_topic;
static long budget, held;           /* bytes of Fetch answers not yet freed */
static long batches_done, requests_sent, fetches, empty_fetches;
static int64_t bytes_done;
static long target_reads;
static int32_t cid;

static int connect_to(const char *host, const char *port) {
    struct addrinfo hints = {0}, *addr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &addr) != 0) die("getaddrinfo");
    int fd = socket(addr->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, addr->ai_addr, addr->ai_addrlen) != 0) die("connect");
    freeaddrinfo(addr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void writev_all(int fd, struct iovec *iov, int n) {
    while (n > 0) {
        ssize_t w = writev(fd, iov, n > 1024 ? 1024 : n);
        if (w < 0) die("writev");
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
}

static void set_lowat(int fd, int want, int *lowat) {
    if (want < 1) want = 1;
    if (want != *lowat) {
        if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) != 0) die("SO_RCVLOWAT");
        *lowat = want;
    }
}

/* ---- fetching ------------------------------------------------------------------------- */
static int fetch_wanted(void) {
    if (held >= budget) return 0;
    for (int p = 0; p < n_parts; p++)
        if (parts[p].next_offset < parts[p].end) return 1;
    return 0;
}

static void send_fetch(int fd, int32_t partition_bytes) {
    uint8_t buf[64 + 256 + MAX_PARTITIONS * 16], *p = buf + 4;
    p = put16(p, 1);                /* Fetch */
    p = put16(p, 4);
    p = put32(p, ++cid);
    p = putstr(p, CLIENT_ID);
    p = put32(p, -1);               /* replica id */
    p = put32(p, 500);              /* max wait ms */
    p = put32(p, 1);                /* min bytes */
    p = put32(p, 50 * 1024 * 1024); /* max bytes */
    *p++ = 0;                       /* read uncommitted */
    p = put32(p, 1);
    p = putstr(p, topic);
    uint8_t *count_at = p;
    p += 4;
    int n = 0;
    for (int i = 0; i < n_parts; i++) {
        if (parts[i].next_offset >= parts[i].end) continue;
        p = put32(p, i);
        p = put64(p, parts[i].next_offset);
        p = put32(p, partition_bytes);
        n++;
    }
    put32(count_at, n);
    put32(buf, (int32_t)(p - buf - 4));
    struct iovec iov = {buf, (size_t)(p - buf)};
    writev_all(fd, &iov, 1);
    fetches++;
}

static void drop_frame(Frame *frame) {
    if (--frame->holders == 0) {
        held -= frame->size;
        free(frame->base);
        free(frame);
    }
}

/* Split one Fetch v4 answer (``base``: its size prefix, then ``size`` bytes) into the
 * partitions' queues. */
static void take_fetch(uint8_t *base, int32_t size) {
    Frame *frame = malloc(sizeof *frame);
    if (!frame) die("malloc");
    uint8_t *data = base + 4;
    frame->base = base;
    frame->size = size;
    frame->holders = 1;             /* this function's, dropped at the end */
    held += size;
    const uint8_t *p = data + 8, *end = data + size;   /* correlation id, throttle */
    int32_t topics = get32(p);
    p += 4;
    for (int t = 0; t < topics; t++) {
        p += 2 + get16(p);
        int32_t np = get32(p);
        p += 4;
        for (int i = 0; i < np; i++) {
            int32_t partition = get32(p);
            int16_t error = get16(p + 4);
            p += 4 + 2 + 8 + 8;
            int32_t aborted = get32(p);
            p += 4 + (aborted > 0 ? (size_t)aborted * 16 : 0);
            int32_t records = get32(p);
            p += 4;
            if (error) fail("fetch: partition %d error %d", partition, error);
            if (partition < 0 || partition >= n_parts)
                fail("fetch: partition %d, but only %d asked for", partition, n_parts);
            if (records < 0) records = 0;
            if (p + records > end)
                fail("fetch: %d record bytes, %ld left in the answer", records, (long)(end - p));
            const uint8_t *r = p, *rend = p + records;
            Partition *part = &parts[partition];
            while (rend - r >= 61) {
                int64_t base = get64(r);
                int32_t length = get32(r + 8);
                int32_t total = 12 + length;
                if (rend - r < total) break;           /* a partial batch at the end */
                if (r[16] != 2) fail("batch at offset %lld: magic %d", (long long)base, r[16]);
                if ((uint32_t)get32(r + 17) != crc32c(r + 21, (size_t)total - 21))
                    fail("batch at offset %lld: CRC mismatch", (long long)base);
                int64_t last = base + get32(r + 23);
                if (last >= part->next_offset && base < part->end) {
                    /* A client's batch has base offset 0 (outside the CRC): set in place. */
                    memset((uint8_t *)r, 0, 8);
                    Batch *b = malloc(sizeof *b);
                    if (!b) die("malloc");
                    b->data = r;
                    b->size = total;
                    b->partition = partition;
                    b->frame = frame;
                    b->next = NULL;
                    frame->holders++;
                    if (part->tail) part->tail->next = b; else part->head = b;
                    part->tail = b;
                    part->next_offset = last + 1;
                }
                r += total;
            }
            p += records;
        }
    }
    /* A broker that keeps answering with nothing below the end offsets asked for: stop. */
    empty_fetches = frame->holders > 1 ? 0 : empty_fetches + 1;
    if (empty_fetches > 20) fail("%ld Fetch answers in a row without a batch below the end "
                                 "offsets", empty_fetches);
    drop_frame(frame);
}

/* ---- producing ------------------------------------------------------------------------ */
static size_t produce_answer_bytes(int count) {
    /* size, correlation id, topic array, topic name, partition array, then per partition
     * index, error code, base offset, log append time; throttle time. */
    return 4 + 4 + 4 + 2 + strlen(target_topic) + 4 + (size_t)count * (4 + 2 + 8 + 8) + 4;
}

static int plan_produce(Request *req) {
    req->count = 0;
    for (int p = 0; p < n_parts; p++) {
        Partition *part = &parts[p];
        if (!part->head) continue;
        Batch *b = part->head;
        part->head = b->next;
        if (!part->head) part->tail = NULL;
        req->batches[req->count++] = b;
    }
    req->answer_bytes = produce_answer_bytes(req->count);
    return req->count;
}

static void send_produce(int fd, Request *req) {
    static uint8_t head[512], per[MAX_PARTITIONS][8];
    static struct iovec iov[1 + 2 * MAX_PARTITIONS];
    uint8_t *p = head + 4;
    p = put16(p, 0);                /* Produce */
    p = put16(p, 3);
    p = put32(p, ++cid);
    p = putstr(p, CLIENT_ID);
    p = put16(p, -1);               /* no transactional id */
    p = put16(p, -1);               /* acks=all */
    p = put32(p, 30000);
    p = put32(p, 1);
    p = putstr(p, target_topic);
    p = put32(p, req->count);
    int32_t size = (int32_t)(p - head - 4);
    iov[0].iov_base = head;
    iov[0].iov_len = (size_t)(p - head);
    for (int i = 0; i < req->count; i++) {
        Batch *b = req->batches[i];
        put32(per[i], b->partition);
        put32(per[i] + 4, b->size);
        iov[1 + 2 * i].iov_base = per[i];
        iov[1 + 2 * i].iov_len = 8;
        iov[2 + 2 * i].iov_base = (void *)b->data;
        iov[2 + 2 * i].iov_len = (size_t)b->size;
        size += 8 + b->size;
    }
    put32(head, size);
    writev_all(fd, iov, 1 + 2 * req->count);
    requests_sent++;
}

static void settle_produce(const uint8_t *answer, Request *req) {
    const uint8_t *p = answer + 4;  /* after the correlation id */
    if (get32(p) != 1) fail("produce answer: %d topics, 1 sent", get32(p));
    p += 4;
    p += 2 + get16(p);
    int32_t n = get32(p);
    p += 4;
    if (n != req->count) fail("produce answer: %d partitions, %d sent", n, req->count);
    for (int i = 0; i < n; i++, p += 4 + 2 + 8 + 8)
        if (get16(p + 4)) fail("produce: partition %d error %d", get32(p), get16(p + 4));
    for (int i = 0; i < req->count; i++) {
        Batch *b = req->batches[i];
        batches_done++;
        bytes_done += b->size;
        drop_frame(b->frame);
        free(b);
    }
}

static double seconds(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

int main(int argc, char **argv) {
    if (argc < 8 || argc > 12) {
        fprintf(stderr, "usage: %s source-host source-port target-host target-port topic "
                        "target-topic end-offsets [in-flight [answers-per-wakeup "
                        "[partition-fetch-bytes [budget]]]]\n", argv[0]);
        return 2;
    }
    topic = argv[5];
    target_topic = argv[6];
    for (char *s = argv[7]; *s && n_parts < MAX_PARTITIONS; n_parts++) {
        char *endp;
        parts[n_parts].end = strtoll(s, &endp, 10);
        if (endp == s || parts[n_parts].end < 0)
            fail("bad end offset list at partition %d", n_parts);
        s = *endp == ',' ? endp + 1 : endp;
    }
    long in_flight = argc > 8 ? atol(argv[8]) : 5;
    long per_wakeup = argc > 9 ? atol(argv[9]) : 3;
    long partition_bytes = argc > 10 ? atol(argv[10]) : 2 * 1024 * 1024;
    budget = argc > 11 ? atol(argv[11]) : 64L * 1024 * 1024;
    if (n_parts < 1 || in_flight < 1 || in_flight > MAX_IN_FLIGHT || per_wakeup < 1
        || partition_bytes < 1024 || budget < partition_bytes) {
        fprintf(stderr, "mirror_floor: need 1..%d partitions, in-flight 1..%d, answers per "
                        "wake-up >= 1, partition fetch bytes >= 1024 <= budget\n",
                MAX_PARTITIONS, MAX_IN_FLIGHT);
        return 2;
    }
    if (per_wakeup > in_flight - 1) per_wakeup = in_flight > 1 ? in_flight - 1 : 1;
    init_crc();
    int src = connect_to(argv[1], argv[2]), tgt = connect_to(argv[3], argv[4]);

    static Request reqs[MAX_IN_FLIGHT];
    long first = 0, outstanding = 0;            /* ring of requests in flight */
    uint8_t *answers = malloc(1 << 20);
    size_t answers_end = 0;
    int tgt_lowat = 1, src_lowat = 1;
    int fetching = 0;
    uint8_t size_buf[4];
    size_t size_got = 0;
    uint8_t *frame = NULL;                      /* Fetch answer being read, size in front */
    size_t frame_size = 0, frame_got = 0;
    if (!answers) die("malloc");

    struct rusage r0, r1;
    struct timespec t0, t1;
    getrusage(RUSAGE_SELF, &r0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (!fetching && fetch_wanted()) {
            send_fetch(src, (int32_t)partition_bytes);
            fetching = 1;
            size_got = 0;
        }
        while (outstanding < in_flight) {
            Request *req = &reqs[(first + outstanding) % MAX_IN_FLIGHT];
            if (!plan_produce(req)) break;
            send_produce(tgt, req);
            outstanding++;
        }
        if (!fetching && !outstanding) {
            int left = 0;
            for (int p = 0; p < n_parts; p++) left |= parts[p].head != NULL;
            if (!left && !fetch_wanted()) break;
            if (!left) fail("stalled: %ld bytes held of a %ld budget", held, budget);
        }
        /* The target wakes the loop once per <per_wakeup> answers while that many are out. */
        size_t want = 1;
        if (outstanding >= per_wakeup) {
            want = 0;
            for (long i = 0; i < per_wakeup; i++)
                want += reqs[(first + i) % MAX_IN_FLIGHT].answer_bytes;
            want = want > answers_end ? want - answers_end : 1;
        }
        set_lowat(tgt, (int)want, &tgt_lowat);
        if (fetching) {
            size_t rest = frame ? frame_size - frame_got : 4 - size_got;
            set_lowat(src, (int)(rest < FRAME_WAKE_BYTES ? rest : FRAME_WAKE_BYTES), &src_lowat);
        }
        struct pollfd pf[2] = {{.fd = tgt, .events = outstanding ? POLLIN : 0},
                               {.fd = src, .events = fetching ? POLLIN : 0}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR) die("poll");
        if (pf[0].revents) {
            ssize_t r = recv(tgt, answers + answers_end, (1 << 20) - answers_end, MSG_DONTWAIT);
            target_reads++;
            if (r <= 0) die("recv target");
            answers_end += (size_t)r;
            size_t at = 0;
            while (outstanding && answers_end - at >= 4) {
                size_t n = (size_t)get32(answers + at) + 4;
                if (answers_end - at < n) break;
                Request *req = &reqs[first % MAX_IN_FLIGHT];
                if (n != req->answer_bytes)
                    fail("produce answer of %ld bytes, %ld expected", (long)n,
                         (long)req->answer_bytes);
                settle_produce(answers + at + 4, req);
                first++;
                outstanding--;
                at += n;
            }
            memmove(answers, answers + at, answers_end - at);
            answers_end -= at;
        }
        if (pf[1].revents) {
            if (!frame) {
                ssize_t r = recv(src, size_buf + size_got, 4 - size_got, MSG_DONTWAIT);
                if (r <= 0) die("recv source");
                size_got += (size_t)r;
                if (size_got == 4) {
                    frame_size = (size_t)get32(size_buf);
                    frame = malloc(frame_size + 4);     /* the size kept in front */
                    if (!frame) die("malloc");
                    memcpy(frame, size_buf, 4);
                    frame_got = 0;
                }
            } else {
                ssize_t r = recv(src, frame + 4 + frame_got, frame_size - frame_got,
                                 MSG_DONTWAIT);
                if (r <= 0) die("recv source");
                frame_got += (size_t)r;
            }
            if (frame && frame_got == frame_size) {
                take_fetch(frame, (int32_t)frame_size);
                frame = NULL;
                fetching = 0;
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    getrusage(RUSAGE_SELF, &r1);
    printf("{\"batches\": %ld, \"bytes\": %lld, \"fetches\": %ld, \"requests\": %ld, "
           "\"wall_s\": %.6f, \"user_s\": %.6f, \"system_s\": %.6f, \"context_switches\": %ld, "
           "\"target_reads\": %ld}\n",
           batches_done, (long long)bytes_done, fetches, requests_sent,
           (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
           seconds(r1.ru_utime) - seconds(r0.ru_utime),
           seconds(r1.ru_stime) - seconds(r0.ru_stime),
           (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw), target_reads);
    return 0;
}
