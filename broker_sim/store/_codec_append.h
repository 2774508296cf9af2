/* The append of _codec.c (included once, from there only): prepare and place, the twins of codec.py's
 * py_prepare and py_place, and put_direct, which put_plain uses to encode a record straight into the mapped
 * segment (no intermediate record bytes, no Prepared tuple; the bytes, offsets, hint and result are those of
 * prepare + place, which tests/broker_sim/store/test_codec.py checks).
 *
 * Both paths share encode_fields (every check and every field the record needs; nothing is allocated but a
 * new topic's field) and write_record (the record's bytes at any address, position fields zero). */

/* What encode_fields found out about a message; the PyObject fields hold references (enc_clear). */
#define PBUF_MAX 256
typedef struct {
    PyObject *topic, *field, *props, *body, *shost, *qid_obj, *tags;
    Py_ssize_t plen, blen, flen;
    long long size, qid, flag, sys_flag, born_ts, reconsume, prepared;
    unsigned char born[8];
    unsigned long crc;
    int pinline;  /* 1: the PROPERTIES bytes are pbuf[:plen] (walked once); 0: write_record walks the dict */
    int delay;  /* a DELAY property is set (put_plain leaves such a put to the general path) */
    unsigned char pbuf[PBUF_MAX];  /* last member: not cleared by encode_fields */
} Enc;

static void enc_clear(Enc *e) {
    Py_CLEAR(e->topic); Py_CLEAR(e->field); Py_CLEAR(e->props); Py_CLEAR(e->body); Py_CLEAR(e->shost);
    Py_CLEAR(e->qid_obj); Py_CLEAR(e->tags);
}

static PyObject *topic_field(PyObject *cache, PyObject *topic) {
    PyObject *field = PyDict_GetItemWithError(cache, topic);
    if (field != NULL) {
        Py_INCREF(field);
        return field;
    }
    if (PyErr_Occurred()) return NULL;
    PyObject *raw = PyObject_CallOneArg(check_topic, topic);
    if (raw == NULL || !PyBytes_CheckExact(raw) || PyBytes_GET_SIZE(raw) > 127) {
        Py_XDECREF(raw);
        return NULL;
    }
    field = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(raw) + 1);
    if (field != NULL) {
        PyBytes_AS_STRING(field)[0] = (char)PyBytes_GET_SIZE(raw);
        memcpy(PyBytes_AS_STRING(field) + 1, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw));
    }
    Py_DECREF(raw);
    if (field != NULL && PyDict_SetItem(cache, topic, field) < 0) Py_CLEAR(field);
    return field;
}

/* args = (msg, store_host, topic_fields, max_message_size, file_size). 1 = e is filled; 0 = not handled here
 * (a failed check or unusual input; no exception left set, e cleared): the Python twin decides. */
static int encode_fields(PyObject *const *args, Enc *e) {
    PyObject *msg = args[0], *store_host = args[1], *cache = args[2], *k, *v;
    memset(e, 0, offsetof(Enc, pbuf));
    long long max_size = as_ll(args[3]), file_size = as_ll(args[4]);
    if (PyErr_Occurred() || !PyDict_CheckExact(cache)) goto slow;
    e->topic = getattr_fast(msg, SLOT(topic));
    if (e->topic == NULL || !PyUnicode_CheckExact(e->topic)) goto slow;
    if ((e->field = topic_field(cache, e->topic)) == NULL || !PyBytes_CheckExact(e->field)) goto slow;
    /* properties: "k\x01v" joined by "\x02"; clean = no \x01/\x02 inside a name or value */
    e->props = getattr_fast(msg, SLOT(properties));
    if (e->props == NULL || !PyDict_CheckExact(e->props)) goto slow;
    /* One walk: each entry is copied into pbuf as "k\x01v\x02" while it fits (write_record then copies
     * pbuf[:plen]); an entry past that is checked with memchr and written by a second walk. TAGS and DELAY
     * are noted on the way (a str equal to "TAGS" has exactly those UTF-8 bytes). */
    Py_ssize_t pos = 0, n = PyDict_GET_SIZE(e->props), copied = 0;
    unsigned char *w = e->pbuf;
    PyObject *tags = NULL;
    int clean = 1, inl = 1;
    while (PyDict_Next(e->props, &pos, &k, &v)) {
        Py_ssize_t kl, vl;
        const char *kb, *vb;
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) goto slow;
        if ((kb = PyUnicode_AsUTF8AndSize(k, &kl)) == NULL || (vb = PyUnicode_AsUTF8AndSize(v, &vl)) == NULL)
            goto slow;
        if (inl && kl + vl + 2 <= PBUF_MAX - (w - e->pbuf)) {
            memcpy(w, kb, kl);
            w += kl;
            *w++ = 1;
            memcpy(w, vb, vl);
            w += vl;
            *w++ = 2;
            copied++;
        } else {
            inl = 0;
            if (memchr(kb, 1, kl) || memchr(kb, 2, kl) || memchr(vb, 1, vl) || memchr(vb, 2, vl)) clean = 0;
        }
        if (kl == 4 && memcmp(kb, "TAGS", 4) == 0) tags = v;
        else if (kl == 5 && memcmp(kb, "DELAY", 5) == 0) e->delay = 1;
        e->plen += kl + 1 + vl + 1;
    }
    /* the copied entries are clean when their only \x01/\x02 bytes are the separators written above */
    Py_ssize_t seps = 0;
    for (const unsigned char *q = e->pbuf; q < w; q++) seps += (unsigned char)(*q - 1) < 2;
    if (seps != 2 * copied) clean = 0;
    e->pinline = inl;
    if (n > 0) e->plen -= 1;
    if (e->plen > PROPS_MAX) goto slow;
    if (n == 0) {
        e->tags = Py_None;
    } else if (!clean) {
        e->tags = tags_unknown;
    } else {
        e->tags = tags ? tags : Py_None;
    }
    Py_INCREF(e->tags);
    e->body = getattr_fast(msg, SLOT(body));
    if (e->body == NULL || !PyBytes_CheckExact(e->body)) goto slow;
    e->blen = PyBytes_GET_SIZE(e->body);
    e->flen = PyBytes_GET_SIZE(e->field);
    e->size = 90 + (long long)e->blen + e->flen + e->plen;
    if (e->blen > max_size || e->size + BLANK_MIN > file_size) goto slow;
    if (!get_int(msg, SLOT(queue_id), 0, 0x7FFFFFFF, &e->qid)
        || !get_int(msg, SLOT(sys_flag), INT32_MIN, INT32_MAX, &e->sys_flag) || (e->sys_flag & 0x30)
        || !get_int(msg, SLOT(flag), INT32_MIN, INT32_MAX, &e->flag)
        || !get_int(msg, SLOT(born_timestamp), INT64_MIN, INT64_MAX, &e->born_ts)
        || !get_int(msg, SLOT(reconsume_times), INT32_MIN, INT32_MAX, &e->reconsume)
        || !get_int(msg, SLOT(prepared), INT64_MIN, INT64_MAX, &e->prepared))
        goto slow;
    PyObject *sh = getattr_fast(msg, SLOT(store_host)), *bh;
    if (sh == NULL) goto slow;
    if (sh == Py_None) {
        e->shost = store_host;
        Py_INCREF(e->shost);
    } else {
        unsigned char sh8[8];
        e->shost = host8(sh, sh8) ? PyBytes_FromStringAndSize((const char *)sh8, 8) : NULL;
    }
    Py_DECREF(sh);
    if (e->shost == NULL || !PyBytes_CheckExact(e->shost) || PyBytes_GET_SIZE(e->shost) != 8) goto slow;
    if ((bh = getattr_fast(msg, SLOT(born_host))) == NULL) goto slow;
    int born_ok = host8(bh, e->born);
    Py_DECREF(bh);
    if (!born_ok || body_crc(e->body, &e->crc) < 0) goto slow;
    if ((e->qid_obj = getattr_fast(msg, SLOT(queue_id))) == NULL) goto slow;
    return 1;
slow:
    PyErr_Clear();
    enc_clear(e);
    return 0;
}

/* The record of e at r (e->size bytes), QUEUEOFFSET/PHYSICALOFFSET/STORETIMESTAMP zero. */
static void write_record(const Enc *e, unsigned char *r) {
    memset(r, 0, 88);
    be32(r, (uint32_t)e->size);
    be32(r + 4, MESSAGE_MAGIC);
    be32(r + 8, (uint32_t)(e->crc & 0x7FFFFFFF));
    be32(r + 12, (uint32_t)e->qid);
    be32(r + 16, (uint32_t)e->flag);
    be32(r + 36, (uint32_t)e->sys_flag);
    be64(r + 40, (uint64_t)e->born_ts);
    memcpy(r + 48, e->born, 8);
    memcpy(r + 64, PyBytes_AS_STRING(e->shost), 8);
    be32(r + 72, (uint32_t)e->reconsume);
    be64(r + 76, (uint64_t)e->prepared);
    be32(r + 84, (uint32_t)e->blen);
    unsigned char *p = r + 88;
    memcpy(p, PyBytes_AS_STRING(e->body), e->blen);
    p += e->blen;
    memcpy(p, PyBytes_AS_STRING(e->field), e->flen);
    p += e->flen;
    p[0] = (unsigned char)(e->plen >> 8);
    p[1] = (unsigned char)e->plen;
    p += 2;
    if (e->pinline) {
        memcpy(p, e->pbuf, e->plen);
        return;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    int first = 1;
    while (PyDict_Next(e->props, &pos, &k, &v)) {  /* UTF-8 cached by encode_fields: cannot fail */
        Py_ssize_t kl, vl;
        const char *kb = PyUnicode_AsUTF8AndSize(k, &kl), *vb = PyUnicode_AsUTF8AndSize(v, &vl);
        if (!first) *p++ = 2;
        first = 0;
        memcpy(p, kb, kl);
        p += kl;
        *p++ = 1;
        memcpy(p, vb, vl);
        p += vl;
    }
}

static int counted_of(long long sys_flag) {
    int tran = (int)(sys_flag & 0xC);
    return tran != 0x4 && tran != 0xC;
}

/* prepare(msg, store_host, topic_fields, max_message_size, file_size) -> Prepared (see codec.py) */
static PyObject *prepare(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "prepare takes 5 arguments");
        return NULL;
    }
    NEED_CONFIGURED(NULL)
    Enc e;
    if (!encode_fields(args, &e)) return PyObject_Vectorcall(py_prepare, args, 5, NULL);
    PyObject *out = NULL, *record = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)e.size), *props_b = NULL;
    PyObject *key = NULL, *sf = NULL, *pr = NULL;
    if (record == NULL) goto done;
    write_record(&e, (unsigned char *)PyBytes_AS_STRING(record));
    props_b = PyBytes_FromStringAndSize(PyBytes_AS_STRING(record) + e.size - e.plen, e.plen);
    key = PyTuple_Pack(2, e.topic, e.qid_obj);
    sf = PyLong_FromLongLong(e.sys_flag);
    pr = PyLong_FromLongLong(e.prepared);
    if (props_b == NULL || key == NULL || sf == NULL || pr == NULL) goto done;
    PyObject *counted = counted_of(e.sys_flag) ? Py_True : Py_False;
    out = PyTuple_Pack(8, record, key, counted, e.shost, e.tags, props_b, sf, pr);
    /* atomic contents only (bytes, str, int, bool, None): no cycle possible, keep them out of the GC's way */
    PyObject_GC_UnTrack(key);
    if (out != NULL) PyObject_GC_UnTrack(out);
done:
    Py_XDECREF(record); Py_XDECREF(props_b); Py_XDECREF(key); Py_XDECREF(sf); Py_XDECREF(pr);
    enc_clear(&e);
    return out;
}

/* What place_core writes: a prepared record's bytes, or e's record straight into the segment. */
typedef struct {
    PyObject *record, *key, *shost, *tags, *props_b, *sf, *pr;  /* borrowed; props_b NULL: from the segment */
    const Enc *e;
    int counted;
    Py_hash_t key_hash;  /* hash(key), or -1: not known yet */
} Placing;

/* The queue-offset table read and written with the key's hash computed once (CPython 3.11/3.12 export the
 * known-hash dict calls; elsewhere the public ones, which hash the tuple again). */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define TABLE_GET(t, k, h) _PyDict_GetItem_KnownHash((t), (k), (h))
#define TABLE_SET(t, k, v, h) _PyDict_SetItem_KnownHash((t), (k), (v), (h))
#else
#define TABLE_GET(t, k, h) PyDict_GetItemWithError((t), (k))
#define TABLE_SET(t, k, v, h) PyDict_SetItem((t), (k), (v))
#endif

/* The last properties bytes put_direct made: the next put with the same properties (the common case: one
 * producer, one tag) shares the immutable object instead of allocating its own. */
static PyObject *last_props_b;

static PyObject *props_bytes(const unsigned char *p, Py_ssize_t plen) {
    PyObject *b = last_props_b;
    if (b != NULL && PyBytes_GET_SIZE(b) == plen && memcmp(PyBytes_AS_STRING(b), p, plen) == 0) {
        Py_INCREF(b);
        return b;
    }
    b = PyBytes_FromStringAndSize((const char *)p, plen);
    if (b != NULL) {
        Py_INCREF(b);
        Py_XSETREF(last_props_b, b);
    }
    return b;
}

/* The ints of the previous append that the next one often needs again (ints are immutable, so any object of
 * the right value will do): its end (the next record's offset) and its size. */
static PyObject *last_end_int, *last_size_int;

/* An int of value v: *cache when it is one, else a new one, which becomes *cache. */
static PyObject *int_cached(PyObject **cache, long long v) {
    if (*cache != NULL && as_ll(*cache) == v) return Py_NewRef(*cache);
    PyObject *o = PyLong_FromLongLong(v);
    if (o != NULL) Py_XSETREF(*cache, Py_NewRef(o));
    return o;
}

/* py_place's body (commit-log lock held) for pl; returns the AppendMessageResult. */
static PyObject *place_core(PyObject *cl, const Placing *pl, Py_ssize_t size, PyObject *now_obj) {
    long long now = as_ll(now_obj);
    if (now == -1 && PyErr_Occurred()) return NULL;
    PyObject *mfq = NULL, *files = NULL, *mf = NULL, *mm = NULL, *table = NULL, *hints = NULL, *res = NULL;
    PyObject *props_b = NULL;  /* owned once the record is written */
    PyObject *q_held = NULL;  /* the table's current offset for the key: it is the queue offset of this record */
    long long file_size, wrote = 0, base = 0, prev_end = 0, qoff = 0, max_hints;
    Py_buffer view = {0};
    if (attr_ll(cl, SLOT(file_size), &file_size) < 0 || attr_ll(cl, SLOT(max_hints), &max_hints) < 0) return NULL;
    if ((mfq = getattr_fast(cl, SLOT(mfq))) == NULL || (files = getattr_fast(mfq, SLOT(files))) == NULL) goto done;
    if (!PyList_Check(files)) {
        PyErr_SetString(PyExc_TypeError, "place: segment list is not a list");
        goto done;
    }
    Py_ssize_t nfiles = PyList_GET_SIZE(files);
    if (nfiles > 0) {
        mf = PyList_GET_ITEM(files, nfiles - 1);
        Py_INCREF(mf);
        if (attr_ll(mf, SLOT(wrote), &wrote) < 0 || attr_ll(mf, SLOT(file_from_offset), &base) < 0) goto done;
        prev_end = base + wrote;
    }
    if (mf == NULL || size + BLANK_MIN > file_size - wrote) {
        Py_XDECREF(mf);
        PyObject *size_arg = PyLong_FromSsize_t(size);
        mf = size_arg ? PyObject_CallMethodOneArg(cl, s_roll, size_arg) : NULL;
        Py_XDECREF(size_arg);
        if (mf == NULL) goto done;
        if (attr_ll(mf, SLOT(wrote), &wrote) < 0 || attr_ll(mf, SLOT(file_from_offset), &base) < 0) goto done;
    }
    long long phys = base + wrote;
    if ((table = getattr_fast(cl, SLOT(table))) == NULL || !PyDict_Check(table)) goto done_type;
    Py_hash_t kh = pl->key_hash;
    if (pl->counted) {
        if (kh == -1 && (kh = PyObject_Hash(pl->key)) == -1) goto done;
        PyObject *q = TABLE_GET(table, pl->key, kh);
        if (q == NULL && PyErr_Occurred()) goto done;
        if (q != NULL && ((qoff = as_ll(q)) == -1 && PyErr_Occurred())) goto done;
        if (q != NULL && PyLong_CheckExact(q)) q_held = Py_NewRef(q);
    }
    if ((mm = getattr_fast(mf, SLOT(mm))) == NULL || PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE) < 0) goto done;
    if (wrote < 0 || wrote + size > view.len) {
        PyErr_SetString(PyExc_ValueError, "place: record does not fit the mapped segment");
        goto done;
    }
    unsigned char *dst = (unsigned char *)view.buf + wrote;
    if (pl->e != NULL) {
        write_record(pl->e, dst);
        props_b = props_bytes(dst + size - pl->e->plen, pl->e->plen);
    } else {
        memcpy(dst, PyBytes_AS_STRING(pl->record), size);
        props_b = Py_NewRef(pl->props_b);
    }
    be64(dst + 20, (uint64_t)qoff);
    be64(dst + 28, (uint64_t)phys);
    be64(dst + 56, (uint64_t)now);
    PyBuffer_Release(&view);
    if (props_b == NULL) goto done;
    /* this record's offset is usually the previous one's end, its size the previous size, its queue offset the
     * table's int; the new end of the log and of the segment are one int in the first segment (base 0) */
    PyObject *phys_obj = int_cached(&last_end_int, phys), *size_obj = int_cached(&last_size_int, size);
    PyObject *qoff_obj = q_held != NULL ? Py_NewRef(q_held) : PyLong_FromLongLong(qoff);
    PyObject *end_obj = PyLong_FromLongLong(phys + size), *wrote_obj = NULL;
    if (end_obj != NULL) {
        Py_XSETREF(last_end_int, Py_NewRef(end_obj));
        wrote_obj = base == 0 ? Py_NewRef(end_obj) : PyLong_FromLongLong(wrote + size);
    }
    int set = wrote_obj != NULL ? setattr_fast(mf, SLOT(wrote), wrote_obj) : -1;
    Py_XDECREF(wrote_obj);
    if (set < 0 || qoff_obj == NULL || phys_obj == NULL || size_obj == NULL) goto done_objs;
    if (pl->counted) {
        PyObject *next = PyLong_FromLongLong(qoff + 1);
        if (next == NULL || TABLE_SET(table, pl->key, next, kh) < 0) {
            Py_XDECREF(next);
            goto done_objs;
        }
        Py_DECREF(next);
    }
    if ((hints = getattr_fast(cl, SLOT(hints))) == NULL) goto done_objs;
    Py_ssize_t nh = PyObject_Size(hints);
    if (nh < 0) goto done_objs;
    if (nh < max_hints) {
        PyObject *pe = prev_end == phys ? Py_NewRef(phys_obj) : PyLong_FromLongLong(prev_end);
        PyObject *h = pe ? PyTuple_Pack(11, pe, phys_obj, size_obj, PyTuple_GET_ITEM(pl->key, 0),
                                        PyTuple_GET_ITEM(pl->key, 1), qoff_obj, now_obj, pl->sf, pl->pr, pl->tags,
                                        props_b)
                         : NULL;
        Py_XDECREF(pe);
        if (h != NULL) PyObject_GC_UnTrack(h);  /* atomic contents; it may wait long in the deque */
        /* the deque's bound append, kept by the log (no method lookup per put) */
        PyObject *append = h ? getattr_fast(cl, SLOT(hint_append)) : NULL;
        PyObject *ok = append ? PyObject_CallOneArg(append, h) : NULL;
        Py_XDECREF(append);
        Py_XDECREF(h);
        if (ok == NULL) goto done_objs;
        Py_DECREF(ok);
    }
    long long mark;
    if (attr_ll(cl, SLOT(prefault_mark), &mark) < 0) goto done_objs;
    if (phys + size >= mark) {
        PyObject *ok = PyObject_CallMethodNoArgs(cl, s_prefault_wake);
        if (ok == NULL) goto done_objs;
        Py_DECREF(ok);
    }
    /* last_append = (end, now): a tuple only the log holds (nobody can see it change) is refilled in place */
    PyObject **last_slot = slot_ptr(cl, SLOT_last_append), *last = last_slot != NULL ? *last_slot : NULL;
    if (last != NULL && PyTuple_CheckExact(last) && PyTuple_GET_SIZE(last) == 2 && Py_REFCNT(last) == 1) {
        PyObject *old_end = PyTuple_GET_ITEM(last, 0), *old_now = PyTuple_GET_ITEM(last, 1);
        PyTuple_SET_ITEM(last, 0, Py_NewRef(end_obj));
        PyTuple_SET_ITEM(last, 1, Py_NewRef(now_obj));
        Py_DECREF(old_end);  /* ints: freeing them runs no code */
        Py_DECREF(old_now);
    } else {
        last = PyTuple_Pack(2, end_obj, now_obj);
        if (last != NULL) PyObject_GC_UnTrack(last);
        if (last == NULL || setattr_fast(cl, SLOT(last_append), last) < 0) {
            Py_XDECREF(last);
            goto done_objs;
        }
        Py_DECREF(last);
    }
    PyObject *one = PyLong_FromLong(1), *none = PyTuple_New(0);
    PyObject *rargs[8] = {put_ok, phys_obj, size_obj, qoff_obj, now_obj, one, pl->shost, none};
    res = one && none ? new_slots(&append_result_cls, rargs) : NULL;
    Py_XDECREF(one);
    Py_XDECREF(none);
done_objs:
    Py_XDECREF(qoff_obj); Py_XDECREF(phys_obj); Py_XDECREF(size_obj); Py_XDECREF(end_obj);
    goto done;
done_type:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "place: queue table is not a dict");
done:
    if (view.obj != NULL) PyBuffer_Release(&view);
    Py_XDECREF(props_b); Py_XDECREF(q_held);
    Py_XDECREF(mfq); Py_XDECREF(files); Py_XDECREF(mf); Py_XDECREF(mm); Py_XDECREF(table); Py_XDECREF(hints);
    return res;
}

/* place(commit_log, prepared, now) -> AppendMessageResult (see codec.py's py_place; lock held). */
static PyObject *place(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(args[1]) || PyTuple_GET_SIZE(args[1]) != 8) {
        PyErr_SetString(PyExc_TypeError, "place(commit_log, prepared, now)");
        return NULL;
    }
    NEED_CONFIGURED(NULL)
    PyObject *p = args[1];
    Placing pl = {PyTuple_GET_ITEM(p, 0), PyTuple_GET_ITEM(p, 1), PyTuple_GET_ITEM(p, 3), PyTuple_GET_ITEM(p, 4),
                  PyTuple_GET_ITEM(p, 5), PyTuple_GET_ITEM(p, 6), PyTuple_GET_ITEM(p, 7), NULL,
                  PyTuple_GET_ITEM(p, 2) == Py_True, -1};
    if (!PyBytes_CheckExact(pl.record) || !PyTuple_CheckExact(pl.key) || PyTuple_GET_SIZE(pl.key) != 2) {
        PyErr_SetString(PyExc_TypeError, "place: not a prepared record");
        return NULL;
    }
    return place_core(args[0], &pl, PyBytes_GET_SIZE(pl.record), args[2]);
}

/* (topic, queue id) keys of the queue-offset table, kept for the next put to the same queue: a hit is the
 * same topic object and queue id, so the tuple (and its hash inputs) is not built again. */
#define KEY_CACHE 64
static PyObject *key_cache[KEY_CACHE];
static Py_hash_t key_hashes[KEY_CACHE];  /* hash(key_cache[i]) */

/* The key and its hash (*hash). */
static PyObject *queue_key(PyObject *topic, PyObject *qid_obj, long long qid, Py_hash_t *hash) {
    size_t slot = (((uintptr_t)topic >> 4) ^ (size_t)qid) % KEY_CACHE;
    PyObject *k = key_cache[slot];
    if (k != NULL && PyTuple_GET_ITEM(k, 0) == topic && as_ll(PyTuple_GET_ITEM(k, 1)) == qid) {
        Py_INCREF(k);
        *hash = key_hashes[slot];
        return k;
    }
    k = PyTuple_Pack(2, topic, qid_obj);
    if (k == NULL) return NULL;
    if ((*hash = PyObject_Hash(k)) == -1) {
        Py_DECREF(k);
        return NULL;
    }
    PyObject_GC_UnTrack(k);
    Py_INCREF(k);
    Py_XSETREF(key_cache[slot], k);
    key_hashes[slot] = *hash;
    return k;
}

/* encode_fields + place_core: the record of an encoded message written straight into the segment (lock held
 * by the caller). */
static PyObject *put_direct(PyObject *cl, const Enc *e, PyObject *now_obj) {
    Py_hash_t kh = -1;
    PyObject *key = queue_key(e->topic, e->qid_obj, e->qid, &kh), *res = NULL;
    PyObject *sf = PyLong_FromLongLong(e->sys_flag), *pr = PyLong_FromLongLong(e->prepared);
    if (key != NULL && sf != NULL && pr != NULL) {
        Placing pl = {NULL, key, e->shost, e->tags, NULL, sf, pr, e, counted_of(e->sys_flag), kh};
        res = place_core(cl, &pl, (Py_ssize_t)e->size, now_obj);
    }
    Py_XDECREF(key); Py_XDECREF(sf); Py_XDECREF(pr);
    return res;
}
