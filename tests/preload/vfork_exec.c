/* A server for scripts/test-preload.sh "g) vfork": a preloaded program
 * that starts children the way shells, inetds and language runtimes do
 * (vfork then exec; posix_spawn, which glibc makes with CLONE_VM |
 * CLONE_VFORK) while it holds iWARP streams, a deferred accept and MPA
 * exchanges stalled in flight.
 *
 * A vfork child runs in its parent's memory until it calls exec or _exit
 * (vfork(2)), so whatever it does through the shim (close, close_range,
 * dup2, exit's atexit handlers) acts on the *parent's* descriptor table,
 * settle claims and streams, although the descriptors it closes or
 * replaces are its own copies. The shim must pass such calls straight to
 * the C library.
 *
 *   vfork_exec PORT NSTALL
 *
 * 1. accepts client A and reads its first bytes (A is now a stream);
 * 2. accepts client B and leaves it alone (a deferred accept);
 * 3. accepts NSTALL clients that send only the MPA key and starts their
 *    exchanges (a non-blocking recv: EAGAIN), which stall;
 * 4. starts three children, waiting for each:
 *    - vfork: dup2(A, 0), dup2(B, 1), close() every number from 3 to 1023,
 *      execve /bin/true (an inetd's service; Python's subprocess also
 *      vforks, and closes with close_range);
 *    - vfork: close_range(3, ~0U, 0), execve of a missing program, then
 *      exit(127) (not _exit: atexit handlers run, in the parent's memory);
 *    - posix_spawn /bin/true with file actions closing A and the stallers
 *      and dup2ing B onto 0;
 * 5. checks that its own descriptors 0, 1 and 2 are not streams (recv with
 *    MSG_DONTWAIT fails with ENOTSOCK on a file: 0 is /dev/null, 1 and 2
 *    the output file), echoes A and B (read to the end of stream, write it
 *    all back), and waits until every stalled exchange has ended (a recv
 *    on each returns 0 or an error).
 *
 * Prints progress lines ("stream A", "accepted B", "stallers N", then one
 * line per check) and "ok" at the end; exit status 0 only if all passed.
 * Bounded by alarm(25).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_STALL 16
#define MAX_ECHO (4 << 20)

static void die(const char *what)
{
    printf("FAIL: %s: %s\n", what, strerror(errno));
    fflush(stdout);
    _exit(1);
}

static int wait_child(pid_t pid, int want, const char *what)
{
    int status;
    if (waitpid(pid, &status, 0) != pid)
        die("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != want) {
        printf("FAIL: %s: child status %#x, want exit %d\n", what, status, want);
        return 1;
    }
    printf("%s: child exited %d\n", what, want);
    return 0;
}

/* Reads fd to its end of stream (after `have` bytes already in buf), then
 * writes everything back and closes it. */
static int echo(int fd, char *buf, size_t have, const char *name)
{
    for (;;) {
        ssize_t n = read(fd, buf + have, MAX_ECHO - have);
        if (n == 0)
            break;
        if (n < 0) {
            printf("FAIL: read of %s: %s\n", name, strerror(errno));
            return 1;
        }
        have += (size_t)n;
        if (have == MAX_ECHO) {
            printf("FAIL: %s sent more than %d bytes\n", name, MAX_ECHO);
            return 1;
        }
    }
    for (size_t off = 0; off < have;) {
        ssize_t n = write(fd, buf + off, have - off);
        if (n <= 0) {
            printf("FAIL: write to %s: %s\n", name, strerror(errno));
            return 1;
        }
        off += (size_t)n;
    }
    close(fd);
    printf("echoed %zu bytes to %s\n", have, name);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT NSTALL\n", argv[0]);
        return 2;
    }
    int nstall = atoi(argv[2]);
    if (nstall < 1 || nstall > MAX_STALL) {
        fprintf(stderr, "NSTALL must be 1..%d\n", MAX_STALL);
        return 2;
    }
    alarm(25);
    setvbuf(stdout, NULL, _IOLBF, 0);

    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1]))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&sa, sizeof sa) || listen(l, 64))
        die("listen");

    static char bufa[MAX_ECHO], bufb[MAX_ECHO];
    int a = accept(l, NULL, NULL);
    if (a < 0)
        die("accept A");
    ssize_t got = read(a, bufa, 1);
    if (got != 1)
        die("first read of A");
    printf("stream A\n");
    int b = accept(l, NULL, NULL);
    if (b < 0)
        die("accept B");
    printf("accepted B\n");
    int st[MAX_STALL];
    for (int i = 0; i < nstall; i++) {
        st[i] = accept(l, NULL, NULL);
        if (st[i] < 0)
            die("accept staller");
        char c;
        /* Starts the exchange, which stalls: the client sent only the key. */
        if (recv(st[i], &c, 1, MSG_DONTWAIT) >= 0 || errno != EAGAIN) {
            printf("FAIL: staller %d: recv gave %s, want EAGAIN\n", i, strerror(errno));
            return 1;
        }
    }
    printf("stallers %d\n", nstall);

    int fails = 0;
    char *true_argv[] = {"true", NULL};
    char *missing_argv[] = {"missing", NULL};

    /* An inetd's service, started with vfork. */
    pid_t pid = vfork();
    if (pid < 0)
        die("vfork");
    if (pid == 0) {
        dup2(a, 0);
        dup2(b, 1);
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        execve("/bin/true", true_argv, environ);
        _exit(126);
    }
    fails += wait_child(pid, 0, "vfork, dup2, close, execve");

    /* A failed exec, and exit() instead of _exit(): atexit handlers run in
     * the parent's memory. */
    pid = vfork();
    if (pid < 0)
        die("vfork");
    if (pid == 0) {
        close_range(3, ~0U, 0);
        execve("/nonexistent/program", missing_argv, environ);
        exit(127);
    }
    fails += wait_child(pid, 127, "vfork, close_range, failed execve, exit");

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addclose(&fa, a);
    posix_spawn_file_actions_adddup2(&fa, b, 0);
    for (int i = 0; i < nstall; i++)
        posix_spawn_file_actions_addclose(&fa, st[i]);
    int rc = posix_spawn(&pid, "/bin/true", &fa, NULL, true_argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) {
        errno = rc;
        die("posix_spawn");
    }
    fails += wait_child(pid, 0, "posix_spawn");

    /* The children's dup2s replaced *their* 0 and 1, not ours. */
    for (int fd = 0; fd <= 2; fd++) {
        char c;
        ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
        if (n >= 0 || errno != ENOTSOCK) {
            printf("FAIL: descriptor %d is no longer its file: recv gave %zd (%s)\n", fd, n,
                   n < 0 ? strerror(errno) : "data");
            fails++;
        } else {
            printf("descriptor %d is still its file\n", fd);
        }
    }
    fails += echo(a, bufa, (size_t)got, "A (a stream before the children)");
    fails += echo(b, bufb, 0, "B (deferred during the children)");
    for (int i = 0; i < nstall; i++) {
        char c;
        ssize_t n = recv(st[i], &c, 1, 0);
        if (n > 0) {
            printf("FAIL: staller %d sent data\n", i);
            fails++;
        }
        close(st[i]);
    }
    printf("%d stalled exchanges ended\n", nstall);
    if (fails) {
        printf("%d checks failed\n", fails);
        return 1;
    }
    printf("ok\n");
    return 0;
}
