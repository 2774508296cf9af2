/* The one-call put and small system helpers of _codec.c (included once, from there only): put_plain,
 * populate (prefaulting), now_ms. */
/* populate(mm, start, length) -> bool: map the pages of mm[start:start+length] writable now, without the
 * GIL (MADV_POPULATE_WRITE: the page faults a later copy would take, paid on another thread; contents are
 * not touched, so the writer may be copying into the same pages). False where the kernel cannot. */
static PyObject *populate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "populate(mm, start, length)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), length = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    int ok = 0;
#ifdef MADV_POPULATE_WRITE
    long page = sysconf(_SC_PAGESIZE);
    if (start >= 0 && length > 0 && start < view.len) {
        uintptr_t lo = ((uintptr_t)view.buf + start) & ~(uintptr_t)(page - 1);
        uintptr_t hi = (uintptr_t)view.buf + (start + length < view.len ? start + length : view.len);
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
        Py_END_ALLOW_THREADS
        ok = rc == 0;
    }
#endif
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyObject *now_obj_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

/* put_plain(commit_log, msg) -> PutMessageResult | None: MessageStore.put_message's common case in one call
 * (ASYNC_FLUSH, asynchronous dispatch, system clock, no replication; the caller checked the rest). None when
 * the message needs the general path — it fails a check (that path reports the status) or the commit-log
 * lock is held by someone else (that path waits for it). commit_log.put_state = (store host, topic cache,
 * max message size, segment size, commit-log lock, the dispatcher's wake-up Event). */
static PyObject *put_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put_plain(commit_log, msg)");
        return NULL;
    }
    NEED_CONFIGURED(NULL)
    PyObject *cl = args[0], *st = getattr_fast(cl, s_put_state), *p = NULL, *now = NULL, *ar = NULL;
    PyObject *res = NULL;
    if (st == NULL) return NULL;
    if (!PyTuple_CheckExact(st) || PyTuple_GET_SIZE(st) != 6) {
        PyErr_SetString(PyExc_TypeError, "put_plain: put_state is not set");
        goto done;
    }
    PyObject *a5[5] = {args[1], PyTuple_GET_ITEM(st, 0), PyTuple_GET_ITEM(st, 1), PyTuple_GET_ITEM(st, 2),
                       PyTuple_GET_ITEM(st, 3)};
    PyObject *lock = PyTuple_GET_ITEM(st, 4), *event = PyTuple_GET_ITEM(st, 5);
    if ((p = prepare(NULL, a5, 5)) == NULL) {
        PyErr_Clear();
        res = Py_None;
        Py_INCREF(res);
        goto done;
    }
    PyObject *got = PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
    if (got == NULL) goto done;
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked) {
        res = Py_None;
        Py_INCREF(res);
        goto done;
    }
    now = now_obj_ms();
    if (now != NULL) {
        PyObject *a3[3] = {cl, p, now};
        ar = place(NULL, a3, 3);
    }
    PyObject *rel = PyObject_CallMethodNoArgs(lock, s_release);
    if (rel == NULL || ar == NULL) {
        Py_XDECREF(rel);
        goto done;
    }
    Py_DECREF(rel);
    PyObject *flag = PyObject_GetAttr(event, s_flag_attr);
    if (flag == NULL) goto done;
    if (flag != Py_True) {
        PyObject *ok = PyObject_CallMethodNoArgs(event, s_set);
        if (ok == NULL) {
            Py_DECREF(flag);
            goto done;
        }
        Py_DECREF(ok);
    }
    Py_DECREF(flag);
    PyObject *rargs[3] = {put_status_ok, ar, s_empty};
    res = new_slots(&put_result_cls, rargs);
done:
    Py_XDECREF(st); Py_XDECREF(p); Py_XDECREF(now); Py_XDECREF(ar);
    return res;
}

static PyObject *now_ms(PyObject *self, PyObject *unused) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}
