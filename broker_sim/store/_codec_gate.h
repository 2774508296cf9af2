/* FlushGate of _codec.c (included once, from there only): the compiled twin of flush.py's PyFlushGate, the
 * meeting point of SYNC_FLUSH puts and the group-commit thread. Why compiled: with the Python twin each put
 * builds an Event (a Condition and a lock), the flusher sets each of them in turn and is woken by every
 * registration; here a put registers its end offset and sleeps on one pthread condition without the GIL,
 * the flusher is signalled only when it has a group to flush, and one broadcast releases the whole group.
 * Timeouts are real time (CLOCK_MONOTONIC): flush.py uses this gate only on the system clock.
 *
 * State, guarded by mu: flushed (commit-log offset on disk), targets[0..n) (end offsets of the registered
 * waiters), expected (waiters the last release saw: the group gather() waits for), stopping, abandoned. */
#include <pthread.h>

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t waiters_cv, flusher_cv;
    long long flushed, *targets;
    Py_ssize_t n, cap, expected;
    int stopping, abandoned;
} Gate;

static void deadline_after(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    if (seconds < 0) seconds = 0;
    if (seconds > 1e9) seconds = 1e9;
    long long ns = ts->tv_nsec + (long long)((seconds - (double)(long long)seconds) * 1e9);
    ts->tv_sec += (time_t)seconds + (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
}

static PyObject *gate_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "FlushGate() takes no arguments");
        return NULL;
    }
    Gate *g = (Gate *)type->tp_alloc(type, 0);
    if (g == NULL) return NULL;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->waiters_cv, &attr);
    pthread_cond_init(&g->flusher_cv, &attr);
    pthread_condattr_destroy(&attr);
    g->expected = 1;
    return (PyObject *)g;
}

static void gate_dealloc(Gate *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->waiters_cv);
    pthread_cond_destroy(&g->flusher_cv);
    free(g->targets);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

/* Block (without the GIL) until the log is flushed up to end (1), the gate is abandoned (1: the caller checks
 * for the crash), or timeout_s passes (0); -1 with MemoryError set. */
static int gate_wait_end(Gate *g, long long end, double timeout) {
    int ok = 1, nomem = 0;
    struct timespec deadline;
    deadline_after(&deadline, timeout);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&g->mu);
    if (end > g->flushed && !g->abandoned) {
        if (g->n == g->cap) {
            Py_ssize_t cap = g->cap ? g->cap * 2 : 64;
            long long *t = realloc(g->targets, (size_t)cap * sizeof(long long));
            if (t == NULL) nomem = 1;
            else { g->targets = t; g->cap = cap; }
        }
        if (!nomem) {
            g->targets[g->n++] = end;
            if (g->n == 1 || g->n >= g->expected) pthread_cond_signal(&g->flusher_cv);
            while (end > g->flushed && !g->abandoned) {
                if (pthread_cond_timedwait(&g->waiters_cv, &g->mu, &deadline) == ETIMEDOUT) break;
            }
            ok = end <= g->flushed || g->abandoned;
            if (!ok) {  /* timed out: withdraw (release() may not have seen this target yet) */
                for (Py_ssize_t i = 0; i < g->n; i++) {
                    if (g->targets[i] == end) {
                        g->targets[i] = g->targets[--g->n];
                        break;
                    }
                }
            }
        }
    }
    pthread_mutex_unlock(&g->mu);
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        return -1;
    }
    return ok;
}

/* wait(end_offset, timeout_s) -> bool: gate_wait_end from Python (the general put path). */
static PyObject *gate_wait(Gate *g, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(end_offset, timeout_s)");
        return NULL;
    }
    long long end = PyLong_AsLongLong(args[0]);
    double timeout = PyFloat_AsDouble(args[1]);
    if (PyErr_Occurred()) return NULL;
    int ok = gate_wait_end(g, end, timeout);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

/* gather(idle_s, gather_s) -> int (flusher): wait up to idle_s for a first waiter, then up to gather_s for
 * as many as the last release saw; returns how many are registered (0: idle timeout or stopping). */
static PyObject *gate_gather(Gate *g, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "gather(idle_s, gather_s)");
        return NULL;
    }
    double idle = PyFloat_AsDouble(args[0]), gather = PyFloat_AsDouble(args[1]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t n;
    struct timespec deadline;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&g->mu);
    deadline_after(&deadline, idle);
    while (g->n == 0 && !g->stopping) {
        if (pthread_cond_timedwait(&g->flusher_cv, &g->mu, &deadline) == ETIMEDOUT) break;
    }
    deadline_after(&deadline, gather);
    while (g->n > 0 && g->n < g->expected && !g->stopping) {
        if (pthread_cond_timedwait(&g->flusher_cv, &g->mu, &deadline) == ETIMEDOUT) break;
    }
    n = g->stopping ? 0 : g->n;
    pthread_mutex_unlock(&g->mu);
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(n);
}

/* release(flushed) -> int (flusher, after a successful flush): record the flushed offset, wake every waiter
 * it covers with one broadcast, remember how many were waiting (the next group); returns how many it covers. */
static PyObject *gate_release(Gate *g, PyObject *arg) {
    long long flushed = PyLong_AsLongLong(arg);
    if (flushed == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t released = 0;
    pthread_mutex_lock(&g->mu);  /* held only for a short scan: no need to drop the GIL */
    if (flushed > g->flushed) g->flushed = flushed;
    g->expected = g->n > 1 ? g->n : 1;
    Py_ssize_t keep = 0;
    for (Py_ssize_t i = 0; i < g->n; i++) {
        if (g->targets[i] <= g->flushed) released++;
        else g->targets[keep++] = g->targets[i];  /* appended after the flush began: next round */
    }
    g->n = keep;
    if (released) pthread_cond_broadcast(&g->waiters_cv);
    pthread_mutex_unlock(&g->mu);
    return PyLong_FromSsize_t(released);
}

/* reset(flushed): (re)start — the offset already on disk; clears stopping and abandoned. */
static PyObject *gate_reset(Gate *g, PyObject *arg) {
    long long flushed = PyLong_AsLongLong(arg);
    if (flushed == -1 && PyErr_Occurred()) return NULL;
    pthread_mutex_lock(&g->mu);
    g->flushed = flushed;
    g->stopping = g->abandoned = 0;
    g->n = 0;
    g->expected = 1;
    pthread_mutex_unlock(&g->mu);
    Py_RETURN_NONE;
}

/* stop(): wake the flusher out of gather(). abandon(): crash — release every waiter without a flush. */
static PyObject *gate_stop(Gate *g, PyObject *unused) {
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_broadcast(&g->flusher_cv);
    pthread_mutex_unlock(&g->mu);
    Py_RETURN_NONE;
}

static PyObject *gate_abandon(Gate *g, PyObject *unused) {
    pthread_mutex_lock(&g->mu);
    g->abandoned = g->stopping = 1;
    g->n = 0;
    pthread_cond_broadcast(&g->waiters_cv);
    pthread_cond_broadcast(&g->flusher_cv);
    pthread_mutex_unlock(&g->mu);
    Py_RETURN_NONE;
}

static PyObject *gate_waiting(Gate *g, void *closure) {
    pthread_mutex_lock(&g->mu);
    Py_ssize_t n = g->n;
    pthread_mutex_unlock(&g->mu);
    return PyLong_FromSsize_t(n);
}

static PyObject *gate_flushed(Gate *g, void *closure) {
    pthread_mutex_lock(&g->mu);
    long long f = g->flushed;
    pthread_mutex_unlock(&g->mu);
    return PyLong_FromLongLong(f);
}

static PyMethodDef gate_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))gate_wait, METH_FASTCALL, "Wait until flushed up to an offset."},
    {"gather", (PyCFunction)(void (*)(void))gate_gather, METH_FASTCALL, "Flusher: wait for a group."},
    {"release", (PyCFunction)gate_release, METH_O, "Flusher: record a flush, wake whom it covers."},
    {"reset", (PyCFunction)gate_reset, METH_O, "Start afresh at a flushed offset."},
    {"stop", (PyCFunction)gate_stop, METH_NOARGS, "Wake the flusher to stop."},
    {"abandon", (PyCFunction)gate_abandon, METH_NOARGS, "Crash: release every waiter unflushed."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef gate_getset[] = {
    {"waiting", (getter)gate_waiting, NULL, "Registered waiters.", NULL},
    {"flushed", (getter)gate_flushed, NULL, "Commit-log offset known to be on disk.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker_sim.store._codec.FlushGate",
    .tp_basicsize = sizeof(Gate),
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SYNC_FLUSH waiters and the group-commit thread (see flush.py's PyFlushGate).",
    .tp_methods = gate_methods,
    .tp_getset = gate_getset,
    .tp_new = gate_new,
};
