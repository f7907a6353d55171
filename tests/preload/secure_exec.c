/* A program for scripts/test-preload.sh "i)": installed setuid root and
 * run by an unprivileged user, it is in secure execution (AT_SECURE).
 * It is linked against libiwarp_preload.so (an absolute RPATH), because
 * glibc's loader drops LD_PRELOAD for such a program unless the library
 * sits in a trusted directory and is itself setuid: linking is how an
 * administrator's setuid program gets the shim, and what this test
 * stands for.
 *
 * It prints "secure=<AT_SECURE> preload=<1 if the shim is mapped>", then
 * makes one connection to a listener of its own, which the shim takes
 * over and records (IWARP_PRELOAD_STATS, when the environment is obeyed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
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

int main(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int l, c;

    printf("secure=%lu preload=%d\n", getauxval(AT_SECURE), shim_mapped());
    fflush(stdout);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &len) != 0) {
        perror("listener");
        return 1;
    }
    /* Nobody accepts or answers MPA: the shim's iWARP attempt times out,
     * it connects over plain TCP and records "connect plain". */
    c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("connect");
        return 1;
    }
    close(c);
    close(l);
    return 0;
}
