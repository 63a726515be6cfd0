/* SPDX-License-Identifier: MIT */
/* bench.h: private header of shmref-bench, the benchmark suite of shmrefd (not installed).
 * One binary plays every role: the runner (main.c and the scenario-*.c files), the
 * servers it spawns with `--serve ROLE` (server.c), and the shmrefd daemons it starts
 * (daemon.c). Functions that can fail return >= 0 or -errno, as in libshmref. */
#ifndef SHMREF_BENCH_H
#define SHMREF_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <shmref/shmref.h>

#define BENCH_PAGE 4096u              /* stride of the page touch: one read per 4 KiB */
#define BENCH_CTL_FD 3                /* a spawned server's end of its control socket */
#define BENCH_MAX_RESULTS 512

/* ---- options of one run (main.c) ---- */
struct bench_opts {
    bool smoke;                       /* few iterations, full verification, small sizes */
    bool big;                         /* add the 800 MB round trip */
    bool arrow;                       /* --arrow: the units-of-work scenario only */
    const char *only;                 /* comma list of scenarios, NULL: all */
    const char *json_path;            /* where to write the records, NULL: nowhere */
    const char *plot_path;            /* gnuplot data file of the round trips, or NULL */
    const char *shmrefd;              /* the daemon binary */
    const char *tmpdir;               /* sockets and daemon logs live here */
    /* placement only (--method, --placement, --iters): one method, one placement, more
     * round trips, for a profiler or `perf stat` around one row */
    const char *method;               /* NULL: every method */
    int placement;                    /* -1: every placement, else 0 unpinned, 1 same cpu, 2 cross cpu */
    unsigned iters;                   /* 0: the default (1,000) */
};

/* ---- stats.c: clocks and samples ---- */
uint64_t stats_now_ns(void);
struct samples {
    double *ms;
    size_t n, cap;
};
int samples_init(struct samples *s, size_t cap);
void samples_add(struct samples *s, double ms);
void samples_free(struct samples *s);
/* The q-quantile (0..1) of the samples, nearest rank; 0 if there are none. */
double samples_quantile(const struct samples *s, double q);

/* ---- report.c: the records of a run ---- */
struct result {
    char scenario[16];
    char method[32];
    char pool[12];                    /* "dev-shm", "huge", or "" */
    char label[24];                   /* what the size column shows */
    uint64_t size_bytes;
    uint64_t iterations;
    double median_ms, p90_ms;
    char ratio_vs[48];                /* method the ratio is taken against, "" for none */
    double ratio;                     /* median / median of ratio_vs */
    double ops_per_s;                 /* throughput rows, else 0 */
    uint32_t clients;                 /* throughput rows: client processes */
    uint64_t live_leases, rss_bytes;  /* scale rows */
    double bytes_per_lease;
    double waits;                     /* waits for shmrefd per call (round trip), -1: not counted */
    double messages;                  /* messages sent to shmrefd per call (one-way ones too), -1: not counted */
    char note[96];
    char skipped[240];                /* non-empty: not measured, and why */
    char error[160];                  /* non-empty: the method failed */
};
struct result *report_add(const char *scenario, const char *method, const char *pool,
                          uint64_t size_bytes, const char *label);
/* report_fill: median and p90 of s into r. */
void report_fill(struct result *r, const struct samples *s);
struct result *report_find(const char *scenario, const char *method, const char *pool,
                           uint64_t size_bytes);
/* report_ratio: r->ratio = r->median / base->median, naming base in r->ratio_vs. */
void report_ratio(struct result *r, const struct result *base);
size_t report_count(void);
struct result *report_at(size_t i);
void report_print_table(void);
void report_print_targets(void);
int report_write_json(const char *path);
int report_write_plot(const char *path);
/* Number of rows with an error. */
int report_errors(void);

/* ---- payload.c: what the arrays hold and how the output is checked ---- */
/* The client fills every word of its input (fresh per iteration); a server's output is
 * its own, each word the input's plus one (payload_transform). The first word of every
 * 4 KiB page is the page's stamp, so one word per page also catches a stale output. */
uint64_t payload_stamp(uint64_t iter, size_t page);
void payload_stamp_pages(void *buf, size_t size, uint64_t iter);
/* Fill every 8-byte word (smoke mode: the full array is checked). */
void payload_fill(void *buf, size_t size, uint64_t iter);
/* The server's work: dst = src + 1 for every step-th word (1: every word and the tail;
 * BENCH_PAGE / 8: one word per page; 0: the first word only). */
void payload_transform(void *dst, const void *src, size_t size, size_t step);
/* What word i of the output of iteration iter must hold. */
uint64_t payload_out_word(uint64_t iter, size_t i);
/* Compare an output with what the server must have written: one word per page (full:
 * every word and the tail). Returns the number of wrong words. */
size_t payload_check(const void *buf, size_t size, uint64_t iter, bool full);
/* Compare every word of a buffer with the input of iteration iter (as payload_fill made it). */
size_t payload_check_input(const void *buf, size_t size, uint64_t iter);
/* Read one word per page, whatever it holds; returns their xor (keeps the reads). */
uint64_t payload_touch(const void *buf, size_t size);
/* A heap buffer of size bytes, every page written once (faulted in), or NULL. */
void *payload_alloc_warm(size_t size);
void payload_free(void *buf, size_t size);

/* ---- b64.c ---- */
size_t b64_encoded_len(size_t n);
size_t b64_encode(const void *src, size_t n, char *dst);
/* Decodes len characters into dst (cap bytes); returns the byte count or -EINVAL. */
ssize_t b64_decode(const char *src, size_t len, void *dst, size_t cap);

/* ---- wire.c: sockets, frames, spawning ---- */
int wire_send_all(int fd, const void *buf, size_t len);
int wire_recv_all(int fd, void *buf, size_t len);
/* A frame on a stream socket: a 64-bit length, then the bytes. */
int wire_send_frame(int fd, const void *hdr, size_t hlen, const void *body, size_t blen);
/* Receives a frame into buf (cap bytes); its length in *ret_len. -EMSGSIZE if larger. */
int wire_recv_frame(int fd, void *buf, size_t cap, size_t *ret_len);
/* Receives a frame's length only; the caller reads the body with wire_recv_all. */
int wire_recv_frame_len(int fd, uint64_t *ret_len);
/* A frame of an array's size and a file's path, NUL-terminated (the file methods). */
struct wire_path {
    uint64_t size;
    char path[120];
};
/* wire_recv_path: one such frame (-EPROTO if it is another size); path NUL-terminated. */
int wire_recv_path(int fd, struct wire_path *m);
/* wire_spawn: fork and exec this binary as `--serve role [args...]` with one end of a
 * socketpair of type (SOCK_STREAM or SOCK_SEQPACKET) as its fd 3; the other end in
 * *ret_fd. The child dies with the runner (PR_SET_PDEATHSIG). */
int wire_spawn(const char *role, int type, char *const extra[], int *ret_fd, pid_t *ret_pid);
/* wire_reap: closes fd (the child sees EOF) and waits for pid; -ECHILD if it failed. */
int wire_reap(int fd, pid_t pid);
/* wire_pin: run pid (0: this process) on cpu only, or on every CPU if cpu < 0. */
int wire_pin(pid_t pid, int cpu);
/* Path of this executable (for wire_spawn). */
const char *wire_self_exe(void);

/* ---- daemon.c: the shmrefd daemons and the huge-page mount ---- */
struct daemon {
    char name[16];                    /* "dev-shm", "huge", "scale" */
    char socket[256];
    char log[256];
    pid_t pid;
};
/* daemon_start: runs the shmrefd binary with args (NULL-terminated) on a socket in
 * tmpdir and waits until it answers. */
int daemon_start(struct daemon *d, const struct bench_opts *o, const char *name,
                 const char *pool_dir, const char *pool_size, char *const extra[]);
/* daemon_stop: SIGTERM, wait (SIGKILL after 5 s). Accepts a daemon that never started. */
void daemon_stop(struct daemon *d);
/* daemon_has_option: does the daemon's --help mention opt? */
bool daemon_has_option(const struct bench_opts *o, const char *opt);
/* daemon_counter: one number of a status snapshot asked over conn (0 if it cannot be had). */
uint64_t daemon_counter(shmref_conn *conn, const char *path);
/* daemon_rss: VmRSS of the daemon in bytes, or 0. */
uint64_t daemon_rss(const struct daemon *d);
/* daemon_print_log: the last lines of its log to stderr (after a failure). */
void daemon_print_log(const struct daemon *d);
/* A private tmpfs with huge=always. 0 and the directory in dir, or -errno with the
 * reason in why. Unmounted by daemon_huge_unmount (and by the kernel with the mount
 * namespace, if main.c could make one). */
int daemon_huge_mount(const char *size, char *dir, size_t dir_cap, char *why, size_t why_cap);
void daemon_huge_unmount(void);
/* Raise RLIMIT_NOFILE (inherited by the daemons) to n if possible; returns the limit. */
uint64_t daemon_raise_nofile(uint64_t n);
/* kB of ShmemPmdMapped + FilePmdMapped in this process (is the huge pool huge?). */
uint64_t daemon_self_pmd_kb(void);

/* ---- the round-trip methods (methods-*.c) ---- */
struct rt_ctx {
    size_t size;                      /* bytes of the array */
    bool full;                        /* smoke: fill and check every word */
    void *in, *out;                   /* the client's warm heap arrays */
    void *tmp;                        /* scratch: text of base64, middle of the floors */
    size_t tmp_cap;
    int ctl;                          /* control socket to the server, or -1 */
    pid_t server;
    const char *socket;               /* shmrefd socket of this row, or NULL */
    shmref_conn *conn;
    void *state;                      /* method-private */
    int pin_client, pin_server;       /* CPU of the client (this process) and of the server,
                                       * daemon and RouDi; -1: any (placement rows) */
    bool placed;                      /* pin as pin_client/pin_server say */
    size_t bad;                       /* wrong words seen */
    uint64_t untimed_ns;              /* time of full output checks inside calls, taken
                                       * out of the samples (run_loop) */
    char err[160];
};

struct rt_method {
    const char *name;
    const char *role;                 /* server role, NULL: no server */
    bool shmref;                      /* runs against a daemon, once per pool kind */
    bool floor;                       /* not a transport: a reference cost */
    bool nocache;                     /* client and server run with SHMREF_MAP_CACHE=0 */
    bool iox;                         /* iceoryx: both sides in shmref-bench-iox (iox.c) */
    bool notouch;                     /* write and read the first word only, not every page */
    int (*open)(struct rt_ctx *ctx);              /* per size, untimed; may be NULL */
    void (*prepare)(struct rt_ctx *ctx, uint64_t iter);  /* untimed; may be NULL */
    int (*call)(struct rt_ctx *ctx, uint64_t iter);      /* one timed round trip */
    void (*close)(struct rt_ctx *ctx);            /* may be NULL */
};

extern const struct rt_method rt_floor_memcpy2, rt_floor_memcpy3, rt_floor_touch;
extern const struct rt_method rt_unix_bytes, rt_unix_base64;
extern const struct rt_method rt_binref_fresh, rt_binref_pool4;
extern const struct rt_method rt_shmref_1copy, rt_shmref_0copy;
extern const struct rt_method rt_shmref_1copy_nocache, rt_shmref_0copy_nocache;
extern const struct rt_method rt_shmref_pubsub, rt_shmref_pubsub_notouch;
extern const struct rt_method rt_iceoryx, rt_iceoryx_notouch;
extern const struct rt_method rt_shm_pair, rt_table_floor;

/* rt_fail: formats ctx->err and returns err (negative). */
int rt_fail(struct rt_ctx *ctx, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prepare that stamps (or fills) the heap input: shared by the heap-based methods. */
void rt_prepare_heap(struct rt_ctx *ctx, uint64_t iter);
/* The client's read of the output: one word per page, timed; then every word compared
 * with what it must be, untimed (ctx->untimed_ns). */
void rt_check_output(struct rt_ctx *ctx, const void *out, uint64_t iter);
/* The pub/sub rows' read and check: one word per page (every word in smoke mode), timed. */
void rt_check_stamps(struct rt_ctx *ctx, const void *out, uint64_t iter);

/* Server side of each role (server.c dispatches); fd is the control socket. */
int srv_bytes(int fd);
int srv_base64(int fd);
int srv_binref_fresh(int fd);
int srv_binref_pool4(int fd);
int srv_shmref(int fd, const char *socket, bool zero_copy);
/* The iceoryx work through shmrefd: acquire the request, read it, lease a reply, write it,
 * publish it, release both (mode 0: the first word, 1: one word per page, 2: all). */
int srv_shmref_pubsub(int fd, const char *socket, int mode);
int srv_echo(int fd, bool with_fd);
/* methods-table.c: two reused segments; the handoff table without a daemon. */
int srv_shm_pair(int fd);
int srv_table_floor(int fd);
/* Warm heap buffer number slot (0..3) of at least size bytes, kept across calls: it
 * grows (and is faulted in) when a larger size comes, never shrinks. NULL on ENOMEM. */
void *srv_heap(int slot, size_t size);

/* server.c */
int server_main(int argc, char **argv);

/* ---- scenarios ---- */
/* The pools the shmrefd rows run on: /dev/shm with 4 KiB pages, a huge=always tmpfs of
 * our own, and whatever the daemon does by default (its own huge-page pool, if it has
 * one and may mount it). */
enum { POOL_DEVSHM, POOL_HUGE, POOL_AUTO, POOL_N };
extern const char *const bench_pool_names[POOL_N];
struct daemons {
    struct daemon d[POOL_N];
    bool have[POOL_N];
    char why[POOL_N][200];            /* why a pool's rows are skipped */
    char huge_dir[64];
};
int scenario_roundtrip(const struct bench_opts *o, const struct daemons *ds);
int scenario_lease(const struct bench_opts *o, const struct daemons *ds);
/* scenario_lease_many: lease_many(1024) of warm 4 KiB buffers against 4 x lease_many(256),
 * and how soon a SIGKILLed client with 200 unread leases is reclaimed (no timer cliffs). */
int scenario_lease_many(const struct bench_opts *o, const struct daemons *ds);
int scenario_throughput(const struct bench_opts *o, const struct daemons *ds);
int scenario_scale(const struct bench_opts *o);
/* 8 kB round trips of unix-bytes, shmref zero-copy and iceoryx, unpinned, all on one CPU
 * and client against server (and daemon, RouDi) on different CPUs. */
int scenario_placement(const struct bench_opts *o, const struct daemons *ds);

/* ---- scenario-iox.c: RouDi and the iceoryx rows ---- */
int iox_roudi_start(const struct bench_opts *o);
void iox_roudi_stop(void);
pid_t iox_roudi_pid(void);
/* One iceoryx row: warmup + iters round trips; skipped rows say why. */
void iox_row(const struct bench_opts *o, size_t size, unsigned warmup, unsigned iters, bool touch,
             int pin_client, int pin_server, struct result *res);
/* The producer's side of a unit of work against one memcpy (run by --arrow, --only arrow
 * and --smoke; not part of a default run). */
int scenario_arrow(const struct bench_opts *o, const struct daemons *ds);
/* Producer process makes a column, consumer sums it: in one process, and through a unit. */
int scenario_arrow_e2e(const struct bench_opts *o, const struct daemons *ds);

#endif
