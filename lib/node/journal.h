/* journal.h - the node-local grant journal of the reserves: a directory that
 * names one node incarnation, and one append-only file per worker whose
 * records survive kill -9 once journal_append() has returned.
 *
 * Layout of a journal directory:
 *   lock          flock()ed by the one running instance (journal_dir_open())
 *   incarnation   32 hex digits, made once with the directory, never changed
 *   w<N>.jnl      worker N's records: [u32 length][u32 CRC-32C][payload],
 *                 little-endian; a torn tail (a record cut short by a crash
 *                 between write and fsync) is cut off when the file is opened.
 *   tokens        written by the reserve keeper (fcgi/keeper/keeper_journal.c) before
 *                 it deletes a segment: per open epoch the next token, so a
 *                 restart never hands out a token of a deleted record again.
 *   halted        written by the keeper once a journal write failed; while it
 *                 exists the node grants nothing from reserves, across
 *                 restarts. An operator removes it once the disk is fixed.
 *
 * A journal file is written by one process; it is locked (flock) while that
 * process appends to it or another replays it. */
#ifndef CS_JOURNAL_H
#define CS_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#define JOURNAL_ID_LEN 32           /* hex digits of an incarnation id */

/* One grant from a reserve: token `token` of epoch `epoch` of this
 * incarnation's reserve for `activity_id`, granted to `user_id`, at Redis'
 * estimated time `seize_ms` (epoch ms). */
struct journal_rec {
    int64_t activity_id;
    uint64_t epoch;
    uint32_t token;
    int64_t user_id;
    int64_t seize_ms;
};

/* The payload of a record as stored: 4 x 8 + 4 bytes. */
#define JOURNAL_PAYLOAD 36
#define JOURNAL_RECORD (8 + JOURNAL_PAYLOAD)

struct journal_dir {
    char *path;
    int lock_fd;
    char incarnation[JOURNAL_ID_LEN + 1];
};

struct journal {
    int fd;
    char *path;
    uint64_t records;           /* valid records in the file */
    uint64_t truncated;         /* bytes of torn tail cut off at open */
    int failed;                 /* a write or fsync failed: append no more */
};

/* CRC-32C (Castagnoli) of buf[0..len), continuing from crc (0 to start). */
uint32_t journal_crc32c(uint32_t crc, const void *buf, size_t len);

/* Opens (creating it and its parents when missing, mode 0700) the journal
 * directory path, locks it for this process, and reads its incarnation id,
 * making one from getrandom() when the directory has none (written to a
 * temporary file, fsync'd, renamed, directory fsync'd). CS_OK, or CS_ERR
 * with a message in err: the directory cannot be made or read; it is not
 * owned by this process's user, or group or others may write it; its lock
 * or incarnation file is not a regular file owned by this user (a symbolic
 * link is never followed); or another running instance holds its lock.
 * journal_dir_close() releases it. */
int journal_dir_open(struct journal_dir *jd, const char *path, char *err, size_t errlen);
void journal_dir_close(struct journal_dir *jd);

/* Opens worker `index`'s journal file of jd for appending, locked: valid
 * records are counted, and a torn tail (at most one record's worth of bytes
 * that do not form a valid record) is truncated and fsync'd away before
 * anything is appended. More than that after the last valid record is
 * damage, not a torn write: CS_ERR, nothing truncated. So is a file that is
 * not a regular file owned by this process's user (journal_scan() refuses
 * it too, errno EPERM): a symbolic link is never followed. */
int journal_open(struct journal *j, const struct journal_dir *jd, int index, char *err,
                 size_t errlen);
void journal_close(struct journal *j);

/* journal_open() of the file at path: segment seg of worker index is
 * journal_segment_path() ("DIR/w<index>-<seg>.jnl"), the names the reserves
 * use, so that a replayed segment can be deleted whole once no worker
 * appends to it. journal_parse_segment() reads index and seg back from a
 * file name (CS_ERR: not a segment). */
int journal_open_path(struct journal *j, const char *path, char *err, size_t errlen);
size_t journal_segment_path(char *buf, size_t size, const char *dir, int index, uint64_t seg);
int journal_parse_segment(const char *name, int *index, uint64_t *seg);

/* Appends rec with one write() and fsyncs it (fdatasync). Only after CS_OK
 * may the grant be answered SEIZED. CS_ERR (with j->failed set for good) when
 * the write or the sync failed: the caller stops spending, and the grant's
 * answer is UNKNOWN_OUTCOME since its record may or may not be on disk. */
int journal_append(struct journal *j, const struct journal_rec *rec);

/* Reads the records of the journal file at path, in order, calling fn for
 * each (a non-zero return stops the scan and is returned). *valid_end, when
 * not NULL, gets the offset just past the last valid record. Returns 0, fn's
 * non-zero value, or -1 when the file cannot be read (errno set). A torn or
 * damaged tail ends the scan; it is not an error here. */
int journal_scan(const char *path, int (*fn)(void *arg, const struct journal_rec *rec),
                 void *arg, uint64_t *valid_end);

#endif
