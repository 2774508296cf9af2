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
    *s_append, *s_popleft, *s_appendleft, *s_prefault_mark, *s_prefault_wake, *s_put_state, *s_acquire, *s_release,
    *s_flag_attr, *s_set, *s_empty, *s_running, *s_disk_full, *s_crashed, *s_hint_append;
#include "_codec_support.h"

#define NEED_CONFIGURED(ret)                                                                    \
    if (result_type == NULL) {                                                                  \
        PyErr_SetString(PyExc_RuntimeError, "_codec.configure() was not called");              \
        return ret;                                                                             \
    }

#include "_codec_append.h"

#include "_codec_dispatch.h"

#include "_codec_gate.h"

#include "_codec_lock.h"

#include "_codec_put.h"

#include "_codec_prefault.h"

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
    {"bind_put", bind_put, METH_O, "put_plain bound to a commit log: a builtin method taking the message."},
    {"place", (PyCFunction)(void (*)(void))place, METH_FASTCALL, "Append a prepared record (lock held)."},
    {"take_hints", (PyCFunction)(void (*)(void))take_hints, METH_FASTCALL, "Pop hints continuing the log."},
    {"build_runs", (PyCFunction)(void (*)(void))build_runs, METH_FASTCALL, "Group hints into queue runs."},
    {"populate", (PyCFunction)(void (*)(void))populate, METH_FASTCALL, "Prefault pages without the GIL."},
    {"populate_async", (PyCFunction)(void (*)(void))populate_async, METH_FASTCALL,
     "Have the prefault worker populate pages."},
    {"populate_idle", populate_idle, METH_NOARGS, "Wait until the prefault worker is between ranges."},
    {"crc32", crc32_py, METH_O, "zlib.crc32 as the encoder computes it."},
    {"java_hash_concat", (PyCFunction)(void (*)(void))java_hash_concat, METH_FASTCALL,
     "String.hashCode() of a prefix (by its hash) + s."},
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
        {&s_max_hints, "max_hints"}, {&s_last_append, "last_append"}, {&s_roll, "roll"}, {&s_append, "append"}, {&s_popleft, "popleft"}, {&s_appendleft, "appendleft"},
        {&s_prefault_mark, "prefault_mark"}, {&s_prefault_wake, "prefault_wake"}, {&s_put_state, "put_state"},
        {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_flag_attr, "_flag"}, {&s_set, "set"}, {&s_empty, ""},
        {&s_running, "running"}, {&s_disk_full, "disk_full"}, {&s_crashed, "crashed"},
        {&s_hint_append, "hint_append"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL) return NULL;
    }
    crc_table_init();
    pthread_atfork(NULL, NULL, pf_after_fork);
#ifdef HAVE_CLMUL_PATH
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    if (PyType_Ready(&GateType) < 0 || PyType_Ready(&AppendLockType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&GateType);
    if (PyModule_AddObject(m, "FlushGate", (PyObject *)&GateType) < 0) {
        Py_DECREF(&GateType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&AppendLockType);
    if (PyModule_AddObject(m, "AppendLock", (PyObject *)&AppendLockType) < 0) {
        Py_DECREF(&AppendLockType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
