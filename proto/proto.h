/* SPDX-License-Identifier: MIT */
/* proto.h: the shmrefd wire format, shared by the daemon, libshmref and shmrefctl.
 * Private header (not installed). Pure code: no I/O, no logging; decoding is bounded
 * and checks every field's type and range, so it is safe on hostile input.
 *
 * Every message is one SOCK_SEQPACKET datagram holding one msgpack array:
 *   [op, id, field...]
 * `op` says what it is (requests 1..63, replies op + 64, error 127); `id` is chosen by
 * the client and echoed in the reply, so requests can be pipelined. Fields are
 * positional per op; trailing extra fields are ignored (room for later versions).
 *
 * Version 3 (this one): an acquire reply may say PROTO_BUF_RETIRE (the buffer is retired
 * when its last handle goes: the client does not cache its mapping); a lease or lease_many
 * may say PROTO_LEASE_STOCK (a lease kept ready in a client's stock, served only from the
 * daemon's stock reserve); a client may ask retain (PROTO_OP_RETAIN, when the daemon agreed
 * PROTO_FEAT_RETAIN). The layout of every other message is version 2's.
 *
 * Version 2: a lease reply carries the token its buffer will be published
 * under, so a plain publish needs no reply (PROTO_PUBLISH_NOREPLY); an acquire may wait
 * (wait_ms) for a buffer that is leased but not published yet; a lease may wait (wait_ms)
 * for quota or pool space; lease_many and release_many carry up to PROTO_MAX_BATCH
 * leases in one message; the write-only `gen` field is gone. Every field is required.
 * The hello and error layouts never change between versions, so a peer of another
 * version always gets a readable EPROTONOSUPPORT error naming both versions. */
#ifndef SHMREF_PROTO_H
#define SHMREF_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_VERSION 3

/* Limits that hold for every peer, whatever it negotiates. */
#define PROTO_MAX_REQUEST  (64 * 1024)   /* bytes of one client->daemon message */
#define PROTO_MAX_REPLY    (192 * 1024)  /* bytes of one daemon->client message */
#define PROTO_MAX_DEPTH    8             /* nesting of arrays and maps */
#define PROTO_MAX_META     (16 * 1024)   /* bytes of metadata attached at publish */
#define PROTO_MAX_NAME     64            /* bytes of the client name sent in hello */
#define PROTO_MAX_ERRMSG   512           /* bytes of an error message */
#define PROTO_TOKEN_LEN    16            /* 128-bit capability token */
#define PROTO_MAX_BATCH    32            /* leases or handles in one lease_many/release_many */
#define PROTO_MAX_LEASE_WAIT_MS   600000 /* the longest a lease may wait for quota or space */
#define PROTO_MAX_ACQUIRE_WAIT_MS 60000  /* the longest an acquire waits for a publish */
/* The most idle mappings a client keeps cached (libshmref's mapping cache). A daemon's
 * fd-once set holds twice max-leases plus this many buffers, so a client that forgets
 * what it unmaps is never sent an fd it still has. Not on the wire: a bound both share. */
#define PROTO_MAX_IDLE_MAPPINGS 256

/* Feature bits announced in hello. */
#define PROTO_FEAT_NOREPLY_RELEASE (1u << 0) /* release with PROTO_RELEASE_NOREPLY */
/* The client keeps its mappings and says when it drops one (forget): the daemon then
 * sends a buffer's fd once per connection, not with every lease and acquire of it. */
#define PROTO_FEAT_FD_ONCE (1u << 1)

/* The daemon takes sealed publishes (PROTO_PUBLISH_SEALED); a client sends that flag
 * only when the daemon agreed to this bit in hello, so an older daemon is never asked. */
#define PROTO_FEAT_SEALED (1u << 2)

/* (1u << 3) was PROTO_FEAT_LEDGER, the table's forerunner (took, nudge): no longer agreed;
 * its bit stays unused. */

/* The client says bye (PROTO_OP_BYE) as its last message before it closes, and the
 * daemon then counts the end of the connection as a clean close (clients_closed) even if
 * leases were still on their way to it (the stock's refills), not as a client that died
 * holding them (clients_died). */
#define PROTO_FEAT_BYE (1u << 4)

/* The daemon knows private acquires (PROTO_ACQUIRE_PRIVATE): a client asks for one only
 * when the daemon agreed to this bit, so an older daemon, which ignores acquire flags and
 * would count the fd it sends (fd-once) for a mapping the client never forgets, is never
 * asked. Version 3. */
#define PROTO_FEAT_PRIVATE (1u << 5)

/* The daemon marks acquire replies of a buffer whose producer is another tenant
 * (PROTO_BUF_FOREIGN), so a client can refuse another uid's unsealed unit; without this
 * bit the client cannot tell and treats every unsealed unit as another uid's. (A high
 * bit: other additions take the next free ones.) */
#define PROTO_FEAT_FOREIGN (1u << 6)

/* The daemon knows PROTO_OP_RETAIN: a client sends it only when the daemon agreed this
 * bit, so an older daemon is never asked (libshmref says -EOPNOTSUPP at once). Version 3. */
#define PROTO_FEAT_RETAIN (1u << 7)

/* Same-tenant handoffs without the daemon: the tenant's table (proto/handoff.h). Only
 * with PROTO_FEAT_FD_ONCE. When the daemon agrees it, its hello reply carries two fds
 * (SCM_RIGHTS), in order: the uid's table memfd (O_RDWR, handoff_size(HANDOFF_MAX_SLOTS)
 * bytes) and this connection's journal memfd (O_RDWR, HANDOFF_MAX_SLOTS 32-bit counts),
 * both sealed F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL. The hello reply's layout does not
 * change. A daemon that cannot make them does not agree the bit. The client then may send
 * PROTO_OP_MAP, PROTO_OP_GIVEBACK and PROTO_OP_ADOPT. Version 3. */
#define PROTO_FEAT_TABLE (1u << 8)

/* Flags of a publish request. */
#define PROTO_PUBLISH_SEALED (1u << 0)  /* add F_SEAL_WRITE: publish-once, never recycled */
#define PROTO_PUBLISH_NOREPLY (1u << 1) /* no reply on success (the client knows the token
                                         * from the lease reply); an error still replies */

/* Flags of a lease or acquire reply. */
#define PROTO_BUF_SEALED (1u << 0) /* a sealed buffer: verify F_GET_SEALS before mapping */
/* Do not cache this mapping: the buffer is retired (never recycled) once no handle holds
 * it (another tenant mapped it, or it is sealed), or this mapping is not in the daemon's
 * record of the connection's mappings (its fd-once set is full). A client unmaps it when
 * its last local user goes. Version 3. */
#define PROTO_BUF_RETIRE (1u << 1)

/* Flags of a lease or lease_many request. */
/* A lease for the client's stock (kept ready, not asked for by a caller yet): served
 * only from the daemon's stock reserve, within the uid's stock cap, of a size up to the
 * reserve's largest class; refused EAGAIN otherwise (the client then leases plainly when
 * a caller asks). Counted as stock until the client publishes it. Version 3. */
#define PROTO_LEASE_STOCK (1u << 0)
/* A lease for the tenant's table (PROTO_FEAT_TABLE): a client's local lease found its
 * class's free list empty. The lease is a lease like any other; at its buffer's end the
 * buffer joins the uid's table (if it has one) instead of going back to the pool. */
#define PROTO_LEASE_TABLE (1u << 1)

/* Flags of an acquire request. */
/* A private acquire: the daemon attaches the buffer's fd to the reply even when this
 * connection already maps it (fd-once), and records nothing for that mapping (it is not
 * in the fd-once set): the client maps it MAP_PRIVATE (copy-on-write), never caches it
 * and never sends forget for it. Sent only to a daemon that agreed PROTO_FEAT_PRIVATE
 * (a daemon before this flag ignored every acquire flag: a client that gets no fd for a
 * buffer it has to map says -EOPNOTSUPP). Ignored on a version-2 connection. Version 3. */
#define PROTO_ACQUIRE_PRIVATE (1u << 0)
#define PROTO_BUF_FOREIGN (1u << 6) /* acquire: the producer is another tenant (uid) than the caller */

/* The previous protocol version, which both sides still speak (PROTOCOL.md, "Versions"):
 * the daemon serves a client whose hello says PROTO_VERSION_PREV (its reply says that
 * version too, and agrees only PROTO_FEAT_PREV), and libshmref says hello again in it to
 * a daemon that refused PROTO_VERSION saying it speaks PROTO_VERSION_PREV. What version 2
 * knew: the hello features below, and of a lease or acquire reply's flags only
 * PROTO_BUF_SEALED; it had no lease flags (PROTO_LEASE_STOCK is version 3's). */
#define PROTO_VERSION_PREV 2
#define PROTO_FEAT_PREV (PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_SEALED)
#define PROTO_BUF_PREV PROTO_BUF_SEALED

/* Flags of a release or release_many request. */
#define PROTO_RELEASE_NOREPLY (1u << 0) /* no reply on success; an error still replies */

enum proto_op {
    PROTO_OP_HELLO = 1,
    PROTO_OP_LEASE = 2,
    PROTO_OP_PUBLISH = 3,
    PROTO_OP_ACQUIRE = 4,
    PROTO_OP_RELEASE = 5,
    PROTO_OP_STATUS = 6,
    PROTO_OP_PING = 7,
    PROTO_OP_FORGET = 8,          /* no reply, ever */
    PROTO_OP_LEASE_MANY = 9,      /* all or nothing: one reply with every lease, or an error */
    PROTO_OP_RELEASE_MANY = 10,   /* every known handle is released; an error names the first unknown */
    PROTO_OP_TOOK = 11,           /* retired with the ledger: an unknown op now */
    PROTO_OP_NUDGE = 12,          /* retired with the ledger: an unknown op now */
    PROTO_OP_BYE = 13,            /* no reply, ever; the connection's last message (PROTO_FEAT_BYE) */
    PROTO_OP_RETAIN = 14,         /* one more pending acquire of retention (PROTO_FEAT_RETAIN) */
    PROTO_OP_MAP = 15,            /* the fd of a buffer in the uid's table (PROTO_FEAT_TABLE) */
    PROTO_OP_GIVEBACK = 16,       /* no reply, ever: a buffer's last local hold went, and it is
                                   * the daemon's (OUT) (PROTO_FEAT_TABLE) */
    PROTO_OP_ADOPT = 17,          /* a local lease becomes a daemon lease (PROTO_FEAT_TABLE) */
    PROTO_OP_REPLY = 64,          /* added to a request op in its reply */
    PROTO_OP_ERROR = 127,
};

/* One lease of a lease_many reply. has_fd: an fd for it is attached to the message (the
 * fds come in the order of the items that have one). */
struct proto_item {
    uint64_t handle, buf_id, size, capacity;
    uint8_t token[PROTO_TOKEN_LEN];
    uint32_t has_fd;
};

/* A decoded message. Pointers (name, meta, msg, body) point into the buffer that was
 * decoded and are valid as long as that buffer is. */
struct proto_msg {
    uint32_t op;
    uint32_t id;
    union {
        struct { uint32_t version; uint64_t features; const char *name; uint32_t name_len; } hello;
        struct {
            uint32_t version; uint64_t features;
            uint32_t max_request; uint64_t max_lease; uint32_t max_leases; uint32_t max_meta;
            uint64_t pid;
        } hello_reply;
        /* wait_ms > 0: wait up to that long (at most PROTO_MAX_LEASE_WAIT_MS) for quota
         * or pool space instead of EDQUOT/ENOSPC at once; -ETIMEDOUT after it. flags:
         * PROTO_LEASE_STOCK (which never waits). */
        struct { uint64_t size; uint32_t flags; uint32_t wait_ms; } lease;
        /* The reply to lease and acquire carries one fd: the buffer (O_RDWR for a lease,
         * O_RDONLY for an acquire), unless PROTO_FEAT_FD_ONCE is on and this connection
         * was sent it before and has not forgotten it. buf_id is unique per backing file
         * for the daemon's lifetime, so clients key their mapping caches by it (never by
         * fd number). token: for a lease, the token the buffer will be published under
         * (the producer's descriptor is {token, published size}); for an acquire, the
         * descriptor's. */
        struct {
            uint64_t handle; uint64_t buf_id;
            uint64_t size; uint64_t capacity;
            uint8_t token[PROTO_TOKEN_LEN];
            const uint8_t *meta; uint32_t meta_len;
            uint32_t flags;     /* PROTO_BUF_* */
        } lease_reply, acquire_reply;
        /* keep_ms: the daemon retains the buffer that long for every consumer that comes
         * (fan-out); max_acquires (0 = no cap): the retention ends at that many acquires.
         * flags: PROTO_PUBLISH_*. */
        struct {
            uint64_t handle; uint64_t size; uint32_t keep_ms;
            const uint8_t *meta; uint32_t meta_len;
            uint32_t flags; uint32_t max_acquires;
        } publish;
        struct { uint8_t token[PROTO_TOKEN_LEN]; uint64_t size; } publish_reply;
        /* wait_ms > 0: a buffer leased under this token but not published yet is waited
         * for, up to that long (at most PROTO_MAX_ACQUIRE_WAIT_MS); ENOENT if its producer
         * releases it or goes first, or the wait runs out. 0: ENOENT at once. */
        struct { uint8_t token[PROTO_TOKEN_LEN]; uint32_t flags; uint32_t wait_ms; } acquire;
        struct { uint64_t handle; uint32_t flags; } release;
        /* n (1..PROTO_MAX_BATCH) leases, as one lease each would ask */
        struct { uint32_t n; uint32_t flags; uint32_t wait_ms; uint64_t sizes[PROTO_MAX_BATCH]; } lease_many;
        struct { uint32_t n; struct proto_item items[PROTO_MAX_BATCH]; } lease_many_reply;
        /* n (1..PROTO_MAX_BATCH) handles; flags: PROTO_RELEASE_NOREPLY */
        struct { uint32_t n; uint32_t flags; uint64_t handles[PROTO_MAX_BATCH]; } release_many;
        /* forget: the client unmapped buffer buf_id (its writable or read-only mapping). */
        struct { uint64_t buf_id; uint32_t writable; } forget;
        /* retain: the published buffer under token, which this connection holds (a handle,
         * or a hold in its journal), gets one more acquire of retention: a
         * retention that ends at the acquire after those counted so far (one more than it
         * had, if it had one) or at now + keep_ms (keep_ms >= 1; the later deadline of the
         * two if it had one). Only its tenant's uid may ask (EPERM). Its reply is empty. */
        struct { uint8_t token[PROTO_TOKEN_LEN]; uint32_t keep_ms; } retain;
        /* map: the fd of buffer buf_id, in the table of the connection's uid; its reply is
         * shaped as a lease reply (handle 0, size = capacity, no token) with the fd (O_RDWR)
         * attached, always (a client asks only for what it does not map). giveback: the
         * client's last give of buf_id said HANDOFF_TO_DAEMON. adopt: the client's local
         * lease of buf_id under seq (its word's generation) becomes a daemon lease: the
         * reply is a lease reply (a handle of this connection, a fresh token, no fd), after
         * which the client gives its local hold; the publish that follows is the daemon's
         * (retention, seals). */
        struct { uint64_t buf_id; } map, giveback;
        struct { uint64_t buf_id; uint32_t seq; } adopt;
        /* The status body is itself a msgpack map, carried as bin so the envelope stays
         * flat; decode it with proto_check() before unpacking. */
        struct { const uint8_t *body; uint32_t body_len; } status_reply;
        /* code is a positive Linux errno value (EDQUOT, ENOSPC, ENOENT, EACCES ...). */
        struct { int32_t code; const char *msg; uint32_t msg_len; } error;
    } u;
};

/* proto_check: verify that buf[0..len) is exactly one msgpack object, nested at most
 * max_depth deep, whose every length and element count fits in the bytes that remain.
 * Only after this is it safe to hand the bytes to msgpack-c, whose unpacker would
 * otherwise reserve memory for whatever count a header claims. ext types are refused.
 * Returns 0, or -EPROTO with a static reason in *ret_why. */
int proto_check(const uint8_t *buf, size_t len, unsigned max_depth, const char **ret_why);

/* proto_decode: check and decode one message of at most max_len bytes into *ret.
 * Returns 0, or -EPROTO (malformed: the peer should be dropped) or -EOPNOTSUPP (a
 * well-formed message with an unknown op; *ret has op and id so a reply can name it).
 * *ret_why gets a static reason on failure. */
int proto_decode(const uint8_t *buf, size_t len, size_t max_len, struct proto_msg *ret,
                 const char **ret_why);

/* proto_encode: encode *msg into buf (cap bytes). Returns the length, or -EMSGSIZE. */
int proto_encode(const struct proto_msg *msg, uint8_t *buf, size_t cap);

/* proto_encode_error: convenience for an error reply with a printf-style message,
 * truncated to PROTO_MAX_ERRMSG. Returns the length, or -EMSGSIZE. */
int proto_encode_error(uint32_t id, int code, uint8_t *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A msgpack-c packer target over a caller's fixed buffer: no allocation; a write that
 * does not fit sets overflow and fails. Use: msgpack_packer_init(&pk, &pb, proto_buf_write). */
struct proto_buf {
    uint8_t *p;
    size_t len, cap;
    int overflow;
};
int proto_buf_write(void *data, const char *buf, size_t len);

/* proto_op_name: "lease", "publish" ... or "unknown". */
const char *proto_op_name(uint32_t op);

#endif
