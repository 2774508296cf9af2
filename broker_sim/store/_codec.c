/* Compiled twin of broker_sim/store/codec.py (py_prepare, py_place, py_build_runs): same bytes, tuples,
 * results; on any input it does not handle itself, or any failed check, it calls the Python function so
 * that errors come from one place. Why it exists and how it is tested: see codec.py's docstring.
 *
 * Record layout (message_record.py, big-endian; QUEUEOFFSET/PHYSICALOFFSET/STORETIMESTAMP patched by place):
 *   0 TOTALSIZE i32 | 4 MAGICCODE i32 | 8 BODYCRC i32 | 12 QUEUEID i32 | 16 FLAG i32 | 20 QUEUEOFFSET i64
 *   28 PHYSICALOFFSET i64 | 36 SYSFLAG i32 | 40 BORNTIMESTAMP i64 | 48 BORNHOST 8 | 56 STORETIMESTAMP i64
 *   64 STOREHOST 8 | 72 RECONSUMETIMES i32 | 76 PREPAREDTRANSACTIONOFFSET i64 | 84 BODYLEN i32
 *   88 BODY | TOPICLEN i8 | TOPIC | PROPERTIESLEN i16 | PROPERTIES ("k\x01v" joined by "\x02")
 * Consume-queue unit (build_runs): 0 commitLogOffset i64 | 8 size i32 | 12 tagsCode i64
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#include <arpa/inet.h>

#define MESSAGE_MAGIC 0xDAA320A7u
#define BLANK_MIN 8
#define PROPS_MAX 32767

static PyObject *py_prepare, *check_topic, *host_bytes, *tags_unknown, *crc32_fn, *result_type, *put_ok,
    *schedule_topic, *py_build_runs, *put_result_type, *put_status_ok;
static PyObject *s_topic, *s_body, *s_queue_id, *s_flag, *s_properties, *s_sys_flag, *s_born_timestamp,
    *s_born_host, *s_store_host, *s_reconsume_times, *s_prepared, *s_tags_key, *s_mfq, *s_files, *s_wrote,
    *s_file_from_offset, *s_mm, *s_file_size, *s_table, *s_hints, *s_max_hints, *s_last_append, *s_roll,
    *s_append, *s_popleft, *s_prefault_mark, *s_prefault_wake, *s_put_state, *s_acquire, *s_release,
    *s_flag_attr, *s_set, *s_empty, *s_running, *s_disk_full, *s_delay, *s_crashed;
#include "_codec_support.h"

#define NEED_CONFIGURED(ret)                                                                    \
    if (result_type == NULL) {                                                                  \
        PyErr_SetString(PyExc_RuntimeError, "_codec.configure() was not called");              \
        return ret;                                                                             \
    }

static PyObject *delegate_prepare(PyObject *const *args) {
    return PyObject_Vectorcall(py_prepare, args, 5, NULL);
}

/* Java String.hashCode over UTF-16 code units, as a signed int32. */
static PyObject *prepare(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "prepare takes 5 arguments");
        return NULL;
    }
    NEED_CONFIGURED(NULL)
    PyObject *msg = args[0], *store_host = args[1], *cache = args[2];
    PyObject *topic = NULL, *field = NULL, *props = NULL, *body = NULL, *shost = NULL;
    PyObject *record = NULL, *props_b = NULL, *key = NULL, *qid_obj = NULL, *tags = NULL;
    PyObject *out = NULL, *res = NULL;
    long long max_size = PyLong_AsLongLong(args[3]), file_size = PyLong_AsLongLong(args[4]);
    long long qid, flag, sys_flag, born_ts, reconsume, prepared;
    if (PyErr_Occurred() || !PyDict_CheckExact(cache)) goto slow;
    topic = getattr_fast(msg, s_topic);
    if (topic == NULL || !PyUnicode_CheckExact(topic)) goto slow;
    field = PyDict_GetItemWithError(cache, topic);
    if (field == NULL) {
        if (PyErr_Occurred()) goto slow;
        PyObject *raw = PyObject_CallOneArg(check_topic, topic);
        if (raw == NULL || !PyBytes_CheckExact(raw) || PyBytes_GET_SIZE(raw) > 127) {
            Py_XDECREF(raw);
            goto slow;
        }
        field = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(raw) + 1);
        if (field != NULL) {
            PyBytes_AS_STRING(field)[0] = (char)PyBytes_GET_SIZE(raw);
            memcpy(PyBytes_AS_STRING(field) + 1, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw));
        }
        Py_DECREF(raw);
        if (field == NULL || PyDict_SetItem(cache, topic, field) < 0) goto slow;
    } else {
        Py_INCREF(field);
    }
    if (!PyBytes_CheckExact(field)) goto slow;
    /* properties: "k\x01v" joined by "\x02"; clean = no \x01/\x02 inside a name or value */
    props = getattr_fast(msg, s_properties);
    if (props == NULL || !PyDict_CheckExact(props)) goto slow;
    Py_ssize_t plen = 0, pos = 0, n = PyDict_GET_SIZE(props);
    int clean = 1;
    PyObject *k, *v;
    while (PyDict_Next(props, &pos, &k, &v)) {
        Py_ssize_t kl, vl;
        const char *kb, *vb;
        if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) goto slow;
        if ((kb = PyUnicode_AsUTF8AndSize(k, &kl)) == NULL || (vb = PyUnicode_AsUTF8AndSize(v, &vl)) == NULL)
            goto slow;
        if (memchr(kb, 1, kl) || memchr(kb, 2, kl) || memchr(vb, 1, vl) || memchr(vb, 2, vl)) clean = 0;
        plen += kl + 1 + vl + 1;
    }
    if (n > 0) plen -= 1;
    if (plen > PROPS_MAX) goto slow;
    if (n == 0) {
        tags = Py_None;
        Py_INCREF(tags);
    } else if (!clean) {
        tags = tags_unknown;
        Py_INCREF(tags);
    } else {
        tags = PyDict_GetItemWithError(props, s_tags_key);
        if (tags == NULL && PyErr_Occurred()) goto slow;
        tags = tags ? tags : Py_None;
        Py_INCREF(tags);
    }
    body = getattr_fast(msg, s_body);
    if (body == NULL || !PyBytes_CheckExact(body)) goto slow;
    Py_ssize_t blen = PyBytes_GET_SIZE(body);
    Py_ssize_t flen = PyBytes_GET_SIZE(field);
    long long size = 90 + (long long)blen + flen + plen;
    if (blen > max_size || size + BLANK_MIN > file_size) goto slow;
    if (!get_int(msg, s_queue_id, 0, 0x7FFFFFFF, &qid) || !get_int(msg, s_sys_flag, INT32_MIN, INT32_MAX, &sys_flag)
        || (sys_flag & 0x30) || !get_int(msg, s_flag, INT32_MIN, INT32_MAX, &flag)
        || !get_int(msg, s_born_timestamp, INT64_MIN, INT64_MAX, &born_ts)
        || !get_int(msg, s_reconsume_times, INT32_MIN, INT32_MAX, &reconsume)
        || !get_int(msg, s_prepared, INT64_MIN, INT64_MAX, &prepared))
        goto slow;
    unsigned char born[8];
    PyObject *sh = getattr_fast(msg, s_store_host), *bh = NULL;
    if (sh == NULL) goto slow;
    if (sh == Py_None) {
        shost = store_host;
        Py_INCREF(shost);
    } else {
        unsigned char sh8[8];
        shost = host8(sh, sh8) ? PyBytes_FromStringAndSize((const char *)sh8, 8) : NULL;
    }
    Py_DECREF(sh);
    if (shost == NULL || !PyBytes_CheckExact(shost) || PyBytes_GET_SIZE(shost) != 8) goto slow;
    if ((bh = getattr_fast(msg, s_born_host)) == NULL) goto slow;
    int born_ok = host8(bh, born);
    Py_DECREF(bh);
    if (!born_ok) goto slow;
    unsigned long crcv;
    if (body_crc(body, &crcv) < 0) goto slow;
    record = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    props_b = PyBytes_FromStringAndSize(NULL, plen);
    if (record == NULL || props_b == NULL) goto fail;
    unsigned char *r = (unsigned char *)PyBytes_AS_STRING(record);
    memset(r, 0, 88);
    be32(r, (uint32_t)size);
    be32(r + 4, MESSAGE_MAGIC);
    be32(r + 8, (uint32_t)(crcv & 0x7FFFFFFF));
    be32(r + 12, (uint32_t)qid);
    be32(r + 16, (uint32_t)flag);
    be32(r + 36, (uint32_t)sys_flag);
    be64(r + 40, (uint64_t)born_ts);
    memcpy(r + 48, born, 8);
    memcpy(r + 64, PyBytes_AS_STRING(shost), 8);
    be32(r + 72, (uint32_t)reconsume);
    be64(r + 76, (uint64_t)prepared);
    be32(r + 84, (uint32_t)blen);
    unsigned char *p = r + 88;
    memcpy(p, PyBytes_AS_STRING(body), blen);
    p += blen;
    memcpy(p, PyBytes_AS_STRING(field), flen);
    p += flen;
    p[0] = (unsigned char)(plen >> 8);
    p[1] = (unsigned char)plen;
    p += 2;
    unsigned char *pb = (unsigned char *)PyBytes_AS_STRING(props_b);
    pos = 0;
    int first = 1;
    while (PyDict_Next(props, &pos, &k, &v)) {
        Py_ssize_t kl, vl;
        const char *kb = PyUnicode_AsUTF8AndSize(k, &kl), *vb = PyUnicode_AsUTF8AndSize(v, &vl);
        if (!first) *pb++ = 2;
        first = 0;
        memcpy(pb, kb, kl);
        pb += kl;
        *pb++ = 1;
        memcpy(pb, vb, vl);
        pb += vl;
    }
    memcpy(p, PyBytes_AS_STRING(props_b), plen);
    qid_obj = getattr_fast(msg, s_queue_id);
    if (qid_obj == NULL) goto fail;
    key = PyTuple_Pack(2, topic, qid_obj);
    if (key == NULL) goto fail;
    int tran = (int)(sys_flag & 0xC);
    PyObject *counted = (tran != 0x4 && tran != 0xC) ? Py_True : Py_False;
    PyObject *sf = PyLong_FromLongLong(sys_flag), *pr = PyLong_FromLongLong(prepared);
    if (sf == NULL || pr == NULL) {
        Py_XDECREF(sf);
        Py_XDECREF(pr);
        goto fail;
    }
    out = PyTuple_Pack(8, record, key, counted, shost, tags, props_b, sf, pr);
    /* atomic contents only (bytes, str, int, bool, None): no cycle possible, keep them out of the GC's way */
    PyObject_GC_UnTrack(key);
    if (out != NULL) PyObject_GC_UnTrack(out);
    Py_DECREF(sf);
    Py_DECREF(pr);
    res = out;
    goto done;
slow:
    PyErr_Clear();
    res = delegate_prepare(args);
    goto done;
fail:
    res = NULL;
done:
    Py_XDECREF(topic); Py_XDECREF(field); Py_XDECREF(props); Py_XDECREF(body); Py_XDECREF(shost);
    Py_XDECREF(record); Py_XDECREF(props_b); Py_XDECREF(key);
    Py_XDECREF(qid_obj); Py_XDECREF(tags);
    return res;
}

static PyObject *place(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(args[1]) || PyTuple_GET_SIZE(args[1]) != 8) {
        PyErr_SetString(PyExc_TypeError, "place(commit_log, prepared, now)");
        return NULL;
    }
    NEED_CONFIGURED(NULL)
    PyObject *cl = args[0], *p = args[1], *now_obj = args[2];
    PyObject *record = PyTuple_GET_ITEM(p, 0), *key = PyTuple_GET_ITEM(p, 1);
    int counted = PyTuple_GET_ITEM(p, 2) == Py_True;
    if (!PyBytes_CheckExact(record) || !PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2) {
        PyErr_SetString(PyExc_TypeError, "place: not a prepared record");
        return NULL;
    }
    long long now = PyLong_AsLongLong(now_obj);
    if (now == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(record);
    PyObject *mfq = NULL, *files = NULL, *mf = NULL, *mm = NULL, *table = NULL, *hints = NULL, *res = NULL;
    long long file_size, wrote = 0, base = 0, prev_end = 0, qoff = 0, max_hints;
    Py_buffer view = {0};
    if (attr_ll(cl, s_file_size, &file_size) < 0 || attr_ll(cl, s_max_hints, &max_hints) < 0) return NULL;
    if ((mfq = getattr_fast(cl, s_mfq)) == NULL || (files = getattr_fast(mfq, s_files)) == NULL)
        goto done;
    if (!PyList_Check(files)) {
        PyErr_SetString(PyExc_TypeError, "place: segment list is not a list");
        goto done;
    }
    Py_ssize_t nfiles = PyList_GET_SIZE(files);
    if (nfiles > 0) {
        mf = PyList_GET_ITEM(files, nfiles - 1);
        Py_INCREF(mf);
        if (attr_ll(mf, s_wrote, &wrote) < 0 || attr_ll(mf, s_file_from_offset, &base) < 0) goto done;
        prev_end = base + wrote;
    }
    if (mf == NULL || size + BLANK_MIN > file_size - wrote) {
        Py_XDECREF(mf);
        PyObject *size_arg = PyLong_FromSsize_t(size);
        mf = size_arg ? PyObject_CallMethodOneArg(cl, s_roll, size_arg) : NULL;
        Py_XDECREF(size_arg);
        if (mf == NULL) goto done;
        if (attr_ll(mf, s_wrote, &wrote) < 0 || attr_ll(mf, s_file_from_offset, &base) < 0) goto done;
    }
    long long phys = base + wrote;
    if ((table = getattr_fast(cl, s_table)) == NULL || !PyDict_Check(table)) goto done_type;
    if (counted) {
        PyObject *q = PyDict_GetItemWithError(table, key);
        if (q == NULL && PyErr_Occurred()) goto done;
        if (q != NULL && ((qoff = PyLong_AsLongLong(q)) == -1 && PyErr_Occurred())) goto done;
    }
    if ((mm = getattr_fast(mf, s_mm)) == NULL || PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE) < 0) goto done;
    if (wrote < 0 || wrote + size > view.len) {
        PyErr_SetString(PyExc_ValueError, "place: record does not fit the mapped segment");
        goto done;
    }
    unsigned char *dst = (unsigned char *)view.buf + wrote;
    memcpy(dst, PyBytes_AS_STRING(record), size);
    be64(dst + 20, (uint64_t)qoff);
    be64(dst + 28, (uint64_t)phys);
    be64(dst + 56, (uint64_t)now);
    PyBuffer_Release(&view);
    if (set_ll(mf, s_wrote, wrote + size) < 0) goto done;
    PyObject *qoff_obj = PyLong_FromLongLong(qoff), *phys_obj = PyLong_FromLongLong(phys);
    PyObject *size_obj = PyLong_FromSsize_t(size);
    if (qoff_obj == NULL || phys_obj == NULL || size_obj == NULL) goto done_objs;
    if (counted) {
        PyObject *next = PyLong_FromLongLong(qoff + 1);
        if (next == NULL || PyDict_SetItem(table, key, next) < 0) {
            Py_XDECREF(next);
            goto done_objs;
        }
        Py_DECREF(next);
    }
    if ((hints = getattr_fast(cl, s_hints)) == NULL) goto done_objs;
    Py_ssize_t nh = PyObject_Size(hints);
    if (nh < 0) goto done_objs;
    if (nh < max_hints) {
        PyObject *pe = PyLong_FromLongLong(prev_end);
        PyObject *h = pe ? PyTuple_Pack(11, pe, phys_obj, size_obj, PyTuple_GET_ITEM(key, 0), PyTuple_GET_ITEM(key, 1),
                                        qoff_obj, now_obj, PyTuple_GET_ITEM(p, 6), PyTuple_GET_ITEM(p, 7),
                                        PyTuple_GET_ITEM(p, 4), PyTuple_GET_ITEM(p, 5))
                         : NULL;
        Py_XDECREF(pe);
        if (h != NULL) PyObject_GC_UnTrack(h);  /* atomic contents; it may wait long in the deque */
        PyObject *ok = h ? PyObject_CallMethodOneArg(hints, s_append, h) : NULL;
        Py_XDECREF(h);
        if (ok == NULL) goto done_objs;
        Py_DECREF(ok);
    }
    long long mark;
    if (attr_ll(cl, s_prefault_mark, &mark) < 0) goto done_objs;
    if (phys + size >= mark) {
        PyObject *ok = PyObject_CallMethodNoArgs(cl, s_prefault_wake);
        if (ok == NULL) goto done_objs;
        Py_DECREF(ok);
    }
    PyObject *end = PyLong_FromLongLong(phys + size);
    PyObject *last = end ? PyTuple_Pack(2, end, now_obj) : NULL;
    Py_XDECREF(end);
    if (last != NULL) PyObject_GC_UnTrack(last);
    if (last == NULL || setattr_fast(cl, s_last_append, last) < 0) {
        Py_XDECREF(last);
        goto done_objs;
    }
    Py_DECREF(last);
    PyObject *one = PyLong_FromLong(1), *none = PyTuple_New(0);
    PyObject *rargs[8] = {put_ok, phys_obj, size_obj, qoff_obj, now_obj, one, PyTuple_GET_ITEM(p, 3), none};
    res = one && none ? new_slots(&append_result_cls, rargs) : NULL;
    Py_XDECREF(one);
    Py_XDECREF(none);
done_objs:
    Py_XDECREF(qoff_obj); Py_XDECREF(phys_obj); Py_XDECREF(size_obj);
    goto done;
done_type:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "place: queue table is not a dict");
done:
    if (view.obj != NULL) PyBuffer_Release(&view);
    Py_XDECREF(mfq); Py_XDECREF(files); Py_XDECREF(mf); Py_XDECREF(mm); Py_XDECREF(table); Py_XDECREF(hints);
    return res;
}

#include "_codec_dispatch.h"

#include "_codec_gate.h"

#include "_codec_put.h"

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject **slots[] = {&py_prepare, &check_topic, &host_bytes, &tags_unknown, &crc32_fn, &result_type,
                          &put_ok, &schedule_topic, &py_build_runs, &put_result_type, &put_status_ok};
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "configure takes 13 arguments");
        return NULL;
    }
    PyObject *msg_fields[] = {s_topic, s_body, s_queue_id, s_flag, s_properties, s_sys_flag, s_born_timestamp,
                              s_born_host, s_store_host, s_reconsume_times, s_prepared};
    PyObject *file_fields[] = {s_wrote, s_file_from_offset, s_mm};
    if (register_fast(0, args[11], msg_fields, 11) < 0 || register_fast(1, args[12], file_fields, 3) < 0) return NULL;
    if (!PyUnicode_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "configure: the schedule topic must be a str");
        return NULL;
    }
    if (slots_init(&append_result_cls, args[5], 8) < 0 || slots_init(&put_result_cls, args[9], 3) < 0) return NULL;
    for (int i = 0; i < 11; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"register_slots", (PyCFunction)(void (*)(void))register_slots, METH_FASTCALL, "Slots read in place."},
    {"prepare", (PyCFunction)(void (*)(void))prepare, METH_FASTCALL, "Validate and encode one record."},
    {"put_plain", (PyCFunction)(void (*)(void))put_plain, METH_FASTCALL, "The common put in one call."},
    {"place", (PyCFunction)(void (*)(void))place, METH_FASTCALL, "Append a prepared record (lock held)."},
    {"take_hints", (PyCFunction)(void (*)(void))take_hints, METH_FASTCALL, "Pop hints continuing the log."},
    {"build_runs", (PyCFunction)(void (*)(void))build_runs, METH_FASTCALL, "Group hints into queue runs."},
    {"populate", (PyCFunction)(void (*)(void))populate, METH_FASTCALL, "Prefault pages without the GIL."},
    {"crc32", crc32_py, METH_O, "zlib.crc32 as the encoder computes it."},
    {"now_ms", now_ms, METH_NOARGS, "Wall-clock milliseconds (time.time_ns() // 1_000_000)."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, "Hand over the Python helpers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codec", "Compiled twin of codec.py.", -1, methods};

PyMODINIT_FUNC PyInit__codec(void) {
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_topic, "topic"}, {&s_body, "body"}, {&s_queue_id, "queue_id"}, {&s_flag, "flag"},
        {&s_properties, "properties"}, {&s_sys_flag, "sys_flag"}, {&s_born_timestamp, "born_timestamp"},
        {&s_born_host, "born_host"}, {&s_store_host, "store_host"}, {&s_reconsume_times, "reconsume_times"},
        {&s_prepared, "prepared_transaction_offset"}, {&s_tags_key, "TAGS"}, {&s_mfq, "mfq"},
        {&s_files, "files"}, {&s_wrote, "wrote"}, {&s_file_from_offset, "file_from_offset"}, {&s_mm, "mm"},
        {&s_file_size, "file_size"}, {&s_table, "topic_queue_table"}, {&s_hints, "dispatch_hints"},
        {&s_max_hints, "max_hints"}, {&s_last_append, "last_append"}, {&s_roll, "roll"}, {&s_append, "append"}, {&s_popleft, "popleft"},
        {&s_prefault_mark, "prefault_mark"}, {&s_prefault_wake, "prefault_wake"}, {&s_put_state, "put_state"},
        {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_flag_attr, "_flag"}, {&s_set, "set"}, {&s_empty, ""},
        {&s_running, "running"}, {&s_disk_full, "disk_full"}, {&s_delay, "DELAY"}, {&s_crashed, "crashed"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL) return NULL;
    }
    crc_table_init();
#ifdef HAVE_CLMUL_PATH
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    if (PyType_Ready(&GateType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&GateType);
    if (PyModule_AddObject(m, "FlushGate", (PyObject *)&GateType) < 0) {
        Py_DECREF(&GateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
