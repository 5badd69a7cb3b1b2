/* shm.c - the node shared-memory segment (POSIX shm_open + mmap). */
#include "shm.h"
#include "cs.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHM_MAGIC 0x4353484d4e4f4445ULL /* "CSHMNODE" */
#define SHM_VERSION 14
#define SHM_PROBES 16

_Static_assert(BATCH_ENTRIES == SHM_MAX_WORKERS, "one queue entry per worker slot");
_Static_assert(BATCH_SHARDS == KEYS_SHARDS, "one queue per shard");

const int64_t shm_lat_bounds_us[SHM_LAT_BUCKETS] = {
    250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000, INT64_MAX,
};

int shm_node_unlink(const char *name)
{
    return shm_unlink(name) == 0 || errno == ENOENT ? CS_OK : CS_ERR;
}

uint32_t shm_layout_version(void)
{
    return SHM_VERSION;
}

struct shm_node *shm_node_open(const char *name, int mode, char *err, size_t errlen)
{
    size_t size = sizeof(struct shm_node);
    int created = 0, fresh = mode == SHM_OPEN_FRESH, fd;

    if (fresh)
        shm_node_unlink(name);
    if (mode == SHM_OPEN_EXISTING) {
        fd = shm_open(name, O_RDWR, 0600);
        if (fd < 0) {
            snprintf(err, errlen, "shm_open(%s) failed: %s (fcgi.shm_name changes only on "
                     "restart)", name, strerror(errno));
            return NULL;
        }
    } else if ((fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600)) >= 0) {
        created = 1;
        if (ftruncate(fd, (off_t)size) != 0) {
            snprintf(err, errlen, "ftruncate(%s) failed: %s", name, strerror(errno));
            close(fd);
            shm_unlink(name);
            return NULL;
        }
    } else if (errno == EEXIST) {
        fd = shm_open(name, O_RDWR, 0600);
    }
    if (fd < 0) {
        snprintf(err, errlen, "shm_open(%s) failed: %s", name, strerror(errno));
        return NULL;
    }

    struct stat st;
    /* A segment created this very moment may not have its size yet: wait for
     * its creator rather than mistaking it for one of another layout. */
    for (int i = 0; !created && i < 1000 && fstat(fd, &st) == 0 && st.st_size == 0; i++)
        usleep(1000);
    if (!created && (fstat(fd, &st) != 0 || (size_t)st.st_size != size)) {
        close(fd);
        if (mode == SHM_OPEN_EXISTING) {
            snprintf(err, errlen, "shared memory %s is of another layout (%lld bytes, this "
                     "build's version %d is %zu): the running coupon-fcgi cannot run beside "
                     "this build", name, (long long)st.st_size, SHM_VERSION, size);
            return NULL;
        }
        /* A segment of another layout (older version): start over. */
        if (fresh)
            return NULL;
        return shm_node_open(name, SHM_OPEN_FRESH, err, errlen);
    }
    struct shm_node *node = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (node == MAP_FAILED) {
        snprintf(err, errlen, "mmap(%s) failed: %s", name, strerror(errno));
        return NULL;
    }
    if (created) {
        /* ftruncate zeroed it; the magic goes last so joiners see a whole segment. */
        node->version = SHM_VERSION;
        node->size = (uint32_t)size;
        atomic_store(&node->created_ms, cs_now_ms());
        if (batch_init(&node->batch) != CS_OK || lease_watch_init(&node->lease_watch) != CS_OK) {
            snprintf(err, errlen, "pthread_mutex_init() in shared memory failed: %s",
                     strerror(errno));
            munmap(node, size);
            shm_unlink(name);
            return NULL;
        }
        __atomic_store_n(&node->magic, SHM_MAGIC, __ATOMIC_RELEASE);
    } else {
        for (int i = 0; i < 1000 && __atomic_load_n(&node->magic, __ATOMIC_ACQUIRE) != SHM_MAGIC; i++)
            usleep(1000);
        if (node->magic != SHM_MAGIC || node->version != SHM_VERSION) {
            snprintf(err, errlen, "shared memory %s is not a couponseize segment of version %d "
                     "(it says %u): the running coupon-fcgi cannot run beside this build",
                     name, SHM_VERSION, node->magic == SHM_MAGIC ? node->version : 0);
            munmap(node, size);
            return NULL;
        }
    }
    return node;
}

void shm_node_close(struct shm_node *node)
{
    if (node != NULL)
        munmap(node, sizeof(*node));
}

static unsigned shm_hash(int64_t id)
{
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ULL;
    return (unsigned)(x >> 40) & (SHM_FLAGS - 1);
}

void shm_flag_set(struct shm_flag *tab, int64_t id, int64_t until_ms)
{
    unsigned h = shm_hash(id);
    int64_t now = cs_mono_ms();

    for (int i = 0; i < SHM_PROBES; i++) {
        struct shm_flag *f = &tab[(h + (unsigned)i) & (SHM_FLAGS - 1)];
        int64_t cur = atomic_load(&f->id);
        if (cur == id) {
            atomic_store(&f->until_ms, until_ms);
            return;
        }
        /* Claim an empty slot, or one whose flag has run out. */
        if (cur == 0 || atomic_load(&f->until_ms) <= now) {
            if (atomic_compare_exchange_strong(&f->id, &cur, id)) {
                atomic_store(&f->until_ms, until_ms);
                return;
            }
            if (cur == id) {
                atomic_store(&f->until_ms, until_ms);
                return;
            }
        }
    }
}

int shm_flag_test(const struct shm_flag *tab, int64_t id, int64_t now_ms)
{
    unsigned h = shm_hash(id);

    for (int i = 0; i < SHM_PROBES; i++) {
        const struct shm_flag *f = &tab[(h + (unsigned)i) & (SHM_FLAGS - 1)];
        int64_t cur = atomic_load(&f->id);
        if (cur == id)
            return now_ms < atomic_load(&f->until_ms);
        if (cur == 0)
            return 0;
    }
    return 0;
}

void shm_flag_clear(struct shm_flag *tab, int64_t id)
{
    unsigned h = shm_hash(id);

    for (int i = 0; i < SHM_PROBES; i++) {
        struct shm_flag *f = &tab[(h + (unsigned)i) & (SHM_FLAGS - 1)];
        int64_t cur = atomic_load(&f->id);
        if (cur == id) {
            atomic_store(&f->until_ms, 0);
            return;
        }
        if (cur == 0)
            return;
    }
}

int shm_bucket_take(struct shm_node *node, int64_t now_us, int rps, int burst,
                    int *retry_after_s)
{
    if (rps <= 0)
        return 1;
    int64_t interval = 1000000 / rps;
    if (interval < 1)
        interval = 1;
    int64_t tolerance = interval * (int64_t)burst;
    int64_t tat = atomic_load(&node->bucket_tat_us);

    for (;;) {
        int64_t base = tat > now_us ? tat : now_us;
        int64_t next = base + interval;
        if (next - now_us > tolerance + interval) {
            int64_t wait_us = next - now_us - tolerance - interval;
            *retry_after_s = (int)(wait_us / 1000000) + 1;
            return 0;
        }
        if (atomic_compare_exchange_weak(&node->bucket_tat_us, &tat, next))
            return 1;
    }
}

void shm_observe_latency(struct shm_node *node, int64_t us)
{
    int b = 0;
    while (b < SHM_LAT_BUCKETS - 1 && us > shm_lat_bounds_us[b])
        b++;
    atomic_fetch_add_explicit(&node->m.seize_lat[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&node->m.seize_lat_sum_us, (uint64_t)(us > 0 ? us : 0),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&node->m.seize_lat_count, 1, memory_order_relaxed);
}

int shm_worker_register(struct shm_node *node, int32_t pid)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < SHM_MAX_WORKERS; i++) {
            int32_t cur = atomic_load(&node->worker_pid[i]);
            /* First pass: free slots only; second: slots of dead processes. */
            if (cur != 0 && (pass == 0 || kill(cur, 0) == 0 || errno != ESRCH))
                continue;
            if (atomic_compare_exchange_strong(&node->worker_pid[i], &cur, pid)) {
                /* A process that died in the slot holds no reserve grant. */
                atomic_store(&node->rsv.busy[i], 0);
                return i;
            }
        }
    }
    return -1;
}

void shm_worker_unregister(struct shm_node *node, int32_t pid)
{
    for (int i = 0; i < SHM_MAX_WORKERS; i++)
        shm_worker_unregister_slot(node, i, pid);
}

void shm_worker_unregister_slot(struct shm_node *node, int slot, int32_t pid)
{
    int32_t cur = pid;

    if (slot < 0 || slot >= SHM_MAX_WORKERS)
        return;
    /* busy[] is written by the slot's holder only: cleared once the slot
     * is no longer its. */
    if (atomic_compare_exchange_strong(&node->worker_pid[slot], &cur, 0))
        atomic_store(&node->rsv.busy[slot], 0);
}
