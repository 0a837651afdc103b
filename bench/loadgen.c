/* Closed-loop NPLT load generator for bench/roundtrip.py: one thread, epoll, non-blocking sockets.
 *
 * Opens CONNS connections; each optionally sends a HELLO frame, then keeps INFLIGHT request frames
 * in flight: every reply frame of type REPLY_TYPE is counted and answered with the next request.
 * The first SKIP complete frames on a connection are not replies (the HELLO reply, a v2 greeting).
 * FRAGMENT frames (0x7F) are not counted (a fragmented reply counts once, on its final frame), nor
 * are v3 events (0x30-0x38, e.g. SESSION_EVENT); any other frame type is counted as an error. Request payloads come from a printf template with two
 * unsigned arguments: the request id (1, 2, ... per connection) and a "before" value that walks
 * down a session of BEFORE_MAX messages by 50 (for HISTORY_REQUEST pages; ignored by other
 * templates).
 *
 * Output on stdout (line buffered), which roundtrip.py reads to sample the server's CPU:
 *   "start\n" after every connection is set up and WARMUP seconds have passed,
 *   "end COUNT ELAPSED_S CPU_S ERRORS\n" after SECONDS more (CPU_S: this process, user + system).
 *
 *   loadgen HOST PORT CONNS INFLIGHT WARMUP_S SECONDS HELLO_JSON|- SKIP REQ_TYPE REQ_TEMPLATE
 *           REPLY_TYPE BEFORE_MAX
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RBUF (1 << 20)
#define WBUF (1 << 16)

typedef struct {
    int fd, idx;
    unsigned seq, id, skip;
    size_t rlen, wlen;
    int want_out;
    unsigned char *rbuf, *wbuf;
} conn_t;

static const char *tmpl;
static int req_type, reply_type, efd;
static unsigned before_max;
static long long count, errors;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void put_frame(conn_t *c, int type, const char *payload, size_t n) {
    if (c->wlen + 5 + n > WBUF) {
        fprintf(stderr, "loadgen: write buffer full\n");
        exit(2);
    }
    unsigned char *p = c->wbuf + c->wlen;
    p[0] = (unsigned char)type;
    p[1] = (c->seq >> 8) & 0xFF;
    p[2] = c->seq & 0xFF;
    p[3] = (n >> 8) & 0xFF;
    p[4] = n & 0xFF;
    memcpy(p + 5, payload, n);
    c->wlen += 5 + n;
    c->seq = (c->seq + 1) & 0xFFFF;
}

static void put_request(conn_t *c) {
    char buf[512];
    unsigned id = ++c->id, before = 0;
    if (before_max > 100)
        before = 51 + (unsigned)(((unsigned long long)c->idx * 7919u + id) * 50u % (before_max - 100));
    int n = snprintf(buf, sizeof buf, tmpl, id, before);
    put_frame(c, req_type, buf, (size_t)n);
}

static void flush(conn_t *c) {
    size_t off = 0;
    while (off < c->wlen) {
        ssize_t w = write(c->fd, c->wbuf + off, c->wlen - off);
        if (w < 0) {
            if (errno == EAGAIN) break;
            if (errno == EINTR) continue;
            die("write");
        }
        off += (size_t)w;
    }
    memmove(c->wbuf, c->wbuf + off, c->wlen - off);
    c->wlen -= off;
    int want = c->wlen > 0;
    if (want != c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
        if (epoll_ctl(efd, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl");
        c->want_out = want;
    }
}

static void on_read(conn_t *c) {
    for (;;) {
        ssize_t r = read(c->fd, c->rbuf + c->rlen, RBUF - c->rlen);
        if (r < 0) {
            if (errno == EAGAIN) break;
            if (errno == EINTR) continue;
            die("read");
        }
        if (r == 0) {
            fprintf(stderr, "loadgen: the server closed connection %d\n", c->idx);
            exit(3);
        }
        c->rlen += (size_t)r;
        size_t pos = 0;
        while (c->rlen - pos >= 5) {
            unsigned char *h = c->rbuf + pos;
            size_t ln = ((size_t)h[3] << 8) | h[4];
            if (c->rlen - pos < 5 + ln) break;
            int t = h[0];
            pos += 5 + ln;
            if (t == 0x7F || (t >= 0x30 && t <= 0x38)) continue; /* fragments; v3 events (not replies) */
            if (c->skip) {
                c->skip--;
                continue;
            }
            if (t == reply_type) {
                count++;
                put_request(c);
            } else {
                errors++;
                if (errors <= 3)
                    fprintf(stderr, "loadgen: unexpected frame type 0x%02x: %.*s\n", t, (int)(ln > 200 ? 200 : ln),
                            (char *)h + 5);
            }
        }
        memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
        c->rlen -= pos;
        if ((size_t)r < RBUF / 2) break;
    }
    flush(c);
}

int main(int argc, char **argv) {
    if (argc != 13) {
        fprintf(stderr,
                "usage: loadgen HOST PORT CONNS INFLIGHT WARMUP_S SECONDS HELLO_JSON|- SKIP REQ_TYPE "
                "REQ_TEMPLATE REPLY_TYPE BEFORE_MAX\n");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *host = argv[1], *hello = argv[7];
    int port = atoi(argv[2]), conns = atoi(argv[3]), inflight = atoi(argv[4]);
    double warmup = atof(argv[5]), seconds = atof(argv[6]);
    unsigned skip = (unsigned)atoi(argv[8]);
    req_type = (int)strtol(argv[9], NULL, 0);
    tmpl = argv[10];
    reply_type = (int)strtol(argv[11], NULL, 0);
    before_max = (unsigned)atoi(argv[12]);

    efd = epoll_create1(0);
    if (efd < 0) die("epoll_create1");
    conn_t *cs = calloc((size_t)conns, sizeof(conn_t));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) die("inet_pton");
    for (int i = 0; i < conns; i++) {
        conn_t *c = &cs[i];
        c->idx = i;
        c->skip = skip;
        c->rbuf = malloc(RBUF);
        c->wbuf = malloc(WBUF);
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        if (c->fd < 0) die("socket");
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) die("connect");
        if (fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK) < 0) die("fcntl");
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(efd, EPOLL_CTL_ADD, c->fd, &ev) < 0) die("epoll_ctl");
        if (strcmp(hello, "-") != 0) put_frame(c, 0x20, hello, strlen(hello));
        for (int k = 0; k < inflight; k++) put_request(c);
        flush(c);
    }
    struct epoll_event evs[256];
    double t_start = now() + warmup, t_end = t_start + seconds, cpu0 = 0;
    long long count0 = 0;
    int started = 0;
    for (;;) {
        double t = now();
        if (!started && t >= t_start) {
            started = 1;
            count0 = count;
            cpu0 = cpu();
            t_start = t;
            t_end = t + seconds;
            printf("start\n");
        } else if (started && t >= t_end) {
            printf("end %lld %.6f %.6f %lld\n", count - count0, t - t_start, cpu() - cpu0, errors);
            return 0;
        }
        int n = epoll_wait(efd, evs, 256, 5);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_read(c);
            else if (evs[i].events & EPOLLOUT) flush(c);
        }
    }
}
