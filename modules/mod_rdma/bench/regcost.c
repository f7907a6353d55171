/* Registration cost of the two mod_rdma modes, per request size:
 *   reg     iwarp_reg_mr + iwarp_dereg_mr of an existing (touched) buffer
 *   mmap    open + mmap of a file + reg + dereg + munmap + close (dynamic)
 *   copy    memcpy of the body into the static buffer (static)
 *   alloc   iwarp_alloc_mr + dereg (allocating a fresh registered buffer)
 * usage: regcost FILE... ; prints one JSON object per file and method:
 *   {"size":N,"method":"reg","median_us":X}
 * Medians of 101 repetitions. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <iwarp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define REPS 101

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v)
{
    qsort(v, REPS, sizeof *v, cmp);
    return v[REPS / 2];
}

static void die(const char *what)
{
    char e[512];
    iwarp_last_error(e, sizeof e);
    fprintf(stderr, "regcost: %s failed: %s\n", what, e);
    exit(1);
}

int main(int argc, char **argv)
{
    iwarp_context *ctx;
    iwarp_pd *pd;
    iwarp_mr *stat_mr, *mr;
    double t[REPS];
    if (argc < 2) {
        fprintf(stderr, "usage: regcost FILE...\n");
        return 2;
    }
    if (iwarp_open_device(&ctx) || iwarp_alloc_pd(ctx, &pd))
        die("opening the device");
    if (iwarp_alloc_mr(pd, 16u << 20, IWARP_ACCESS_LOCAL_WRITE, &stat_mr))
        die("iwarp_alloc_mr (static buffer)");
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) || st.st_size <= 0 || st.st_size > (16 << 20)) {
            fprintf(stderr, "regcost: %s: need a file of 1 byte to 16 MiB\n", argv[a]);
            return 1;
        }
        size_t n = (size_t)st.st_size;
        char *src = malloc(n);
        memset(src, 7, n);
        for (int i = 0; i < REPS; i++) {
            double s = now_us();
            if (iwarp_reg_mr(pd, src, n, IWARP_ACCESS_REMOTE_READ, &mr))
                die("iwarp_reg_mr");
            iwarp_dereg_mr(mr);
            t[i] = now_us() - s;
        }
        printf("{\"size\":%zu,\"method\":\"reg\",\"median_us\":%.2f}\n", n, median(t));
        for (int i = 0; i < REPS; i++) {
            double s = now_us();
            int fd = open(argv[a], O_RDONLY);
            void *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
            if (fd < 0 || m == MAP_FAILED) {
                perror("regcost: open/mmap");
                return 1;
            }
            if (iwarp_reg_mr(pd, m, n, IWARP_ACCESS_REMOTE_READ, &mr))
                die("iwarp_reg_mr (mapping)");
            iwarp_dereg_mr(mr);
            munmap(m, n);
            close(fd);
            t[i] = now_us() - s;
        }
        printf("{\"size\":%zu,\"method\":\"mmap\",\"median_us\":%.2f}\n", n, median(t));
        for (int i = 0; i < REPS; i++) {
            double s = now_us();
            memcpy(iwarp_mr_addr(stat_mr), src, n);
            t[i] = now_us() - s;
        }
        printf("{\"size\":%zu,\"method\":\"copy\",\"median_us\":%.2f}\n", n, median(t));
        for (int i = 0; i < REPS; i++) {
            double s = now_us();
            if (iwarp_alloc_mr(pd, n, IWARP_ACCESS_REMOTE_READ, &mr))
                die("iwarp_alloc_mr");
            iwarp_dereg_mr(mr);
            t[i] = now_us() - s;
        }
        printf("{\"size\":%zu,\"method\":\"alloc\",\"median_us\":%.2f}\n", n, median(t));
        free(src);
    }
    iwarp_dereg_mr(stat_mr);
    iwarp_dealloc_pd(pd);
    iwarp_close_device(ctx);
    return 0;
}
