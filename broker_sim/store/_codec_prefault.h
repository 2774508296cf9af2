/* The prefault worker of _codec.c (included once, from there only): populate_async and populate_idle.
 *
 * populate (in _codec_put.h) prefaults on the calling thread with the GIL released; the Prefaulter then needs
 * a Python thread that wakes, takes the GIL back and calls it — on the 2-core box those GIL hand-offs cost
 * more than the page faults they saved (bench a1 −20 %). Here the work goes to one process-wide pthread that
 * never touches Python: the put hands it an address range (one slot, a newer range replaces a waiting one)
 * and returns; the thread populates it in 256 KiB steps. Page contents are not changed by populating (a
 * write fault maps the page as it is), so racing the writer is harmless; populate_idle drops a waiting range
 * and waits out a running step before a segment is unmapped. */
#include <pthread.h>

#define PREFAULT_STEP (256 * 1024)

static pthread_mutex_t pf_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pf_cv = PTHREAD_COND_INITIALIZER;
static uintptr_t pf_lo, pf_hi;  /* the waiting range; pf_hi == 0: none */
static int pf_started, pf_busy;
static unsigned long pf_epoch;  /* bumped by populate_idle: a running range stops at its next step */
static int pf_failed;  /* the kernel refused MADV_POPULATE_WRITE (EINVAL): nothing more to do */

static void *pf_run(void *unused) {
    (void)unused;
    pthread_mutex_lock(&pf_mu);
    for (;;) {
        while (pf_hi == 0) pthread_cond_wait(&pf_cv, &pf_mu);
        uintptr_t lo = pf_lo, hi = pf_hi;
        unsigned long epoch = pf_epoch;
        pf_hi = 0;
        pf_busy = 1;
        while (lo < hi && epoch == pf_epoch && !pf_failed) {
            uintptr_t end = hi - lo > PREFAULT_STEP ? lo + PREFAULT_STEP : hi;
            pthread_mutex_unlock(&pf_mu);
            int rc = 0;
#ifdef MADV_POPULATE_WRITE
            rc = madvise((void *)lo, end - lo, MADV_POPULATE_WRITE);
#endif
            int err = rc < 0 ? errno : 0;
            pthread_mutex_lock(&pf_mu);
            if (err == EINVAL) pf_failed = 1;
            else if (err != 0) break;  /* unmapped under us (ENOMEM) or not writable: drop the range */
            lo = end;
        }
        pf_busy = 0;
        pthread_cond_broadcast(&pf_cv);
    }
    return NULL;
}

static void pf_after_fork(void) {  /* the child has no worker: start one on its first request */
    pthread_mutex_init(&pf_mu, NULL);
    pthread_cond_init(&pf_cv, NULL);
    pf_started = pf_busy = 0;
    pf_hi = 0;
}

/* populate_async(mm, start, length) -> bool: have the worker prefault mm[start:start+length] for writing;
 * returns at once. False where it cannot (no MADV_POPULATE_WRITE, the kernel refused it before, or no
 * thread): the caller falls back to populate on a thread of its own. */
static PyObject *populate_async(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t lo, hi;
    if (page_range(args, nargs, "populate_async(mm, start, length)", &lo, &hi) < 0) return NULL;
#ifndef MADV_POPULATE_WRITE
    Py_RETURN_FALSE;
#else
    int ok = 1;
    pthread_mutex_lock(&pf_mu);
    if (pf_failed) {
        ok = 0;
    } else if (hi > lo) {
        if (!pf_started) {
            pthread_t t;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            pf_started = pthread_create(&t, &attr, pf_run, NULL) == 0;
            pthread_attr_destroy(&attr);
            ok = pf_started;
        }
        if (ok) {
            pf_lo = lo;
            pf_hi = hi;
            pthread_cond_broadcast(&pf_cv);
        }
    }
    pthread_mutex_unlock(&pf_mu);
    return PyBool_FromLong(ok);
#endif
}

/* populate_idle(): drop a waiting range and wait (GIL released) until the worker is between ranges — after
 * it returns nothing populates a mapping handed over before, so the mapping may be closed. */
static PyObject *populate_idle(PyObject *self, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&pf_mu);
    pf_hi = 0;
    pf_epoch++;
    while (pf_busy) pthread_cond_wait(&pf_cv, &pf_mu);
    pthread_mutex_unlock(&pf_mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
