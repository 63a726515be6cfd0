/* SPDX-License-Identifier: MIT */
/* quota.h: the byte ledger per tenant (uid). Private to the daemon.
 * Charges are class-rounded bytes of buffers a tenant produced that are still alive
 * (held or retained); a charge that would pass the tenant's quota is refused whole. */
#ifndef SHMREFD_QUOTA_H
#define SHMREFD_QUOTA_H

#include <stddef.h>
#include <stdint.h>

struct quota_tenant {
    uint32_t uid;
    uint64_t bytes;    /* charged now */
    uint64_t quota;    /* the limit in force for this uid */
    uint32_t buffers;  /* live buffers charged */
    uint64_t pinned;   /* bytes of retired buffers this uid's mappings keep alive: they count
                        * against its quota, but are no charge of a live buffer */
    uint64_t retained; /* of bytes, those of buffers the daemon retains (keep_ms), for messages */
    uint64_t stock;    /* of bytes, those of its clients' stock leases (in the pool's stock reserve) */
    /* requests of this uid refused, by cause (as the server's refused_* counters) */
    uint64_t refused_quota, refused_space, refused_limit, refused_access, refused_other;
};

/* quota_ticket: one charge, as an object: whoever holds it owns the bytes it names, and
 * hands it back exactly once (quota_return). bytes 0: nothing is held. */
struct quota_ticket {
    uint32_t uid;
    uint64_t bytes;
};

struct quota;

/* quota_set_advice: what a quota refusal tells the tenant to do. A private daemon's user
 * gives it no flags: main.c names the knobs that user has (--private). NULL or "": the
 * operator's --tenant-quota and [quota]. Process-wide, as the log level is. */
void quota_set_advice(const char *text);

int quota_new(uint64_t default_quota, struct quota **ret);
void quota_free(struct quota *q);

/* quota_set_default / quota_set: the limit for every uid, or for one uid. A lowered
 * limit never takes back what is charged; it refuses new charges. */
void quota_set_default(struct quota *q, uint64_t bytes);
int quota_set(struct quota *q, uint32_t uid, uint64_t bytes);
uint64_t quota_limit(const struct quota *q, uint32_t uid);
/* quota_clear_limits: every uid back to the default limit (before a reload sets them). */
void quota_clear_limits(struct quota *q);

/* quota_charge: charge bytes to uid. Returns 0, or -EDQUOT with a message naming the
 * numbers in why (why_len bytes), or -ENOMEM. */
int quota_charge(struct quota *q, uint32_t uid, uint64_t bytes, char *why, size_t why_len);
/* quota_credit: gives back bytes charged to uid. Never silent about drift: returns 0, or
 * -EINVAL when uid holds less than bytes (then it holds 0), -ENOENT when it holds
 * nothing. */
int quota_credit(struct quota *q, uint32_t uid, uint64_t bytes);

/* quota_take: quota_charge, as a ticket (*ret is written only on success). */
int quota_take(struct quota *q, uint32_t uid, uint64_t bytes, struct quota_ticket *ret, char *why,
               size_t why_len);
/* quota_return: credits a ticket and empties it; an empty ticket is a no-op. Returns what
 * quota_credit returned (drift is the caller's to report). */
int quota_return(struct quota *q, struct quota_ticket *t);
/* quota_pin: pinned bytes of uid go up (delta > 0) or down: bytes a client of uid keeps
 * mapped after the daemon retired the buffer. They count against uid's quota (a charge
 * is refused when charged + pinned + asked passes it) until its process unmaps them or
 * exits. Returns 0 or -ENOMEM. */
int quota_pin(struct quota *q, uint32_t uid, int64_t delta);
/* quota_retained: bytes of uid's charge held by retentions (publish with keep_ms) go up
 * (delta > 0) or down; an EDQUOT message names them. Charges nothing. */
void quota_retained(struct quota *q, uint32_t uid, int64_t delta);

/* quota_stock: uid's stock bytes go up or down (the pool's stock callback). Returns 0 or
 * -ENOMEM. quota_stock_held: uid's stock bytes now. */
int quota_stock(struct quota *q, uint32_t uid, int64_t delta);
uint64_t quota_stock_held(const struct quota *q, uint32_t uid);

/* quota_check_pinned: -EDQUOT (the numbers in why) when uid's charges and pins are
 * already past its quota, else 0: an acquire of another tenant's buffer, which would pin
 * it once retired, is refused then. */
int quota_check_pinned(const struct quota *q, uint32_t uid, char *why, size_t why_len);

/* quota_held: what counts against uid's quota now: its charges plus its pinned bytes. */
uint64_t quota_held(const struct quota *q, uint32_t uid);

/* quota_total: bytes charged to all tenants (for cross-checking other ledgers). */
uint64_t quota_total(const struct quota *q);

/* quota_note_refusal: count a refused request of uid by its errno (EDQUOT, ENOSPC,
 * EMFILE/EFBIG/EUSERS as limit, EACCES as access, anything else as other). A tenant with refusals stays listed. */
void quota_note_refusal(struct quota *q, uint32_t uid, int code);

/* quota_tenants: the tenants with a charge, a limit of their own, or refusals. */
unsigned quota_tenants(const struct quota *q, struct quota_tenant *ret, unsigned max);
unsigned quota_count(const struct quota *q);

/* quota_buffers: live buffers charged to uid (each is one of the daemon's fds). */
uint32_t quota_buffers(const struct quota *q, uint32_t uid);

#endif
