/* Helpers of _codec.c (included once, from there only): big-endian stores, the body CRC, result objects
 * without __init__, in-place slot access, Java's String.hashCode. Split out to keep each file readable. */
static void be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static void be64(unsigned char *p, uint64_t v) {
    be32(p, (uint32_t)(v >> 32)); be32(p + 4, (uint32_t)v);
}

/* PyLong_AsLongLong with its errors, without its slow path: for an int of more than one digit (offsets,
 * timestamps) CPython 3.11 goes through _PyLong_AsByteArray, several hundred instructions per call. */
/* 1 = *out is v (an exact int of at most two 30-bit digits: every offset, size and millisecond timestamp), read
 * straight from CPython 3.11's digits; 0 = use the API. Other versions always use the API. */
static inline int small_ll(PyObject *v, long long *out) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    if (!PyLong_CheckExact(v)) return 0;
    const digit *d = ((PyLongObject *)v)->ob_digit;
    switch (Py_SIZE(v)) {
    case 0: *out = 0; return 1;
    case 1: *out = (long long)d[0]; return 1;
    case -1: *out = -(long long)d[0]; return 1;
    case 2: *out = ((long long)d[1] << 30) | (long long)d[0]; return 1;
    case -2: *out = -(((long long)d[1] << 30) | (long long)d[0]); return 1;
    default: return 0;
    }
#else
    (void)v; (void)out;
    return 0;
#endif
}

static long long as_ll(PyObject *v) {
    long long x;
    if (small_ll(v, &x)) return x;
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow) return x;
    }
    return PyLong_AsLongLong(v);
}


/* ---- BODYCRC: zlib's CRC-32 (reflected polynomial 0xEDB88320) -------------------------------------------
 * x86-64 with PCLMULQDQ: fold the body 16 bytes at a time by carry-less multiplication (Gopal et al.,
 * "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", Intel 2009; the constants below are
 * x^(128+32) mod P, x^(128-32) mod P, x^64 mod P, P and floor(x^64 / P), bit-reflected), then Barrett-
 * reduce to 32 bits and finish the last len % 16 bytes with a byte table. Elsewhere: zlib.crc32. */
static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc_bytes(uint32_t state, const unsigned char *p, size_t n) {
    while (n--) state = crc_table[(state ^ *p++) & 0xFF] ^ (state >> 8);
    return state;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CLMUL_PATH 1
static int have_clmul;

__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(uint32_t state, const unsigned char *p, size_t n) {
    const __m128i k_fold = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);  /* hi: k4, lo: k3 */
    const __m128i k_64 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i barrett = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);  /* hi: u', lo: P' */
    const __m128i low32 = _mm_set_epi32(0, -1, 0, -1);
    const __m128i k_fold4 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);  /* 4 lanes: hi k2, lo k1 */
    __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)state));
    if (n >= 64) {  /* four independent lanes hide the multiplier's latency */
        __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16)), x2 = _mm_loadu_si128((const __m128i *)(p + 32));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
        for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
            x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k_fold4, 0x00), _mm_clmulepi64_si128(x, k_fold4, 0x11)),
                              _mm_loadu_si128((const __m128i *)p));
            x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k_fold4, 0x00), _mm_clmulepi64_si128(x1, k_fold4, 0x11)),
                               _mm_loadu_si128((const __m128i *)(p + 16)));
            x2 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x2, k_fold4, 0x00), _mm_clmulepi64_si128(x2, k_fold4, 0x11)),
                               _mm_loadu_si128((const __m128i *)(p + 32)));
            x3 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x3, k_fold4, 0x00), _mm_clmulepi64_si128(x3, k_fold4, 0x11)),
                               _mm_loadu_si128((const __m128i *)(p + 48)));
        }
        x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k_fold, 0x00), _mm_clmulepi64_si128(x, k_fold, 0x11)), x1);
        x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k_fold, 0x00), _mm_clmulepi64_si128(x, k_fold, 0x11)), x2);
        x = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k_fold, 0x00), _mm_clmulepi64_si128(x, k_fold, 0x11)), x3);
    } else {
        p += 16;
        n -= 16;
    }
    for (; n >= 16; p += 16, n -= 16) {
        __m128i lo = _mm_clmulepi64_si128(x, k_fold, 0x00), hi = _mm_clmulepi64_si128(x, k_fold, 0x11);
        x = _mm_xor_si128(_mm_xor_si128(lo, hi), _mm_loadu_si128((const __m128i *)p));
    }
    /* 128 -> 64 bits */
    x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, k_fold, 0x10));
    /* 64 -> 32 bits (+32 zero bits) */
    x = _mm_xor_si128(_mm_srli_si128(x, 4), _mm_clmulepi64_si128(_mm_and_si128(x, low32), k_64, 0x00));
    /* Barrett reduction */
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, low32), barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
    state = (uint32_t)_mm_extract_epi32(_mm_xor_si128(x, t), 1);
    return crc_bytes(state, p, n);
}
#endif

/* zlib.crc32(buf) & 0x7FFFFFFF into *out; -1 with an exception set on failure. */
static int body_crc(PyObject *body, unsigned long *out) {
#ifdef HAVE_CLMUL_PATH
    if (have_clmul) {
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(body);
        size_t n = (size_t)PyBytes_GET_SIZE(body);
        uint32_t state = n >= 16 ? crc_fold(0xFFFFFFFFu, p, n) : crc_bytes(0xFFFFFFFFu, p, n);
        *out = (~state) & 0x7FFFFFFFu;
        return 0;
    }
#endif
    PyObject *crc = PyObject_CallOneArg(crc32_fn, body);
    if (crc == NULL) return -1;
    *out = PyLong_AsUnsignedLong(crc) & 0x7FFFFFFFu;
    Py_DECREF(crc);
    return PyErr_Occurred() ? -1 : 0;
}

/* crc32(data: bytes) -> int: the CRC the encoder uses, exposed so tests can compare it with zlib.crc32. */
static PyObject *crc32_py(PyObject *self, PyObject *arg) {
    if (!PyBytes_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "crc32 takes bytes");
        return NULL;
    }
    unsigned long v;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(arg);
    size_t n = (size_t)PyBytes_GET_SIZE(arg);
#ifdef HAVE_CLMUL_PATH
    if (have_clmul) {
        uint32_t state = n >= 16 ? crc_fold(0xFFFFFFFFu, p, n) : crc_bytes(0xFFFFFFFFu, p, n);
        return PyLong_FromUnsignedLong(~state);
    }
#endif
    v = ~crc_bytes(0xFFFFFFFFu, p, n);
    return PyLong_FromUnsignedLong(v & 0xFFFFFFFFu);
}

/* ---- result objects without running their dataclass __init__ -------------------------------------------
 * AppendMessageResult and PutMessageResult are slots dataclasses; building one through __init__ runs a Python
 * frame (≈ 0.2 µs, twice per put). configure() records where each slot lives (its member descriptor's
 * offset) and new_slots() fills a freshly allocated instance directly, in __slots__ order. */
#define MAX_SLOTS 8
typedef struct {
    PyTypeObject *type;
    Py_ssize_t n, offset[MAX_SLOTS];
} SlotsClass;
static SlotsClass append_result_cls, put_result_cls;

static int slots_init(SlotsClass *sc, PyObject *cls, Py_ssize_t n) {
    if (!PyType_Check(cls)) goto bad;
    PyObject *names = PyObject_GetAttrString(cls, "__slots__");
    if (names == NULL) return -1;
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != n || n > MAX_SLOTS) {
        Py_DECREF(names);
        goto bad;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyDict_GetItemWithError(((PyTypeObject *)cls)->tp_dict, PyTuple_GET_ITEM(names, i));
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            Py_DECREF(names);
            goto bad;
        }
        sc->offset[i] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    Py_DECREF(names);
    Py_INCREF(cls);
    sc->type = (PyTypeObject *)cls;
    sc->n = n;
    return 0;
bad:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "configure: not a slots class of the expected shape");
    return -1;
}

static PyObject *new_slots(SlotsClass *sc, PyObject *const *values) {
    PyObject *o = sc->type->tp_alloc(sc->type, 0);
    if (o == NULL) return NULL;
    for (Py_ssize_t i = 0; i < sc->n; i++) {
        Py_INCREF(values[i]);
        *(PyObject **)((char *)o + sc->offset[i]) = values[i];
    }
    return o;
}

/* ---- slot attributes read and written in place ------------------------------------------------------------
 * MessageInner (a slots dataclass) and MappedFile (__slots__) are read ≈ 15 times per put; the generic
 * attribute protocol costs a type lookup and a descriptor call each time. For exactly those types (not
 * subclasses) and the registered names, read/write the slot where its member descriptor says it lives. */
#define MAX_FAST_FIELDS 12
typedef struct {
    PyTypeObject *type;
    int n;
    PyObject *names[MAX_FAST_FIELDS];
    Py_ssize_t offs[MAX_FAST_FIELDS];
} FastType;
static FastType fast_types[6];

static int member_offset(PyObject *cls, PyObject *name, Py_ssize_t *off) {
    PyObject *d = PyDict_GetItemWithError(((PyTypeObject *)cls)->tp_dict, name);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "configure: %R is not a slot of %R", name, cls);
        return -1;
    }
    *off = ((PyMemberDescrObject *)d)->d_member->offset;
    return 0;
}

static int register_fast(int k, PyObject *cls, PyObject **names, int n) {
    if (!PyType_Check(cls) || n > MAX_FAST_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "configure: bad fast type");
        return -1;
    }
    FastType *ft = &fast_types[k];
    for (int i = 0; i < n; i++) {
        if (member_offset(cls, names[i], &ft->offs[i]) < 0) return -1;
        ft->names[i] = names[i];
    }
    Py_INCREF(cls);
    Py_XSETREF(ft->type, (PyTypeObject *)cls);
    ft->n = n;
    return 0;
}

/* Where each registered slot sits in its type's FastType (the order of the name lists given to register_fast
 * by configure and register_slots): call sites say SLOT(name), which expands to (kind, index, name). */
enum { K_MSG = 0, K_FILE = 1, K_LOG = 2, K_QUEUE = 3, K_PUT_PATH = 4, K_EXPIRY = 5 };
#define SLOT_topic K_MSG, 0
#define SLOT_body K_MSG, 1
#define SLOT_queue_id K_MSG, 2
#define SLOT_flag K_MSG, 3
#define SLOT_properties K_MSG, 4
#define SLOT_sys_flag K_MSG, 5
#define SLOT_born_timestamp K_MSG, 6
#define SLOT_born_host K_MSG, 7
#define SLOT_store_host K_MSG, 8
#define SLOT_reconsume_times K_MSG, 9
#define SLOT_prepared K_MSG, 10
#define SLOT_wrote K_FILE, 0
#define SLOT_file_from_offset K_FILE, 1
#define SLOT_mm K_FILE, 2
#define SLOT_file_size K_LOG, 0
#define SLOT_max_hints K_LOG, 1
#define SLOT_mfq K_LOG, 2
#define SLOT_table K_LOG, 3
#define SLOT_hints K_LOG, 4
#define SLOT_prefault_mark K_LOG, 5
#define SLOT_last_append K_LOG, 6
#define SLOT_put_state K_LOG, 7
#define SLOT_hint_append K_LOG, 8
#define SLOT_files K_QUEUE, 0
#define SLOT_running K_PUT_PATH, 0
#define SLOT_crashed K_PUT_PATH, 1
#define SLOT_disk_full K_EXPIRY, 0
#define SLOT(f) SLOT_##f, s_##f

/* The slot of obj's exactly registered type (kind k, index i), or NULL: then the generic protocol. */
static inline PyObject **slot_ptr(PyObject *obj, int k, int i) {
    if (Py_TYPE(obj) != fast_types[k].type) return NULL;
    return (PyObject **)((char *)obj + fast_types[k].offs[i]);
}

static PyObject *getattr_fast(PyObject *obj, int k, int i, PyObject *name) {
    PyObject **slot = slot_ptr(obj, k, i);
    if (slot != NULL && *slot != NULL) {
        Py_INCREF(*slot);
        return *slot;
    }
    return PyObject_GetAttr(obj, name);
}

static int setattr_fast(PyObject *obj, int k, int i, PyObject *name, PyObject *v) {
    PyObject **slot = slot_ptr(obj, k, i);
    if (slot == NULL) return PyObject_SetAttr(obj, name, v);
    Py_INCREF(v);
    Py_XSETREF(*slot, v);
    return 0;
}

/* An attribute that must be an exact int within [lo, hi]; 0 = not so (no exception left set). */
static int get_int(PyObject *obj, int k, int f, PyObject *name, long long lo, long long hi, long long *out) {
    PyObject *v = getattr_fast(obj, k, f, name);
    if (v == NULL) { PyErr_Clear(); return 0; }
    int ok = 0;
    long long x;
    if (small_ll(v, &x)) {
        if (x >= lo && x <= hi) { *out = x; ok = 1; }
    } else if (PyLong_CheckExact(v)) {
        int overflow = 0;
        x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow && x >= lo && x <= hi) { *out = x; ok = 1; }
    }
    Py_DECREF(v);
    return ok;
}

static int64_t java_hash(PyObject *s) {
    uint32_t h = 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (int64_t)(int32_t)h;
}

/* prepare(msg, store_host, topic_fields, max_message_size, file_size) -> Prepared (see codec.py) */
static int attr_ll(PyObject *obj, int k, int f, PyObject *name, long long *out) {
    PyObject *v = getattr_fast(obj, k, f, name);
    if (v == NULL) return -1;
    *out = as_ll(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* place(commit_log, prepared, now) -> AppendMessageResult (see codec.py's py_place; lock held). */

/* register_slots(cls, kind): read/write these slots of ``cls`` in place ("commit_log" / "file_queue" /
 * "put_path" / "expiry": the store state flags put_plain reads on every put). */
static PyObject *register_slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "register_slots(cls, kind)");
        return NULL;
    }
    PyObject *log_fields[] = {s_file_size, s_max_hints, s_mfq, s_table, s_hints, s_prefault_mark, s_last_append,
                              s_put_state, s_hint_append};
    PyObject *queue_fields[] = {s_files}, *state_fields[] = {s_running, s_crashed}, *expiry_fields[] = {s_disk_full};
    int rc;
    if (PyUnicode_CompareWithASCIIString(args[1], "commit_log") == 0)
        rc = register_fast(2, args[0], log_fields, 9);
    else if (PyUnicode_CompareWithASCIIString(args[1], "file_queue") == 0)
        rc = register_fast(3, args[0], queue_fields, 1);
    else if (PyUnicode_CompareWithASCIIString(args[1], "put_path") == 0)
        rc = register_fast(4, args[0], state_fields, 2);
    else if (PyUnicode_CompareWithASCIIString(args[1], "expiry") == 0)
        rc = register_fast(5, args[0], expiry_fields, 1);
    else {
        PyErr_SetString(PyExc_ValueError, "register_slots: unknown kind");
        rc = -1;
    }
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* 1 when obj.name is exactly True (want=1) / False-or-falsy (want=0) as wanted, 0 when not, -1 on error. */
static int flag_is(PyObject *obj, int k, int f, PyObject *name, int want) {
    PyObject *v = getattr_fast(obj, k, f, name);
    if (v == NULL) return -1;
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (truth < 0) return -1;
    return truth == want;
}

/* BORNHOST/STOREHOST bytes of host = (ip, port) exactly as message_record.host_bytes packs them: inet_aton
 * (the libc function socket.inet_aton calls) + big-endian int32 port. 1 = done; 0 = not handled here (not an
 * exact (str, int) tuple, a NUL in the string, an address inet_aton rejects, a port out of range): the
 * caller then takes the Python path, which raises the right error. */
static int host8(PyObject *host, unsigned char *out) {
    if (!PyTuple_CheckExact(host) || PyTuple_GET_SIZE(host) != 2) return 0;
    PyObject *ip = PyTuple_GET_ITEM(host, 0), *port = PyTuple_GET_ITEM(host, 1);
    if (!PyUnicode_CheckExact(ip) || !PyLong_CheckExact(port)) return 0;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(ip, &n);
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    int overflow = 0;
    long long pv = PyLong_AsLongLongAndOverflow(port, &overflow);
    if (overflow || pv < 0 || pv > 0x7FFFFFFF || (Py_ssize_t)strlen(s) != n) {
        PyErr_Clear();
        return 0;
    }
    static PyObject *last_ip;  /* the address string parsed last (str is immutable: same object, same bytes) */
    static unsigned char last_addr[4];
    if (ip != last_ip) {
        struct in_addr addr;
        if (!inet_aton(s, &addr)) return 0;
        memcpy(last_addr, &addr.s_addr, 4);  /* already in network (big-endian) order */
        Py_INCREF(ip);
        Py_XSETREF(last_ip, ip);
    }
    memcpy(out, last_addr, 4);
    be32(out + 4, (uint32_t)pv);
    return 1;
}
