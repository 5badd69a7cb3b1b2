/* journal.c - the node-local grant journal: incarnation directory, per-worker
 * append-only files of length + CRC records, torn-tail truncation, fsync. */
#include "journal.h"
#include "cs.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* A length field past this is damage, whatever the format grows into. */
#define JOURNAL_MAX_PAYLOAD 4096

/* Flags of every open of a file in the journal directory: a symbolic link
 * is never followed, and a FIFO put there cannot block the open. */
#define JOURNAL_OPEN_FLAGS (O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)

/* Whether the open fd is a regular file owned by this process's user: a
 * record is trusted only when nobody else could have written it. CS_OK, or
 * CS_ERR with the reason in err and errno EPERM. */
static int journal_file_ok(int fd, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "fstat(%s) failed: %s", path, strerror(errno));
        return CS_ERR;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        snprintf(err, errlen, "%s: not a regular file owned by uid %u; refusing it", path,
                 (unsigned)geteuid());
        errno = EPERM;
        return CS_ERR;
    }
    return CS_OK;
}

static uint32_t journal_crc_table[256];
static pthread_once_t journal_crc_once = PTHREAD_ONCE_INIT;

/* CRC-32C (Castagnoli), reflected, one table byte at a time. */
static void journal_crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        journal_crc_table[i] = c;
    }
}

uint32_t journal_crc32c(uint32_t crc, const void *buf, size_t len)
{
    const uint32_t *table = journal_crc_table;
    const unsigned char *p = buf;

    /* Once per process, whichever of its request threads comes first. */
    pthread_once(&journal_crc_once, journal_crc_init);
    crc = ~crc;
    while (len-- > 0)
        crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void journal_encode(unsigned char *out, const struct journal_rec *r)
{
    unsigned char *p = out + 8;
    put64(p, (uint64_t)r->activity_id);
    put64(p + 8, r->epoch);
    put32(p + 16, r->token);
    put64(p + 20, (uint64_t)r->user_id);
    put64(p + 28, (uint64_t)r->seize_ms);
    put32(out, JOURNAL_PAYLOAD);
    put32(out + 4, journal_crc32c(0, p, JOURNAL_PAYLOAD));
}

static void journal_decode(const unsigned char *p, struct journal_rec *r)
{
    r->activity_id = (int64_t)get64(p);
    r->epoch = get64(p + 8);
    r->token = get32(p + 16);
    r->user_id = (int64_t)get64(p + 20);
    r->seize_ms = (int64_t)get64(p + 28);
}

/* Scans the open file fd from its start: calls fn (when not NULL) per valid
 * record, counts them in *records, and sets *valid_end and *size. Returns 0,
 * fn's non-zero value, or -1 on a read error. */
static int journal_scan_fd(int fd, int (*fn)(void *, const struct journal_rec *), void *arg,
                           uint64_t *records, uint64_t *valid_end, uint64_t *size)
{
    unsigned char buf[65536];
    size_t have = 0, off = 0;
    uint64_t base = 0; /* file offset of buf[0] */
    int eof = 0;

    *records = 0;
    *valid_end = 0;
    if (lseek(fd, 0, SEEK_SET) < 0)
        return -1;
    for (;;) {
        if (!eof && have - off < 8 + JOURNAL_MAX_PAYLOAD) {
            memmove(buf, buf + off, have - off);
            base += off;
            have -= off;
            off = 0;
            ssize_t n = read(fd, buf + have, sizeof(buf) - have);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                return -1;
            }
            if (n == 0)
                eof = 1;
            have += (size_t)n;
            continue;
        }
        if (have - off < 8)
            break;
        uint32_t len = get32(buf + off), crc = get32(buf + off + 4);
        if (len < JOURNAL_PAYLOAD || len > JOURNAL_MAX_PAYLOAD || have - off - 8 < len
            || journal_crc32c(0, buf + off + 8, len) != crc)
            break;
        struct journal_rec rec;
        journal_decode(buf + off + 8, &rec);
        off += 8 + len;
        *valid_end = base + off;
        (*records)++;
        if (fn != NULL) {
            int rc = fn(arg, &rec);
            if (rc != 0)
                return rc;
        }
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
    *size = (uint64_t)st.st_size;
    return 0;
}

int journal_scan(const char *path, int (*fn)(void *arg, const struct journal_rec *rec),
                 void *arg, uint64_t *valid_end)
{
    uint64_t records, end = 0, size;
    char err[PATH_MAX + 96];
    int fd = open(path, O_RDONLY | JOURNAL_OPEN_FLAGS);
    if (fd < 0)
        return -1;
    if (journal_file_ok(fd, path, err, sizeof(err)) != CS_OK) {
        log_error("journal: %s", err);
        close(fd);
        errno = EPERM;
        return -1;
    }
    int rc = journal_scan_fd(fd, fn, arg, &records, &end, &size);
    int saved = errno;
    close(fd);
    errno = saved;
    if (valid_end != NULL)
        *valid_end = end;
    return rc;
}

/* mkdir -p path, mode 0700; then path must be a directory owned by this
 * process's user that neither group nor others may write: whoever can
 * write it could add records the keeper replays as grants. CS_OK, or CS_ERR
 * with the reason in err. */
static int journal_mkdirs(const char *path, char *err, size_t errlen)
{
    char buf[PATH_MAX];
    struct stat st;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) {
        snprintf(err, errlen, "journal directory %s: %s", path, strerror(ENAMETOOLONG));
        return CS_ERR;
    }
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            goto fail;
        *p = '/';
    }
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
        goto fail;
    if (stat(path, &st) != 0)
        goto fail;
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        snprintf(err, errlen, "journal directory %s must be a directory owned by uid %u that "
                 "group and others cannot write (it is %s, uid %u, mode %04o): refusing it",
                 path, (unsigned)geteuid(), S_ISDIR(st.st_mode) ? "a directory" : "no directory",
                 (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        return CS_ERR;
    }
    return CS_OK;
fail:
    snprintf(err, errlen, "cannot make journal directory %s: %s", path, strerror(errno));
    return CS_ERR;
}

/* Reads DIR/incarnation into id, or makes it. */
static int journal_incarnation(struct journal_dir *jd, char *err, size_t errlen)
{
    char path[PATH_MAX], tmp[PATH_MAX], text[JOURNAL_ID_LEN + 2];
    snprintf(path, sizeof(path), "%s/incarnation", jd->path);
    int fd = open(path, O_RDONLY | JOURNAL_OPEN_FLAGS);
    if (fd >= 0) {
        if (journal_file_ok(fd, path, err, errlen) != CS_OK) {
            close(fd);
            return CS_ERR;
        }
        ssize_t n = read(fd, text, sizeof(text) - 1);
        close(fd);
        text[n > 0 ? n : 0] = '\0';
        if (n < JOURNAL_ID_LEN || strspn(text, "0123456789abcdef") < JOURNAL_ID_LEN) {
            snprintf(err, errlen, "%s: not an incarnation id; the journal directory is "
                     "damaged", path);
            return CS_ERR;
        }
        memcpy(jd->incarnation, text, JOURNAL_ID_LEN);
        jd->incarnation[JOURNAL_ID_LEN] = '\0';
        return CS_OK;
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "open(%s) failed: %s", path, strerror(errno));
        return CS_ERR;
    }
    unsigned char rnd[JOURNAL_ID_LEN / 2];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        snprintf(err, errlen, "getrandom() failed: %s", strerror(errno));
        return CS_ERR;
    }
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(jd->incarnation + 2 * i, 3, "%02x", rnd[i]);
    snprintf(text, sizeof(text), "%s\n", jd->incarnation);
    snprintf(tmp, sizeof(tmp), "%s/incarnation.tmp", jd->path);
    /* A leftover of a crash is ours (the directory is), made anew. */
    if (unlink(tmp) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "unlink(%s) failed: %s", tmp, strerror(errno));
        return CS_ERR;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | JOURNAL_OPEN_FLAGS, 0600);
    if (fd < 0 || write(fd, text, JOURNAL_ID_LEN + 1) != JOURNAL_ID_LEN + 1 || fsync(fd) != 0
        || close(fd) != 0 || rename(tmp, path) != 0 || cs_fsync_dir(jd->path) != CS_OK) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return CS_ERR;
    }
    log_notice("journal %s: new incarnation %s", jd->path, jd->incarnation);
    return CS_OK;
}

int journal_dir_open(struct journal_dir *jd, const char *path, char *err, size_t errlen)
{
    char lock[PATH_MAX];

    memset(jd, 0, sizeof(*jd));
    jd->lock_fd = -1;
    if (journal_mkdirs(path, err, errlen) != CS_OK)
        return CS_ERR;
    jd->path = xstrdup(path);
    snprintf(lock, sizeof(lock), "%s/lock", path);
    jd->lock_fd = open(lock, O_RDWR | O_CREAT | JOURNAL_OPEN_FLAGS, 0600);
    if (jd->lock_fd < 0) {
        snprintf(err, errlen, "open(%s) failed: %s", lock, strerror(errno));
        goto fail;
    }
    if (journal_file_ok(jd->lock_fd, lock, err, errlen) != CS_OK)
        goto fail;
    if (flock(jd->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen, "journal directory %s is in use by another running instance "
                 "(flock: %s)", path, strerror(errno));
        goto fail;
    }
    if (journal_incarnation(jd, err, errlen) != CS_OK)
        goto fail;
    return CS_OK;
fail:
    journal_dir_close(jd);
    return CS_ERR;
}

void journal_dir_close(struct journal_dir *jd)
{
    if (jd->lock_fd >= 0)
        close(jd->lock_fd); /* releases the flock */
    jd->lock_fd = -1;
    free(jd->path);
    jd->path = NULL;
}

int journal_open(struct journal *j, const struct journal_dir *jd, int index, char *err,
                 size_t errlen)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/w%d.jnl", jd->path, index);
    return journal_open_path(j, path, err, errlen);
}

size_t journal_segment_path(char *buf, size_t size, const char *dir, int index, uint64_t seg)
{
    return (size_t)snprintf(buf, size, "%s/w%d-%llu.jnl", dir, index, (unsigned long long)seg);
}

int journal_parse_segment(const char *name, int *index, uint64_t *seg)
{
    unsigned long long s;
    int i, n = 0;
    if (sscanf(name, "w%d-%llu.jnl%n", &i, &s, &n) != 2 || n == 0 || name[n] != '\0' || i < 0)
        return CS_ERR;
    *index = i;
    *seg = s;
    return CS_OK;
}

int journal_open_path(struct journal *j, const char *path, char *err, size_t errlen)
{
    uint64_t end, size;

    memset(j, 0, sizeof(*j));
    j->fd = open(path, O_RDWR | O_CREAT | O_APPEND | JOURNAL_OPEN_FLAGS, 0600);
    if (j->fd < 0) {
        snprintf(err, errlen, "open(%s) failed: %s", path, strerror(errno));
        return CS_ERR;
    }
    j->path = xstrdup(path);
    if (journal_file_ok(j->fd, path, err, errlen) != CS_OK)
        goto fail;
    if (flock(j->fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen, "%s is locked (being replayed?): %s", path, strerror(errno));
        goto fail;
    }
    if (journal_scan_fd(j->fd, NULL, NULL, &j->records, &end, &size) != 0) {
        snprintf(err, errlen, "read(%s) failed: %s", path, strerror(errno));
        goto fail;
    }
    if (size > end) {
        /* A crash between write() and fsync can leave part of one record;
         * anything longer did not come from a torn append. */
        if (size - end > JOURNAL_RECORD) {
            snprintf(err, errlen, "%s: %llu bytes after the last valid record at %llu: damaged, "
                     "not a torn write; refusing to truncate", path,
                     (unsigned long long)(size - end), (unsigned long long)end);
            goto fail;
        }
        if (ftruncate(j->fd, (off_t)end) != 0 || fsync(j->fd) != 0) {
            snprintf(err, errlen, "truncating %s failed: %s", path, strerror(errno));
            goto fail;
        }
        j->truncated = size - end;
        log_warn("journal %s: torn tail of %llu bytes cut off after %llu records", path,
                 (unsigned long long)j->truncated, (unsigned long long)j->records);
    }
    return CS_OK;
fail:
    journal_close(j);
    return CS_ERR;
}

void journal_close(struct journal *j)
{
    if (j->fd >= 0)
        close(j->fd);
    j->fd = -1;
    free(j->path);
    j->path = NULL;
}

int journal_append(struct journal *j, const struct journal_rec *rec)
{
    unsigned char buf[JOURNAL_RECORD];
    size_t done = 0;

    if (j->failed || j->fd < 0)
        return CS_ERR;
    journal_encode(buf, rec);
    while (done < sizeof(buf)) {
        ssize_t n = write(j->fd, buf + done, sizeof(buf) - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            log_error("write(%s) failed: %s; no more grants from the reserve", j->path,
                      n < 0 ? strerror(errno) : "wrote nothing");
            j->failed = 1;
            return CS_ERR;
        }
        done += (size_t)n;
    }
    /* After a failed fsync the page cache may say the data is written when
     * the disk never got it (the "fsyncgate" lesson): never retry, stop. */
    if (fdatasync(j->fd) != 0) {
        log_error("fdatasync(%s) failed: %s; no more grants from the reserve", j->path,
                  strerror(errno));
        j->failed = 1;
        return CS_ERR;
    }
    j->records++;
    return CS_OK;
}
