/* SPDX-License-Identifier: MIT */
/* ledgers.c: see ledgers.h. */
#include "ledgers.h"

#include <stdlib.h>

#include "log.h"

void ledgers_check(struct broker *bk)
{
    struct registry_stats st = registry_stats(bk->reg);
    uint64_t quota = 0, pool = 0;
    bool ok = st.drift == 0;
#ifdef SHMREF_LEDGER_CHECK
    quota = quota_total(bk->quota);
    pool = pool_bytes_alloc(bk->pool) - pool_bytes_warm(bk->pool) - pool_bytes_creating(bk->pool);
    ok = ok && quota == st.bytes + bk->pending_bytes && pool == st.bytes;
#endif
    if (ok || bk->drift_logged)
        return;
    bk->drift_logged = true;
    if (!quota) { /* not summed above: the numbers for the log line */
        quota = quota_total(bk->quota);
        pool = pool_bytes_alloc(bk->pool) - pool_bytes_warm(bk->pool) - pool_bytes_creating(bk->pool);
    }
    log_error("ledgers disagree: quota holds %llu bytes, registry %llu (+%llu pending), pool hands out %llu; "
              "%llu credits found less charged than credited",
              (unsigned long long)quota, (unsigned long long)st.bytes, (unsigned long long)bk->pending_bytes,
              (unsigned long long)pool, (unsigned long long)st.drift);
#ifdef SHMREF_LEDGER_CHECK
    abort();
#endif
}
