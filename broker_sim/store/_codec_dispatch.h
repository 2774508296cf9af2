/* Dispatch helpers of _codec.c (included once, from there only): take_hints and build_runs, the twins of
 * codec.py's py_take_hints and py_build_runs. */
static int hint_ll(PyObject *h, Py_ssize_t i, long long *out) {
    *out = as_ll(PyTuple_GET_ITEM(h, i));
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* build_runs(batch, special, all_special, build_cq) -> (runs, codes) (see codec.py's py_build_runs). */
static PyObject *build_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "build_runs takes 4 arguments");
        return NULL;
    }
    NEED_CONFIGURED(NULL)
    PyObject *seq = PySequence_Fast(args[0], "build_runs: batch is not a sequence");
    if (seq == NULL) return NULL;
    int all_special = PyObject_IsTrue(args[2]), build_cq = PyObject_IsTrue(args[3]);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) { /* anything unusual: the Python function decides */
        PyObject *h = items[i], *tags;
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 11 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(h, 3))
            || ((tags = PyTuple_GET_ITEM(h, 9)) != Py_None && !PyUnicode_CheckExact(tags))) {
            Py_DECREF(seq);
            return PyObject_Vectorcall(py_build_runs, args, 4, NULL);
        }
    }
    PyObject *codes = PyList_New(n), *open = PyDict_New(), *runs = PyList_New(0), *res = NULL;
    Py_ssize_t *run_of = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1));
    long long *first = PyMem_Malloc(sizeof(long long) * (n + 1));
    Py_ssize_t *count = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1)), *owner = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1));
    long long *code_of = PyMem_Malloc(sizeof(long long) * (n + 1));
    Py_ssize_t nruns = 0;
    if (!codes || !open || !runs || !run_of || !first || !count || !owner || !code_of) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i], *topic = PyTuple_GET_ITEM(h, 3), *tags = PyTuple_GET_ITEM(h, 9);
        long long code = 0, qoff, sys_flag;
        int sched = PyUnicode_Compare(topic, schedule_topic);
        if (sched == -1 && PyErr_Occurred()) goto done;
        if (all_special || tags == tags_unknown || sched == 0) {
            PyObject *c = PyObject_CallOneArg(args[1], h);
            if (c == NULL) goto done;
            code = PyLong_AsLongLong(c);
            Py_DECREF(c);
            if (code == -1 && PyErr_Occurred()) goto done;
        } else if (tags != Py_None && PyUnicode_GET_LENGTH(tags) > 0) {
            code = java_hash(tags);
        }
        code_of[i] = code;
        PyObject *co = PyLong_FromLongLong(code);
        if (co == NULL) goto done;
        PyList_SET_ITEM(codes, i, co);
        run_of[i] = -1;
        if (hint_ll(h, 5, &qoff) < 0 || hint_ll(h, 7, &sys_flag) < 0) goto done;
        int tran = (int)(sys_flag & 0xC);
        if (!build_cq || tran == 0x4 || tran == 0xC) continue;
        PyObject *key = PyTuple_Pack(2, topic, PyTuple_GET_ITEM(h, 4));
        if (key == NULL) goto done;
        PyObject *ro = PyDict_GetItemWithError(open, key);
        Py_ssize_t r = ro ? PyLong_AsSsize_t(ro) : -1;
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            goto done;
        }
        if (r < 0 || first[r] + count[r] != qoff) {
            r = nruns++;
            first[r] = qoff;
            count[r] = 0;
            owner[r] = i;
            PyObject *idx = PyLong_FromSsize_t(r);
            int rc = idx ? PyDict_SetItem(open, key, idx) : -1;
            Py_XDECREF(idx);
            if (rc < 0) {
                Py_DECREF(key);
                goto done;
            }
        }
        Py_DECREF(key);
        count[r]++;
        run_of[i] = r;
    }
    PyObject **bufs = PyMem_Calloc(nruns + 1, sizeof(PyObject *));
    Py_ssize_t *fill = PyMem_Calloc(nruns + 1, sizeof(Py_ssize_t));
    if (!bufs || !fill) {
        PyMem_Free(bufs);
        PyMem_Free(fill);
        PyErr_NoMemory();
        goto done;
    }
    int failed = 0;
    for (Py_ssize_t r = 0; r < nruns && !failed; r++)
        failed = (bufs[r] = PyBytes_FromStringAndSize(NULL, count[r] * 20)) == NULL;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        Py_ssize_t r = run_of[i];
        long long phys, size;
        if (r < 0) continue;
        if (hint_ll(items[i], 1, &phys) < 0 || hint_ll(items[i], 2, &size) < 0) {
            failed = 1;
            break;
        }
        unsigned char *u = (unsigned char *)PyBytes_AS_STRING(bufs[r]) + 20 * fill[r]++;
        be64(u, (uint64_t)phys);
        be32(u + 8, (uint32_t)size);
        be64(u + 12, (uint64_t)code_of[i]);
    }
    for (Py_ssize_t r = 0; r < nruns; r++) {
        if (!failed) {
            PyObject *h = items[owner[r]], *f = PyLong_FromLongLong(first[r]);
            PyObject *t = f ? PyTuple_Pack(4, PyTuple_GET_ITEM(h, 3), PyTuple_GET_ITEM(h, 4), f, bufs[r]) : NULL;
            Py_XDECREF(f);
            failed = t == NULL || PyList_Append(runs, t) < 0;
            Py_XDECREF(t);
        }
        Py_XDECREF(bufs[r]);
    }
    PyMem_Free(bufs);
    PyMem_Free(fill);
    if (!failed) res = PyTuple_Pack(2, runs, codes);
done:
    PyMem_Free(run_of); PyMem_Free(first); PyMem_Free(count); PyMem_Free(owner); PyMem_Free(code_of);
    Py_XDECREF(codes); Py_XDECREF(open); Py_XDECREF(runs);
    Py_DECREF(seq);
    return res;
}

/* take_hints(hints, offset, end, limit) -> (batch, offset) (see codec.py's py_take_hints). */
static PyObject *take_hints(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "take_hints takes 4 arguments");
        return NULL;
    }
    PyObject *hints = args[0];
    long long offset = PyLong_AsLongLong(args[1]), end = PyLong_AsLongLong(args[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *batch = PyList_New(0);
    if (batch == NULL) return NULL;
    while (PyList_GET_SIZE(batch) < limit) {
        Py_ssize_t n = PyObject_Size(hints);
        if (n < 0) goto fail;
        if (n == 0) break;
        PyObject *h = PySequence_GetItem(hints, 0);
        if (h == NULL) goto fail;
        long long prev_end, phys, size;
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 11 || hint_ll(h, 0, &prev_end) < 0
            || hint_ll(h, 1, &phys) < 0 || hint_ll(h, 2, &size) < 0) {
            Py_DECREF(h);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "take_hints: not a dispatch hint");
            goto fail;
        }
        if (prev_end > offset || phys < offset || phys + size > end) {
            Py_DECREF(h);
            break;
        }
        PyObject *gone = PyObject_CallMethodNoArgs(hints, s_popleft);
        Py_XDECREF(gone);
        int rc = gone == NULL ? -1 : PyList_Append(batch, h);
        Py_DECREF(h);
        if (rc < 0) goto fail;
        offset = phys + size;
    }
    PyObject *off = PyLong_FromLongLong(offset);
    PyObject *res = off ? PyTuple_Pack(2, batch, off) : NULL;
    Py_XDECREF(off);
    Py_DECREF(batch);
    return res;
fail:
    Py_DECREF(batch);
    return NULL;
}
