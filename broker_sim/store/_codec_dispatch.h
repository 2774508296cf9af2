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
    PyObject *codes = PyList_New(n), *runs = PyList_New(0), *res = NULL;
    PyObject *last_tags = NULL, *last_code = NULL;  /* borrowed: one producer, one tag is the common case */
    long long last_code_v = 0;
    Py_ssize_t *run_of = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1));
    long long *first = PyMem_Malloc(sizeof(long long) * (n + 1));
    Py_ssize_t *count = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1)), *owner = PyMem_Malloc(sizeof(Py_ssize_t) * (n + 1));
    long long *code_of = PyMem_Malloc(sizeof(long long) * (n + 1));
    /* the open run of each (topic, queue id): open addressing over 2^k ≥ 2n slots, no key tuple per hint */
    size_t cap = 16;
    while (cap < 2 * (size_t)n) cap <<= 1;
    Py_ssize_t *open_run = PyMem_Malloc(sizeof(Py_ssize_t) * cap);
    Py_ssize_t nruns = 0;
    if (!codes || !runs || !run_of || !first || !count || !owner || !code_of || !open_run) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t j = 0; j < cap; j++) open_run[j] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i], *topic = PyTuple_GET_ITEM(h, 3), *tags = PyTuple_GET_ITEM(h, 9), *co;
        long long code = 0, qoff, sys_flag, qid;
        int sched = topic == schedule_topic ? 0 : PyUnicode_Compare(topic, schedule_topic);
        if (sched == -1 && PyErr_Occurred()) goto done;
        if (all_special || tags == tags_unknown || sched == 0) {
            PyObject *c = PyObject_CallOneArg(args[1], h);
            if (c == NULL) goto done;
            code = PyLong_AsLongLong(c);
            Py_DECREF(c);
            if (code == -1 && PyErr_Occurred()) goto done;
            co = PyLong_FromLongLong(code);
        } else if (tags == last_tags) {
            code = last_code_v;
            co = Py_NewRef(last_code);
        } else {
            if (tags != Py_None && PyUnicode_GET_LENGTH(tags) > 0) code = java_hash(tags);
            co = PyLong_FromLongLong(code);
            last_tags = tags;
            last_code = co;
            last_code_v = code;
        }
        code_of[i] = code;
        if (co == NULL) goto done;
        PyList_SET_ITEM(codes, i, co);
        run_of[i] = -1;
        if (hint_ll(h, 5, &qoff) < 0 || hint_ll(h, 7, &sys_flag) < 0 || hint_ll(h, 4, &qid) < 0) goto done;
        int tran = (int)(sys_flag & 0xC);
        if (!build_cq || tran == 0x4 || tran == 0xC) continue;
        Py_hash_t th = PyObject_Hash(topic);
        if (th == -1) goto done;
        size_t j = ((size_t)th ^ ((size_t)qid * 0x9E3779B97F4A7C15u)) & (cap - 1);
        Py_ssize_t r = -1;
        for (;; j = (j + 1) & (cap - 1)) {  /* the slot of this queue, or the empty one to claim */
            Py_ssize_t o = open_run[j];
            if (o < 0) break;
            PyObject *ot = PyTuple_GET_ITEM(items[owner[o]], 3);
            long long oq;
            if (hint_ll(items[owner[o]], 4, &oq) < 0) goto done;
            if (oq != qid) continue;
            int same = ot == topic ? 1 : PyUnicode_Compare(ot, topic) == 0;
            if (PyErr_Occurred()) goto done;
            if (same) {
                r = o;
                break;
            }
        }
        if (r < 0 || first[r] + count[r] != qoff) {
            r = nruns++;
            first[r] = qoff;
            count[r] = 0;
            owner[r] = i;
            open_run[j] = r;  /* a queue's later run replaces its earlier one in the same slot */
        }
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
    PyMem_Free(open_run);
    Py_XDECREF(codes); Py_XDECREF(runs);
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
    PyObject *batch = PyList_New(0), *popleft = NULL, *appendleft = NULL;
    if (batch == NULL) return NULL;
    /* bound once per call: each hint is then one popleft call (put back by appendleft if it does not continue
     * the log, which ends the batch) */
    if ((popleft = PyObject_GetAttr(hints, s_popleft)) == NULL || (appendleft = PyObject_GetAttr(hints, s_appendleft)) == NULL)
        goto fail;
    while (PyList_GET_SIZE(batch) < limit) {
        Py_ssize_t n = PyObject_Size(hints);
        if (n < 0) goto fail;
        if (n == 0) break;
        PyObject *h = PyObject_CallNoArgs(popleft);
        if (h == NULL) goto fail;
        long long prev_end, phys, size;
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 11 || hint_ll(h, 0, &prev_end) < 0
            || hint_ll(h, 1, &phys) < 0 || hint_ll(h, 2, &size) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "take_hints: not a dispatch hint");
            PyObject *back = PyObject_CallOneArg(appendleft, h);  /* leave the deque as it was */
            Py_XDECREF(back);
            Py_DECREF(h);
            goto fail;
        }
        if (prev_end > offset || phys < offset || phys + size > end) {
            PyObject *back = PyObject_CallOneArg(appendleft, h);
            Py_DECREF(h);
            if (back == NULL) goto fail;
            Py_DECREF(back);
            break;
        }
        int rc = PyList_Append(batch, h);
        Py_DECREF(h);
        if (rc < 0) goto fail;
        offset = phys + size;
    }
    Py_DECREF(popleft);
    Py_DECREF(appendleft);
    PyObject *off = PyLong_FromLongLong(offset);
    PyObject *res = off ? PyTuple_Pack(2, batch, off) : NULL;
    Py_XDECREF(off);
    Py_DECREF(batch);
    return res;
fail:
    Py_XDECREF(popleft);
    Py_XDECREF(appendleft);
    Py_DECREF(batch);
    return NULL;
}
