/* pool.h - a fixed pool of worker threads, each with its own context (its own
 * Redis and MySQL connections), fed from one FIFO of tasks. */
#ifndef CS_POOL_H
#define CS_POOL_H

struct pool;

/* Runs on a worker thread with that thread's context. */
typedef void (*pool_task_fn)(void *ctx, void *arg);

/* Called on each new thread before its first task / after its last one. */
typedef void *(*pool_ctx_new_fn)(void *udata);
typedef void (*pool_ctx_free_fn)(void *ctx);

/* Starts nthreads threads with every signal blocked, so signals reach only the
 * main thread. Returns the pool, or NULL (logged, nothing left running) when a
 * thread cannot be created. */
struct pool *pool_new(int nthreads, pool_ctx_new_fn ctx_new, pool_ctx_free_fn ctx_free,
                      void *udata);

/* Queues fn(ctx, arg) for the next free thread. Never blocks on a task. */
void pool_submit(struct pool *p, pool_task_fn fn, void *arg);

/* Blocks until no task is queued or running. */
void pool_wait_idle(struct pool *p);

/* Runs every task still queued, joins the threads, frees the pool. Tasks that
 * should end early must be told so by the caller (a flag they poll). */
void pool_free(struct pool *p);

#endif
