/*
 * clockshift: an LD_PRELOAD library that steps or freezes the wall clock of
 * a live process, for tests. libfaketime hangs redis-server (it clashes with
 * jemalloc); this does nothing at start-up but map one small file.
 *
 * Environment: TB_CLOCK_FILE, the control file (written by the test):
 *   int64 seq      even when stable; the writer makes it odd while it
 *                  writes the other two fields, then even again (a seqlock)
 *   int64 mode     0: shift the real clock by `value` microseconds
 *                  1: freeze the clock at `value` microseconds since the epoch
 *   int64 value
 * all native-endian, 24 bytes. Without TB_CLOCK_FILE the clock is untouched;
 * a named file that cannot be mapped aborts the process (a test must not
 * silently run on the real clock).
 *
 * Shifted: clock_gettime(CLOCK_REALTIME and CLOCK_REALTIME_COARSE),
 * gettimeofday, time. Never shifted: CLOCK_MONOTONIC and the other clocks,
 * as a real step of the wall clock leaves them alone.
 *
 * Valkey 9 reads the wall clock at most once a millisecond when its
 * monotonic clock is the CPU's time-stamp counter: in between, ustime() and
 * mstime() add the counter's progress (rdtsc, which no library call sees)
 * to the last reading, so a frozen clock drifts by up to 999 us and a step
 * shows up to 1 ms late. It takes the counter only when /proc/cpuinfo lists
 * `constant_tsc`; with the POSIX monotonic clock it calls gettimeofday every
 * time. So, with TB_CLOCK_FILE set, a process that opens /proc/cpuinfo reads
 * it without the `constant_tsc` flag (Valkey then logs "monotonic clock:
 * POSIX clock_gettime"). Redis 7.0 and 8.2 and Valkey 8 read the wall clock
 * on every call anyway.
 *
 * Build: cc -O2 -shared -fPIC -o libclockshift.so clockshift.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct control {
    int64_t seq;
    int64_t mode;
    int64_t value;
};

static const volatile struct control *ctl;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void clockshift_init(void)
{
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("TB_CLOCK_FILE");
    if (path == NULL || *path == '\0')
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    void *p = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof(struct control), PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "clockshift: cannot map TB_CLOCK_FILE=%s\n", path);
        abort();
    }
    ctl = p;
}

/* The real clock: through libc (vDSO) once resolved, else the system call
 * (only before the constructor ran, e.g. in an allocator's own start-up). */
static int real_time(clockid_t id, struct timespec *ts)
{
    if (real_clock_gettime != NULL)
        return real_clock_gettime(id, ts);
    return (int)syscall(SYS_clock_gettime, id, ts);
}

/* A consistent copy of the control fields (seqlock read side). */
static void read_control(int64_t *mode, int64_t *value)
{
    for (;;) {
        int64_t s1 = ctl->seq;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        *mode = ctl->mode;
        *value = ctl->value;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if ((s1 & 1) == 0 && ctl->seq == s1)
            return;
    }
}

static void shift(struct timespec *ts)
{
    int64_t mode, value;
    read_control(&mode, &value);
    int64_t ns = mode == 1 ? value * 1000 : ts->tv_sec * 1000000000LL + ts->tv_nsec + value * 1000;
    int64_t sec = ns / 1000000000LL, rem = ns % 1000000000LL;
    if (rem < 0) {
        sec -= 1;
        rem += 1000000000LL;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)rem;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    int r = real_time(id, ts);
    if (r == 0 && ctl != NULL && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts);
    return r;
}

/* glibc declares `tv` non-null; callers may still pass NULL. */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    if (tv != NULL) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = (suseconds_t)(ts.tv_nsec / 1000);
    }
    if (tz != NULL) {
        struct timezone *z = tz;
        z->tz_minuteswest = 0;
        z->tz_dsttime = 0;
    }
    return 0;
}

time_t time(time_t *out)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

/* /proc/cpuinfo without `constant_tsc` (see the top of this file); any other
 * file, or the clock untouched, opens as usual. The copy lives as long as
 * the stream (fmemopen keeps the buffer; the few KB are never freed). */
static FILE *open_file(const char *name, const char *path, const char *mode)
{
    FILE *(*real)(const char *, const char *) = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, name);
    if (ctl == NULL || strcmp(path, "/proc/cpuinfo") != 0)
        return real(path, mode);
    FILE *in = real(path, "r");
    if (in == NULL)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        fclose(in);
        return NULL;
    }
    size_t n;
    while ((n = fread(buf + len, 1, cap - 1 - len, in)) > 0) {
        len += n;
        if (len == cap - 1) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL)
                break;
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(in);
    buf[len] = '\0';
    for (char *p = buf; (p = strstr(p, " constant_tsc")) != NULL;)
        memset(p, ' ', strlen(" constant_tsc"));
    return fmemopen(buf, len, "r");
}

FILE *fopen(const char *restrict path, const char *restrict mode)
{
    return open_file("fopen", path, mode);
}

FILE *fopen64(const char *restrict path, const char *restrict mode)
{
    return open_file("fopen64", path, mode);
}
