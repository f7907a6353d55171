/* A program for scripts/test-preload.sh "i)": installed setuid root and
 * run by an unprivileged user, it is in secure execution (AT_SECURE).
 * It is linked against libiwarp_preload.so (an absolute RPATH), because
 * glibc's loader drops LD_PRELOAD for such a program unless the library
 * sits in a trusted directory and is itself setuid: linking is how an
 * administrator's setuid program gets the shim, and what this test
 * stands for.
 *
 *   secure_exec PORT
 *
 * prints "secure=<AT_SECURE> preload=<1 if the shim is mapped>", then
 * makes one connection to an echo server on 127.0.0.1:PORT (preloaded by
 * the test, so the shim can take the connection over iWARP), sends 5
 * bytes and reads them back, and prints "pool=<N>": how many of its
 * threads are the soft provider's progress pool ("iwarp-pool-*", there
 * only with IWARP_PROGRESS=pool obeyed). The shim records the connection
 * (IWARP_PRELOAD_STATS, when the environment is obeyed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <unistd.h>

static int shim_mapped(void)
{
    char line[512];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "libiwarp_preload"))
            found = 1;
    fclose(f);
    return found;
}

/* Threads whose name starts with "iwarp-pool-". */
static int pool_threads(void)
{
    char path[300], name[64];
    int n = 0;
    struct dirent *e;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL) {
        FILE *f;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(name, sizeof name, f) && strncmp(name, "iwarp-pool-", 11) == 0)
            n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    struct sockaddr_in a;
    char buf[5];
    size_t got = 0;
    int c;

    if (argc != 2 || atoi(argv[1]) <= 0 || atoi(argv[1]) > 65535) {
        fprintf(stderr, "usage: %s PORT (an echo server on 127.0.0.1)\n", argv[0]);
        return 2;
    }
    printf("secure=%lu preload=%d\n", getauxval(AT_SECURE), shim_mapped());
    fflush(stdout);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((unsigned short)atoi(argv[1]));
    c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        return 1;
    }
    if (write(c, "hello", 5) != 5) {
        perror("write");
        return 1;
    }
    while (got < sizeof buf) {
        ssize_t r = read(c, buf + got, sizeof buf - got);
        if (r <= 0) {
            perror("read (the echo)");
            return 1;
        }
        got += (size_t)r;
    }
    if (memcmp(buf, "hello", 5) != 0) {
        fprintf(stderr, "the echo differs\n");
        return 1;
    }
    /* While the connection is open: the pool serves it, if there is one. */
    printf("pool=%d\n", pool_threads());
    fflush(stdout);
    close(c);
    return 0;
}
