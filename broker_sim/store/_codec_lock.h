/* The commit-log lock of _codec.c (included once, from there only): AppendLock, a mutex with the interface of
 * threading.Lock (acquire(blocking=True, timeout=-1), release(), locked(), with-statement) that put_plain
 * takes and releases with two C calls instead of two Python method calls (≈ 700 instructions per put: a
 * method lookup each, and _thread.lock.acquire parses its arguments as keywords). Python code (the general
 * put, expiry, replication) uses it exactly like threading.Lock. A blocking acquire releases the GIL while
 * it waits; unlike threading.Lock it is not interrupted by signals (the lock is held for microseconds). */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int held;
} AppendLock;

static PyTypeObject AppendLockType;

static PyObject *alock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "AppendLock() takes no arguments");
        return NULL;
    }
    AppendLock *self = (AppendLock *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if ((self->lock = PyThread_allocate_lock()) == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void alock_dealloc(AppendLock *self) {
    if (self->lock != NULL) {
        if (self->held) PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 = taken without waiting, 0 = held by someone. */
static int alock_try(AppendLock *self) {
    if (PyThread_acquire_lock_timed(self->lock, 0, 0) != PY_LOCK_ACQUIRED) return 0;
    self->held = 1;
    return 1;
}

static void alock_release_held(AppendLock *self) {
    self->held = 0;
    PyThread_release_lock(self->lock);
}

/* 1 = acquired, 0 = timed out; timeout_us < 0 waits forever. */
static int alock_wait(AppendLock *self, PY_TIMEOUT_T timeout_us) {
    if (alock_try(self)) return 1;
    if (timeout_us == 0) return 0;
    PyLockStatus r;
    Py_BEGIN_ALLOW_THREADS
    r = PyThread_acquire_lock_timed(self->lock, timeout_us, 0);
    Py_END_ALLOW_THREADS
    if (r != PY_LOCK_ACQUIRED) return 0;
    self->held = 1;
    return 1;
}

static PyObject *alock_acquire(AppendLock *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *blocking_o = nargs > 0 ? args[0] : NULL, *timeout_o = nargs > 1 ? args[1] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 2) goto usage;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "blocking") == 0 && blocking_o == NULL)
            blocking_o = args[nargs + i];
        else if (PyUnicode_CompareWithASCIIString(name, "timeout") == 0 && timeout_o == NULL)
            timeout_o = args[nargs + i];
        else
            goto usage;
    }
    int blocking = blocking_o == NULL ? 1 : PyObject_IsTrue(blocking_o);
    if (blocking < 0) return NULL;
    double timeout = -1.0;
    if (timeout_o != NULL && (timeout = PyFloat_AsDouble(timeout_o)) == -1.0 && PyErr_Occurred()) return NULL;
    if (!blocking && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1.0) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    PY_TIMEOUT_T us = !blocking ? 0 : timeout < 0 ? -1 : (PY_TIMEOUT_T)(timeout * 1e6);
    if (blocking && timeout > 0 && (timeout * 1e6 >= (double)PY_TIMEOUT_MAX)) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large");
        return NULL;
    }
    return PyBool_FromLong(alock_wait(self, us));
usage:
    PyErr_SetString(PyExc_TypeError, "acquire(blocking=True, timeout=-1)");
    return NULL;
}

static PyObject *alock_release(AppendLock *self, PyObject *unused) {
    if (!self->held) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    alock_release_held(self);
    Py_RETURN_NONE;
}

static PyObject *alock_enter(AppendLock *self, PyObject *unused) {
    alock_wait(self, -1);
    Py_RETURN_TRUE;
}

static PyObject *alock_exit(AppendLock *self, PyObject *const *args, Py_ssize_t nargs) {
    return alock_release(self, NULL);
}

static PyObject *alock_locked(AppendLock *self, PyObject *unused) {
    return PyBool_FromLong(self->held);
}

static PyMethodDef alock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))alock_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool"},
    {"release", (PyCFunction)alock_release, METH_NOARGS, "Release the lock (RuntimeError if it is not held)."},
    {"locked", (PyCFunction)alock_locked, METH_NOARGS, "Whether the lock is held."},
    {"__enter__", (PyCFunction)alock_enter, METH_NOARGS, "Acquire, waiting as long as it takes."},
    {"__exit__", (PyCFunction)(void (*)(void))alock_exit, METH_FASTCALL, "Release."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppendLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "broker_sim.store._codec.AppendLock",
    .tp_basicsize = sizeof(AppendLock),
    .tp_dealloc = (destructor)alock_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The commit-log lock: threading.Lock's interface, taken by put_plain without a method call.",
    .tp_methods = alock_methods,
    .tp_new = alock_new,
};

/* put_plain's try-lock: the C calls for an AppendLock, acquire(False) for any other lock.
 * 1 = acquired, 0 = held by someone else, -1 = error. */
static int lock_try(PyObject *lock) {
    if (Py_IS_TYPE(lock, &AppendLockType)) return alock_try((AppendLock *)lock);
    PyObject *got = PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
    if (got == NULL) return -1;
    int locked = got == Py_True;
    Py_DECREF(got);
    return locked;
}

static int lock_release(PyObject *lock) {
    if (Py_IS_TYPE(lock, &AppendLockType)) {
        alock_release_held((AppendLock *)lock);
        return 0;
    }
    PyObject *rel = PyObject_CallMethodNoArgs(lock, s_release);
    Py_XDECREF(rel);
    return rel == NULL ? -1 : 0;
}
