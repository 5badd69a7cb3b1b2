/* main.c - coupon-fcgi: command line, and the choice of process model. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "conf.h"
#include "cs.h"
#include "log.h"
#include "schema.h"
#include "sdnotify.h"
#include "shm.h"
#include "super.h"
#include "upgrade.h"
#include "worker.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: coupon-fcgi [-c PATH] [-t] [-V] [-h]\n"
            "  -c PATH  configuration file (default %s)\n"
            "  -t       check the configuration file and exit (0 good, 1 bad)\n"
            "  -V       print the version, hand-over protocol and segment layout\n"
            "  -h       this help\n"
            "Signals to the supervisor: TERM stop, HUP reload the configuration,\n"
            "  USR2 upgrade in place to the binary now on disk (see coupon-fcgi(8))\n"
            "Process model:\n"
            "  fd 0 a listening socket (spawn-fcgi -F N): serve it as one worker\n"
            "  LISTEN_FDS set (systemd socket activation): supervise workers on it\n"
            "  otherwise: bind fcgi.listen and supervise fcgi.workers workers\n",
            CS_DEFAULT_CONF);
}

/* True when fd is a socket in the listening state. */
static int is_listening_socket(int fd)
{
    int val = 0;
    socklen_t len = sizeof(val);
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &val, &len) == 0 && val;
}

int main(int argc, char **argv)
{
    const char *path = CS_DEFAULT_CONF;
    int test = 0, opt;
    struct cs_conf conf;
    char err[512];

    cs_init();
    upgrade_init(argc, argv);

    while ((opt = getopt(argc, argv, "c:thV")) != -1) {
        switch (opt) {
        case 'c': path = optarg; break;
        case 't': test = 1; break;
        case 'V': upgrade_print_version(stdout); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "coupon-fcgi: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 1;
    }
    if (conf_load(&conf, path, err, sizeof(err)) != CS_OK) {
        fprintf(stderr, "coupon-fcgi: %s\n", err);
        if (test)
            fprintf(stderr, "coupon-fcgi: configuration file %s test failed\n", path);
        return 1;
    }
    if (test) {
        if (conf.fcgi_script[0] != '\0')
            fprintf(stderr, "coupon-fcgi: fcgi.script is obsolete and ignored: the seize "
                            "script is built in\n");
        printf("coupon-fcgi: configuration file %s test is successful\n", path);
        conf_free(&conf);
        return 0;
    }
    log_init("coupon-fcgi", log_level_parse(conf.log_level), conf.log_target);
    if (conf.fcgi_script[0] != '\0')
        log_warn("fcgi.script is obsolete and ignored: the seize script is built in");
    /* Code and schema must match before anything is served (an in-place
     * upgrade that refuses here leaves the old binary serving). */
    if (schema_check_start(&conf) != CS_OK) {
        conf_free(&conf);
        return 1;
    }

    /* The new binary of an in-place upgrade: it checked the configuration
     * and the schema above like any start, and a refusal exits non-zero,
     * which the old supervisor logs while it keeps serving. */
    struct upgrade_from from;
    int up = upgrade_inherited(&from);
    if (up < 0) {
        conf_free(&conf);
        return 1;
    }
    int rc;
    if (up == 0) {
        rc = super_run(&conf, path, from.fd, from.own_socket, &from);
    } else if (is_listening_socket(0)) {
        /* spawn-fcgi: we are one worker; the first one creates the segment. */
        struct shm_node *shm = shm_node_open(conf.fcgi_shm_name, 0, err, sizeof(err));
        if (shm == NULL) {
            log_error("%s", err);
            conf_free(&conf);
            return 1;
        }
        rc = worker_main(&conf, 0, shm, (int)getpid());
        shm_node_close(shm);
    } else if (sdnotify_listen_fds() >= 1) {
        /* systemd socket activation: the socket is fd 3. */
        rc = super_run(&conf, path, 3, 0, NULL);
    } else {
        int fd = super_listen(&conf);
        if (fd < 0) {
            conf_free(&conf);
            return 1;
        }
        rc = super_run(&conf, path, fd, 1, NULL);
    }
    conf_free(&conf);
    return rc;
}
