/* pool.c - fixed thread pool with per-thread contexts. */
#include "pool.h"
#include "cs.h"
#include "log.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct pool_task {
    pool_task_fn fn;
    void *arg;
    struct pool_task *next;
};

struct pool {
    pthread_mutex_t mu;
    pthread_cond_t work;       /* a task was queued, or shutdown */
    pthread_cond_t idle;       /* queue empty and nothing running */
    struct pool_task *head, *tail;
    int running;               /* tasks being executed */
    int shutdown;
    int nthreads;
    pthread_t *threads;
    pool_ctx_new_fn ctx_new;
    pool_ctx_free_fn ctx_free;
    void *udata;
};

static void *pool_thread(void *arg)
{
    struct pool *p = arg;
    void *ctx = p->ctx_new(p->udata);

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->head == NULL && !p->shutdown)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->head == NULL)
            break; /* shutdown and nothing left */
        struct pool_task *t = p->head;
        p->head = t->next;
        if (p->head == NULL)
            p->tail = NULL;
        p->running++;
        pthread_mutex_unlock(&p->mu);

        t->fn(ctx, t->arg);
        free(t);

        pthread_mutex_lock(&p->mu);
        p->running--;
        if (p->head == NULL && p->running == 0)
            pthread_cond_broadcast(&p->idle);
    }
    pthread_mutex_unlock(&p->mu);
    p->ctx_free(ctx);
    return NULL;
}

struct pool *pool_new(int nthreads, pool_ctx_new_fn ctx_new, pool_ctx_free_fn ctx_free,
                      void *udata)
{
    struct pool *p = xcalloc(1, sizeof(*p));
    sigset_t all, old;
    int err;

    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->threads = xcalloc((size_t)nthreads, sizeof(*p->threads));
    p->ctx_new = ctx_new;
    p->ctx_free = ctx_free;
    p->udata = udata;

    /* Threads inherit the mask: block everything while creating them. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < nthreads; i++) {
        err = pthread_create(&p->threads[i], NULL, pool_thread, p);
        if (err != 0) {
            log_error("pthread_create() failed: %s", strerror(err));
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            pool_free(p);
            return NULL;
        }
        p->nthreads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

void pool_submit(struct pool *p, pool_task_fn fn, void *arg)
{
    struct pool_task *t = xmalloc(sizeof(*t));
    t->fn = fn;
    t->arg = arg;
    t->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->tail != NULL)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

void pool_wait_idle(struct pool *p)
{
    pthread_mutex_lock(&p->mu);
    while (p->head != NULL || p->running > 0)
        pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void pool_free(struct pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->shutdown = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++) {
        int err = pthread_join(p->threads[i], NULL);
        if (err != 0)
            log_error("pthread_join() failed: %s", strerror(err));
    }
    /* Only reachable with tasks left when no thread could be started. */
    while (p->head != NULL) {
        struct pool_task *t = p->head;
        p->head = t->next;
        free(t);
    }
    free(p->threads);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
