/* Timed waits on CLOCK_MONOTONIC for processes under libfaketime (nemesis/clocks.py).
 *
 * libfaketime 0.9.10 (Debian 12) reports every clock, CLOCK_MONOTONIC included, on the wall
 * clock's scale (start time + offset + elapsed * rate), and does not intercept sem_clockwait()
 * or pthread_cond_clockwait(). A caller that computes an absolute deadline from the faked
 * monotonic clock and hands it to one of them (CPython's Lock.acquire(timeout=...), so every
 * Condition.wait, Event.wait and queue.get with a timeout) then waits for decades. This library,
 * preloaded before libfaketime, waits instead on the real monotonic clock in slices of half the
 * time left on the caller's (faked) clock, until that clock passes the deadline: right for any
 * rate below 2, and it needs no knowledge of the rate.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long long to_ns(const struct timespec *t) { return (long long)t->tv_sec * 1000000000LL + t->tv_nsec; }

/* Nanoseconds from now to abs on the caller's clock: the faked one (libfaketime's clock_gettime). */
static long long left_ns(clockid_t clock, const struct timespec *abs) {
    struct timespec now;
    clock_gettime(clock, &now);
    return to_ns(abs) - to_ns(&now);
}

/* An absolute time wait_ns ahead on the real CLOCK_MONOTONIC (the raw system call: not faked). */
static struct timespec real_deadline(long long left) {
    struct timespec now, out;
    long long wait = left > 1000000 ? left / 2 : left, n;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &now);
    n = to_ns(&now) + wait;
    out.tv_sec = n / 1000000000LL;
    out.tv_nsec = n % 1000000000LL;
    return out;
}

int sem_clockwait(sem_t *sem, clockid_t clock, const struct timespec *abs) {
    static int (*real)(sem_t *, clockid_t, const struct timespec *);
    if (!real) real = (int (*)(sem_t *, clockid_t, const struct timespec *))dlsym(RTLD_NEXT, "sem_clockwait");
    for (;;) {
        long long left = left_ns(clock, abs);
        if (left <= 0) {
            if (sem_trywait(sem) == 0) return 0;
            if (errno == EAGAIN) errno = ETIMEDOUT;
            return -1;
        }
        struct timespec until = real_deadline(left);
        if (real(sem, CLOCK_MONOTONIC, &until) == 0) return 0;
        if (errno != ETIMEDOUT) return -1;
    }
}

int pthread_cond_clockwait(pthread_cond_t *cond, pthread_mutex_t *mutex, clockid_t clock, const struct timespec *abs) {
    static int (*real)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
    if (!real)
        real = (int (*)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *))dlsym(
            RTLD_NEXT, "pthread_cond_clockwait");
    for (;;) {
        long long left = left_ns(clock, abs);
        if (left <= 0) return ETIMEDOUT;
        struct timespec until = real_deadline(left);
        int rc = real(cond, mutex, CLOCK_MONOTONIC, &until);
        if (rc != ETIMEDOUT) return rc;
    }
}
