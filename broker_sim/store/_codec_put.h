/* The one-call put and small system helpers of _codec.c (included once, from there only): put_plain,
 * populate (prefaulting), now_ms. */
/* The page-aligned address range [*lo, *hi) of mm[start:start+length] (args = mm, start, length), cut at the
 * end of the mapping; empty when the range is. -1 with an exception set on bad arguments. */
static int page_range(PyObject *const *args, Py_ssize_t nargs, const char *usage, uintptr_t *lo, uintptr_t *hi) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), length = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return -1;
    long page = sysconf(_SC_PAGESIZE);
    *lo = *hi = 0;
    if (start >= 0 && length > 0 && start < view.len) {
        *lo = ((uintptr_t)view.buf + start) & ~(uintptr_t)(page - 1);
        *hi = (uintptr_t)view.buf + (start + length < view.len ? start + length : view.len);
    }
    PyBuffer_Release(&view);
    return 0;
}

/* populate(mm, start, length) -> bool: map the pages of mm[start:start+length] writable now, without the
 * GIL (MADV_POPULATE_WRITE: the page faults a later copy would take, paid on another thread; contents are
 * not touched, so the writer may be copying into the same pages). False where the kernel cannot. */
static PyObject *populate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    uintptr_t lo, hi;
    if (page_range(args, nargs, "populate(mm, start, length)", &lo, &hi) < 0) return NULL;
    int ok = 0;
#ifdef MADV_POPULATE_WRITE
    if (hi > lo) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
        Py_END_ALLOW_THREADS
        ok = rc == 0;
    }
#endif
    return PyBool_FromLong(ok);
}

/* Wall-clock milliseconds as an int: puts within the same millisecond share one object. */
static PyObject *now_obj_ms(void) {
    static PyObject *last;
    static long long last_ms;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (last != NULL && ms == last_ms) return Py_NewRef(last);
    PyObject *o = PyLong_FromLongLong(ms);
    if (o != NULL) {
        Py_XSETREF(last, Py_NewRef(o));
        last_ms = ms;
    }
    return o;
}

/* put_plain(commit_log, msg) -> PutMessageResult: MessageStore.put_message's common case in one call
 * (ASYNC_FLUSH, asynchronous dispatch, system clock, no replication); CommitLog.plain_put binds it to the
 * commit log with bind_put (below). commit_log.put_state = (store host, topic cache, max message size, segment size,
 * commit-log lock, the dispatcher's wake-up Event, gate, expiry, general, flush gate, flush timeout in
 * seconds, outcome, the Event's __dict__). With a flush gate (SYNC_FLUSH) the put then waits on it instead of waking the
 * dispatcher (the flush round does), and hands a late flush or a crash to outcome(append result, flushed),
 * which builds that status. Any put it does not take itself
 * goes to general(msg) (PutPath.put_general), which reports the status: the store is stopped
 * (gate.running false) or the disk full (expiry.disk_full), the message has a DELAY property, the encoder
 * rejects it, or the commit-log lock is held by someone else (the general path waits for it). */
static PyObject *put_one(PyObject *cl, PyObject *msg) {
    NEED_CONFIGURED(NULL)
    PyObject *st = getattr_fast(cl, SLOT(put_state)), *now = NULL;
    PyObject *ar = NULL, *res = NULL;
    Enc e;
    int encoded = 0;
    if (st == NULL) return NULL;
    if (!PyTuple_CheckExact(st) || PyTuple_GET_SIZE(st) != 13) {
        PyErr_SetString(PyExc_TypeError, "put_plain: put_state is not set");
        goto done;
    }
    PyObject *lock = PyTuple_GET_ITEM(st, 4), *event = PyTuple_GET_ITEM(st, 5);
    PyObject *general = PyTuple_GET_ITEM(st, 8);
    int ok = flag_is(PyTuple_GET_ITEM(st, 6), SLOT(running), 1);
    if (ok > 0) ok = flag_is(PyTuple_GET_ITEM(st, 7), SLOT(disk_full), 0);
    if (ok < 0) goto done;
    if (ok == 0) goto general;
    PyObject *a5[5] = {msg, PyTuple_GET_ITEM(st, 0), PyTuple_GET_ITEM(st, 1), PyTuple_GET_ITEM(st, 2),
                       PyTuple_GET_ITEM(st, 3)};
    if (!encode_fields(a5, &e)) goto general;  /* general() prepares again and reports the error */
    encoded = 1;
    if (e.delay) goto general;  /* noted by encode_fields' walk of the properties */
    int locked = lock_try(lock);
    if (locked < 0) goto done;
    if (!locked) goto general;
    now = now_obj_ms();
    if (now != NULL) ar = put_direct(cl, &e, now);
    if (lock_release(lock) < 0 || ar == NULL) goto done;
    PyObject *fgate = PyTuple_GET_ITEM(st, 9);
    if (fgate != Py_None) {
        if (!Py_IS_TYPE(fgate, &GateType)) {
            PyErr_SetString(PyExc_TypeError, "put_plain: the flush gate is not a FlushGate");
            goto done;
        }
        double timeout = PyFloat_AsDouble(PyTuple_GET_ITEM(st, 10));
        if (timeout == -1.0 && PyErr_Occurred()) goto done;
        PyObject *phys = *(PyObject **)((char *)ar + append_result_cls.offset[1]);
        PyObject *size = *(PyObject **)((char *)ar + append_result_cls.offset[2]);
        long long end = PyLong_AsLongLong(phys) + PyLong_AsLongLong(size);
        if (PyErr_Occurred()) goto done;
        int flushed = gate_wait_end((Gate *)fgate, end, timeout);
        if (flushed < 0) goto done;
        int fine = flushed ? flag_is(PyTuple_GET_ITEM(st, 6), SLOT(crashed), 0) : 0;
        if (fine < 0) goto done;
        if (!fine) {
            PyObject *oargs[2] = {ar, flushed ? Py_True : Py_False};
            res = PyObject_Vectorcall(PyTuple_GET_ITEM(st, 11), oargs, 2, NULL);
            goto done;
        }
    } else {
        /* the Event's _flag read from its __dict__ (put_state[12]) rather than through getattr */
        PyObject *evdict = PyTuple_GET_ITEM(st, 12);
        PyObject *flag = PyDict_CheckExact(evdict) ? PyDict_GetItemWithError(evdict, s_flag_attr) : NULL;
        if (flag != NULL) Py_INCREF(flag);
        else if (PyErr_Occurred() || (flag = PyObject_GetAttr(event, s_flag_attr)) == NULL) goto done;
        if (flag != Py_True) {
            PyObject *set = PyObject_CallMethodNoArgs(event, s_set);
            if (set == NULL) {
                Py_DECREF(flag);
                goto done;
            }
            Py_DECREF(set);
        }
        Py_DECREF(flag);
    }
    PyObject *rargs[3] = {put_status_ok, ar, s_empty};
    res = new_slots(&put_result_cls, rargs);
    goto done;
general:
    res = PyObject_CallOneArg(general, msg);
done:
    if (encoded) enc_clear(&e);
    Py_XDECREF(st); Py_XDECREF(now); Py_XDECREF(ar);
    return res;
}

static PyObject *put_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put_plain(commit_log, msg)");
        return NULL;
    }
    return put_one(args[0], args[1]);
}

/* The bound form: a builtin method whose self is the commit log (METH_O: CPython calls it with the message
 * directly, no functools.partial in between). */
static PyObject *put_bound(PyObject *cl, PyObject *msg) {
    return put_one(cl, msg);
}

static PyMethodDef put_bound_def = {"put_message", put_bound, METH_O, "put_plain bound to a commit log."};

/* bind_put(commit_log) -> put_message(msg): put_plain with the commit log bound. */
static PyObject *bind_put(PyObject *self, PyObject *cl) {
    return PyCFunction_NewEx(&put_bound_def, cl, NULL);
}

static PyObject *now_ms(PyObject *self, PyObject *unused) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

/* java_hash_concat(prefix_hash, s) -> int: message_record.java_hash_concat — Java's String.hashCode() of
 * prefix + s from the prefix's hash, over s's UTF-16 code units, as a signed int32. The index hashes one
 * or more keys per dispatched message; in Python this is big-int arithmetic (≈ 3.6 µs per 32-char key). */
static PyObject *java_hash_concat(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "java_hash_concat(prefix_hash, s: str)");
        return NULL;
    }
    long long prefix = PyLong_AsLongLong(args[0]);
    if (prefix == -1 && PyErr_Occurred()) return NULL;
    PyObject *s = args[1];
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    uint32_t h = (uint32_t)prefix;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {  /* a surrogate pair in UTF-16 */
            c -= 0x10000;
            h = 31u * h + (uint32_t)(0xD800 + (c >> 10));
            c = 0xDC00 + (c & 0x3FF);
        }
        h = 31u * h + (uint32_t)c;
    }
    return PyLong_FromLong((long)(int32_t)h);
}
