/* SPDX-License-Identifier: MIT */
/* ledger.h: the shared-memory bookkeeping of same-tenant handoffs, shared by the daemon
 * and libshmref. Private header (not installed). Pure code on memory the caller mapped:
 * no I/O, no allocation, no logging (the caller creates, seals, sends and maps the files).
 *
 * Why: a consumer of the producer's uid that already maps a buffer can read whatever
 * that buffer will ever hold, so what a daemon round trip adds to a repeat acquire is
 * bookkeeping only (is this token the buffer's current publish; who holds it). That
 * bookkeeping lives here, in two kinds of memfd the daemon makes:
 *
 *  - the DIRECTORY, one per tenant (uid), mapped read-write by the daemon and by that
 *    uid's connections that agreed PROTO_FEAT_LEDGER (sent with the hello reply). Page 0
 *    is a header; then one entry per pool slot. A producer writes its publish into the
 *    entry of its buffer's slot (ledger_publish) before it sends the descriptor; the
 *    daemon marks an entry LENT, then FREE, when the buffer's last daemon reference went
 *    (ledger_mark, ledger_unmark). The daemon never reads a directory: a tenant that
 *    scribbles on its own directory only misleads its own processes, who could read each
 *    other's mappings anyway.
 *  - the LEDGER, one per connection, written by its client, read by the daemon: one
 *    32-bit count per pool slot of the holds that client has on that slot's buffer
 *    without a daemon handle (ledger_take, ledger_give). The daemon reads a slot only
 *    for a buffer of the connection's own uid whose fd it sent that connection and that
 *    the connection has not forgotten; any other slot is ignored, so a liar pins only
 *    what it already maps, and is charged for it.
 *
 * Both files are sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) before they are sent:
 * a client cannot make the daemon's mapping fault. A punched hole reads as zeros
 * ("not held"), which harms only the one who punched it.
 *
 * The slot of a buffer is in its token: token[0..3] is the slot (little endian), or
 * LEDGER_NO_SLOT; token[4..15] are random (96 bits). The directory keeps a keyed hash of
 * the token (SipHash-2-4 under the tenant's random key), never the token: a process that
 * reads the directory learns no capability it could take to the daemon or another uid.
 *
 * Memory ordering (the handshake; every access named here is seq_cst):
 *   consumer (ledger_take):  count[slot] += 1;  s = entry.seq;  held iff s == seen
 *   daemon   (ledger_mark):  entry.state = LENT; entry.seq += 2;  then reads count[slot]
 *                            of every ledger that may hold it
 * In the single total order of seq_cst operations, either the consumer's load of seq
 * comes after the daemon's increment (it sees the change, undoes its count and asks the
 * daemon instead), or it comes before, and then the consumer's increment also precedes
 * the daemon's read of the count (program order), so the daemon sees the hold and keeps
 * the buffer (LENT) until the count drops. Release (ledger_give) is the mirror image:
 * count[slot] -= 1, then load state; LENT means the daemon is waiting: the client sends
 * PROTO_OP_NUDGE. A decrement the daemon's read missed is seen by the client as LENT.
 * A producer writes an entry under a seqlock (seq odd while writing), only while it holds
 * the buffer's lease, so never while the daemon marks it; a producer killed mid-write
 * leaves seq odd, which readers treat as "ask the daemon" and ledger_mark repairs. */
#ifndef SHMREF_LEDGER_H
#define SHMREF_LEDGER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define LEDGER_SLOTS     65536u         /* pool slots a directory and a ledger cover */
#define LEDGER_NO_SLOT   0xffffffffu    /* token[0..3] of a buffer beyond them */
#define LEDGER_META_MAX  192u           /* metadata kept in an entry; longer: daemon path */
#define LEDGER_MAGIC     0x314745444c524853ull /* "SHRLEDG1" little endian */
#define LEDGER_VERSION   1u
#define LEDGER_HEADER    4096u          /* bytes before the first entry */

/* Sizes of the two files (sparse: only touched pages are allocated). */
#define LEDGER_DIR_SIZE    ((size_t)LEDGER_HEADER + (size_t)LEDGER_SLOTS * sizeof(struct ledger_entry))
#define LEDGER_COUNTS_SIZE ((size_t)LEDGER_SLOTS * sizeof(uint32_t))

enum ledger_state {
    LEDGER_FREE = 0,        /* nothing published under this slot (or not recorded) */
    LEDGER_PUBLISHED = 1,   /* entry describes the buffer's current publish */
    LEDGER_LENT = 2,        /* the daemon wants it back and waits for ledger holds */
};

struct ledger_header {
    uint64_t magic;         /* LEDGER_MAGIC */
    uint32_t version;       /* LEDGER_VERSION */
    uint32_t nslots;        /* LEDGER_SLOTS */
    uint32_t uid;           /* the tenant */
    uint32_t entry_size;    /* sizeof(struct ledger_entry) */
    uint8_t key[16];        /* SipHash key of the tenant's token hashes (random) */
};

/* One pool slot's current publish: 256 bytes, four cache lines. */
struct ledger_entry {
    _Atomic uint32_t seq;   /* even: stable; odd: a producer is writing */
    _Atomic uint32_t state; /* enum ledger_state */
    _Atomic uint64_t buf_id;    /* the buffer (its backing file) the entry speaks of */
    _Atomic uint64_t tokhash;   /* ledger_tokhash of the token it is published under */
    _Atomic uint64_t size;      /* published size */
    _Atomic uint32_t meta_len;  /* <= LEDGER_META_MAX */
    _Atomic uint32_t flags;     /* reserved, 0 */
    uint8_t pad[24];
    uint8_t meta[LEDGER_META_MAX];
};

_Static_assert(sizeof(struct ledger_entry) == 256, "ledger entry is 256 bytes");
_Static_assert(sizeof(struct ledger_header) <= LEDGER_HEADER, "ledger header fits page 0");

/* ledger_slot_of: the slot a token names, or LEDGER_NO_SLOT. */
uint32_t ledger_slot_of(const uint8_t token[PROTO_TOKEN_LEN]);
/* ledger_set_slot: writes slot into token[0..3] (the daemon, when it draws a token). */
void ledger_set_slot(uint8_t token[PROTO_TOKEN_LEN], uint32_t slot);

/* ledger_siphash: SipHash-2-4 of in[0..len) under key (64-bit output). */
uint64_t ledger_siphash(const uint8_t key[16], const void *in, size_t len);
/* ledger_tokhash: the directory's hash of a token: ledger_siphash(hdr->key, token). */
uint64_t ledger_tokhash(const struct ledger_header *hdr, const uint8_t token[PROTO_TOKEN_LEN]);

/* ledger_dir_init: fills a fresh directory's header (the daemon, before sending it). */
void ledger_dir_init(void *dir, uint32_t uid, const uint8_t key[16]);
/* ledger_dir_check: whether a mapped directory of dir_len bytes has a header this code
 * speaks (the client, before trusting it). Returns 0 or -EPROTO. */
int ledger_dir_check(const void *dir, size_t dir_len);
/* ledger_entry_at: slot's entry (slot < LEDGER_SLOTS). */
struct ledger_entry *ledger_entry_at(void *dir, uint32_t slot);

/* Producer: ledger_publish records a publish of buffer buf_id (slot, token, size, meta)
 * in the directory. Call it while holding the lease, before sending the publish and
 * handing out the descriptor. Returns 0, or -EMSGSIZE when meta is longer than
 * LEDGER_META_MAX (nothing is written: consumers ask the daemon), or -EINVAL for a slot
 * >= LEDGER_SLOTS (LEDGER_NO_SLOT: the buffer has no entry). */
int ledger_publish(void *dir, uint32_t slot, uint64_t buf_id, const uint8_t token[PROTO_TOKEN_LEN],
                   uint64_t size, const void *meta, uint32_t meta_len);

/* Consumer: ledger_take takes a hold on slot's buffer for a descriptor (token, size)
 * without the daemon: the entry must be PUBLISHED under that token's hash with that size
 * and buf_id == expect_buf_id (the consumer maps that file). On success (0) counts[slot]
 * was incremented and stays so until ledger_give; *ret_meta_len and meta (at least
 * LEDGER_META_MAX bytes) get the entry's metadata. -EAGAIN: no such current publish here,
 * or it is changing (nothing was taken): ask the daemon. -ESTALE: nothing was taken, but
 * the increment was undone after the daemon marked the slot (it may have read it and now
 * waits): send PROTO_OP_NUDGE for expect_buf_id as after a ledger_give that returned true,
 * then ask the daemon. Slots >= LEDGER_SLOTS: -EAGAIN. */
int ledger_take(void *dir, _Atomic uint32_t *counts, uint32_t slot, const uint8_t token[PROTO_TOKEN_LEN],
                uint64_t size, uint64_t expect_buf_id, void *meta, uint32_t *ret_meta_len);
/* ledger_buf_of: the buf_id slot's entry names while PUBLISHED under token's hash (so a
 * consumer can look up its mapping before ledger_take), or 0. */
uint64_t ledger_buf_of(void *dir, uint32_t slot, const uint8_t token[PROTO_TOKEN_LEN]);
/* Consumer: ledger_give drops one hold taken by ledger_take. Returns true when the
 * daemon waits for this slot (LENT): the client then sends PROTO_OP_NUDGE for it. */
bool ledger_give(void *dir, _Atomic uint32_t *counts, uint32_t slot);

/* Daemon: ledger_mark marks slot LENT (any current publish is withdrawn: no new
 * ledger_take succeeds) and repairs an odd seq. Then read ledger_held of every ledger that
 * may hold it; ledger_unmark (FREE) once they all read 0, before the buffer is reused. */
void ledger_mark(void *dir, uint32_t slot);
void ledger_unmark(void *dir, uint32_t slot);
/* ledger_held: the count a ledger claims for slot (seq_cst load); 0 for slots >= LEDGER_SLOTS. */
uint32_t ledger_held(const _Atomic uint32_t *counts, uint32_t slot);

#endif
