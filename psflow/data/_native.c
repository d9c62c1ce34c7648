/*
 * psflow.data._native: the input pipeline's per-byte loops, in C.
 *
 * Kernels that numpy can only vectorize with many passes over the data
 * (or not at all: walking a chain of TFRecord headers is sequential):
 *
 *   frame(buf, heads)                          TFRecord header walk
 *   masked_crc32c_ranges(buf, starts, lengths, out)   one masked CRC32C per record
 *   decode_varints(buf, p0, p1, values, counts)       packed varint lists
 *   copy_ranges(buf, starts, lengths, out)     byte ranges, concatenated (packed floats)
 *   walk_examples(buf, starts, lengths, out)   the map entries of serialized tf.train.Examples
 *   match_keys(buf, starts, lengths, out, keys, key_offsets)   which wanted key each entry has
 *   place_entries(buf, entries, count, match, want, n, kind, p0, p1, decoded)   entries onto a key x record grid
 *   split_bytes_lists(buf, b0, b1, starts, lengths, counts)    the items of BytesList bodies
 *   count_newlines(buf)                        the number of lines of a text buffer (bytes.count)
 *   criteo_lines(buf, newlines, salts, num_features, labels, ints, ids, status)   Criteo TSV lines: labels,
 *                                              integers and hashed categorical ids, one pass per line
 *                                              (num_features 0: raw 64-bit ids, no modulo)
 *   crc32c(data, software=False)               one CRC32C (for tests)
 *
 * Each has a pure-numpy twin in psflow/data (tfrecord.py, example_wire.py, criteo.py) that
 * gives the same results; psflow/data/native.py picks this module when it
 * was built and the twin otherwise.  The tests compare the two on random
 * and malformed input.
 *
 * Guarantees: arguments are checked before any byte is read (types, sizes,
 * every range inside the buffer), so a wrong call raises ValueError or
 * TypeError instead of reading or writing out of bounds.  The loops run with
 * the GIL released: other threads (the trainer, RPCs) run meanwhile.  The
 * caller must not resize the buffers concurrently (numpy arrays and bytes
 * cannot be resized while a buffer view is held).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- CRC32C (Castagnoli), software: slicing by 8 ------------------------- */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc_software(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) { crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF]; n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian hosts; see the check in the module init */
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^ crc_table[5][(w >> 16) & 0xFF] ^
              crc_table[4][(w >> 24) & 0xFF] ^ crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

/* ---- CRC32C, hardware (SSE 4.2 on x86-64), chosen at import ------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) { c = _mm_crc32_u8((uint32_t)c, *p++); n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#define HAVE_SSE42_PATH 1
#else
#define HAVE_SSE42_PATH 0
#endif

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static crc_fn crc_best = crc_software;
static int crc_hardware = 0;

static inline uint32_t mask_crc(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xA282EAD8u; }

/* ---- argument helpers --------------------------------------------------- */

/* A contiguous buffer of itemsize-byte integers whose struct format (after any byte-order mark) is
 * one of the two codes in codes, e.g. "ql" for int64; TypeError naming the argument otherwise. */
static int get_ints(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *codes,
                    const char *name, const char *type) {
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (view->itemsize != itemsize || f[0] == 0 || f[1] != 0 || (f[0] != codes[0] && f[0] != codes[1])) {
        PyErr_Format(PyExc_TypeError, "%s must be a%s %s array, got format %s", name, type[0] == 'i' ? "n" : "", type,
                     view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int get_i64(PyObject *obj, Py_buffer *view, int writable, const char *name) {
    return get_ints(obj, view, writable, 8, "ql", name, "int64");
}

static int get_u32(PyObject *obj, Py_buffer *view, const char *name) {
    return get_ints(obj, view, 1, 4, "IL", name, "uint32");
}

/* Every [start, start + length) inside [0, size)?  Sets ValueError naming the first that is not. */
static int check_ranges(const int64_t *start, const int64_t *length, Py_ssize_t n, Py_ssize_t size, const char *what) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (start[i] < 0 || length[i] < 0 || start[i] > (int64_t)size || length[i] > (int64_t)size - start[i]) {
            PyErr_Format(PyExc_ValueError, "%s %zd: [%lld, +%lld) is outside the %zd-byte buffer", what, i,
                         (long long)start[i], (long long)length[i], size);
            return -1;
        }
    }
    return 0;
}

/* The arguments (buf, starts, lengths, out) shared by three kernels: buf any contiguous buffer,
 * starts and lengths int64 of one length n with every range inside buf, out writable (its element
 * type checked by the caller's out_kind); total is sum(lengths).  ranges_release() undoes a
 * successful ranges_get(). */
typedef struct {
    Py_buffer buf, starts, lengths, out;
    Py_ssize_t n;
    int64_t total;
} Ranges;

enum { OUT_BYTES, OUT_U32, OUT_I64 };

static int ranges_acquire(PyObject *buf_obj, PyObject *s_obj, PyObject *l_obj, PyObject *o_obj, int out_kind, Ranges *r) {
    if (PyObject_GetBuffer(buf_obj, &r->buf, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (get_i64(s_obj, &r->starts, 0, "starts") < 0) goto fail_buf;
    if (get_i64(l_obj, &r->lengths, 0, "lengths") < 0) goto fail_s;
    int got = out_kind == OUT_U32   ? get_u32(o_obj, &r->out, "out")
              : out_kind == OUT_I64 ? get_i64(o_obj, &r->out, 1, "out")
                                    : PyObject_GetBuffer(o_obj, &r->out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS);
    if (got < 0) goto fail_l;
    r->n = r->starts.len / 8;
    if (r->lengths.len / 8 != r->n) {
        PyErr_SetString(PyExc_ValueError, "starts and lengths differ in length");
        goto fail_o;
    }
    if (check_ranges(r->starts.buf, r->lengths.buf, r->n, r->buf.len, "range") < 0) goto fail_o;
    r->total = 0;
    for (Py_ssize_t i = 0; i < r->n; i++) r->total += ((const int64_t *)r->lengths.buf)[i];
    return 0;
fail_o:
    PyBuffer_Release(&r->out);
fail_l:
    PyBuffer_Release(&r->lengths);
fail_s:
    PyBuffer_Release(&r->starts);
fail_buf:
    PyBuffer_Release(&r->buf);
    return -1;
}

static int ranges_get(PyObject *args, const char *format, int out_kind, Ranges *r) {
    PyObject *buf_obj, *s_obj, *l_obj, *o_obj;
    if (!PyArg_ParseTuple(args, format, &buf_obj, &s_obj, &l_obj, &o_obj)) return -1;
    return ranges_acquire(buf_obj, s_obj, l_obj, o_obj, out_kind, r);
}

/* Every [p0[i], p1[i]) inside [0, size)?  Sets ValueError naming the first that is not; returns sum(p1 - p0). */
static int64_t check_pairs(const int64_t *p0, const int64_t *p1, Py_ssize_t n, Py_ssize_t size, const char *what) {
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p0[i] < 0 || p1[i] < p0[i] || p1[i] > (int64_t)size) {
            PyErr_Format(PyExc_ValueError, "%s: range %zd [%lld, %lld) is outside the %zd-byte buffer", what, i,
                         (long long)p0[i], (long long)p1[i], size);
            return -1;
        }
        total += p1[i] - p0[i];
    }
    return total;
}

static void ranges_release(Ranges *r) {
    PyBuffer_Release(&r->out);
    PyBuffer_Release(&r->lengths);
    PyBuffer_Release(&r->starts);
    PyBuffer_Release(&r->buf);
}

/* ---- frame -------------------------------------------------------------- */

PyDoc_STRVAR(frame_doc,
"frame(buf, heads) -> (n, end)\n\n"
"Walks TFRecord headers from offset 0 of buf: writes the header offset of each complete record\n"
"(length + 16 bytes fit in buf) to heads (int64, len(buf) // 16 + 1 slots suffice) and returns\n"
"their count and the offset just after the last one.  Checksums are not looked at.");

static PyObject *native_frame(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *heads_obj;
    if (!PyArg_ParseTuple(args, "OO:frame", &buf_obj, &heads_obj)) return NULL;
    Py_buffer buf, heads;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (get_i64(heads_obj, &heads, 1, "heads") < 0) { PyBuffer_Release(&buf); return NULL; }
    const uint8_t *p = buf.buf;
    uint64_t size = (uint64_t)buf.len, pos = 0;
    Py_ssize_t cap = heads.len / 8, n = 0;
    int64_t *out = heads.buf;
    int full = 0;
    Py_BEGIN_ALLOW_THREADS
    while (size - pos >= 12) {
        uint64_t length;
        memcpy(&length, p + pos, 8);
        if (length > size - pos - 12 || 4 > size - pos - 12 - length) break; /* incomplete record */
        if (n == cap) { full = 1; break; }
        out[n++] = (int64_t)pos;
        pos += 16 + length;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyBuffer_Release(&heads);
    if (full) {
        PyErr_SetString(PyExc_ValueError, "frame: heads is too small (give it len(buf) // 16 + 1 slots)");
        return NULL;
    }
    return Py_BuildValue("nK", n, (unsigned long long)pos);
}

/* ---- masked_crc32c_ranges ----------------------------------------------- */

PyDoc_STRVAR(ranges_doc,
"masked_crc32c_ranges(buf, starts, lengths, out)\n\n"
"out[i] = TFRecord's masked CRC32C of buf[starts[i]:starts[i] + lengths[i]] (out: uint32).");

static PyObject *native_masked_crc32c_ranges(PyObject *self, PyObject *args) {
    Ranges r;
    if (ranges_get(args, "OOOO:masked_crc32c_ranges", OUT_U32, &r) < 0) return NULL;
    if (r.out.len / 4 != r.n) {
        PyErr_SetString(PyExc_ValueError, "masked_crc32c_ranges: out and starts differ in length");
        ranges_release(&r);
        return NULL;
    }
    const uint8_t *p = r.buf.buf;
    const int64_t *st = r.starts.buf, *ln = r.lengths.buf;
    uint32_t *out = r.out.buf;
    crc_fn crc = crc_best;
    Py_ssize_t n = r.n;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) out[i] = mask_crc(crc(0, p + st[i], (size_t)ln[i]));
    Py_END_ALLOW_THREADS
    ranges_release(&r);
    Py_RETURN_NONE;
}

/* ---- decode_varints ----------------------------------------------------- */

PyDoc_STRVAR(varints_doc,
"decode_varints(buf, p0, p1, values, counts) -> total\n\n"
"Decodes the packed varints in each byte range buf[p0[i]:p1[i]] into values (int64, the low 64\n"
"bits of each varint, in order; sum(p1 - p0) slots suffice) and counts[i] (int64).  Returns the\n"
"number of values, or -1 if a range ends inside a varint or a varint is longer than 10 bytes.");

static PyObject *native_decode_varints(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *a_obj, *b_obj, *v_obj, *c_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:decode_varints", &buf_obj, &a_obj, &b_obj, &v_obj, &c_obj)) return NULL;
    Py_buffer buf, a, b, v, c;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (get_i64(a_obj, &a, 0, "p0") < 0) goto fail_buf;
    if (get_i64(b_obj, &b, 0, "p1") < 0) goto fail_a;
    if (get_i64(v_obj, &v, 1, "values") < 0) goto fail_b;
    if (get_i64(c_obj, &c, 1, "counts") < 0) goto fail_v;
    Py_ssize_t n = a.len / 8;
    if (b.len / 8 != n || c.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "decode_varints: p0, p1 and counts differ in length");
        goto fail_c;
    }
    {
        const int64_t *p0 = a.buf, *p1 = b.buf;
        int64_t need = check_pairs(p0, p1, n, buf.len, "decode_varints");
        if (need < 0) goto fail_c;
        if (need > v.len / 8) {
            PyErr_SetString(PyExc_ValueError, "decode_varints: values is too small (give it sum(p1 - p0) slots)");
            goto fail_c;
        }
        const uint8_t *p = buf.buf;
        uint64_t *out = v.buf;
        int64_t *counts = c.buf;
        int64_t total = 0;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            int64_t pos = p0[i], end = p1[i], before = total;
            while (pos < end) {
                uint64_t value = 0;
                int shift = 0;
                for (;;) {
                    uint8_t byte = p[pos++];
                    value |= (uint64_t)(byte & 0x7F) << shift;
                    if (byte < 0x80) break;
                    shift += 7;
                    if (shift >= 70 || pos >= end) { bad = 1; break; } /* overlong, or cut by the range's end */
                }
                if (bad) break;
                out[total++] = value;
            }
            counts[i] = total - before;
        }
        Py_END_ALLOW_THREADS
        result = PyLong_FromLongLong(bad ? -1 : total);
    }
fail_c:
    PyBuffer_Release(&c);
fail_v:
    PyBuffer_Release(&v);
fail_b:
    PyBuffer_Release(&b);
fail_a:
    PyBuffer_Release(&a);
fail_buf:
    PyBuffer_Release(&buf);
    return result;
}

/* ---- copy_ranges ------------------------------------------------------- */

PyDoc_STRVAR(copy_doc,
"copy_ranges(buf, starts, lengths, out) -> total\n\n"
"Copies buf[starts[i]:starts[i] + lengths[i]] for each i, one after the other, to the start of\n"
"out (a writable buffer of at least sum(lengths) bytes); returns the number of bytes copied.");

static PyObject *native_copy_ranges(PyObject *self, PyObject *args) {
    Ranges r;
    if (ranges_get(args, "OOOO:copy_ranges", OUT_BYTES, &r) < 0) return NULL;
    const int64_t *st = r.starts.buf, *ln = r.lengths.buf, total = r.total;
    if (total > (int64_t)r.out.len) {
        PyErr_Format(PyExc_ValueError, "copy_ranges: out has %zd bytes, the ranges %lld", r.out.len, (long long)total);
        ranges_release(&r);
        return NULL;
    }
    const uint8_t *p = r.buf.buf;
    uint8_t *out = r.out.buf;
    Py_ssize_t n = r.n;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(out, p + st[i], (size_t)ln[i]);
        out += ln[i];
    }
    Py_END_ALLOW_THREADS
    ranges_release(&r);
    return PyLong_FromLongLong(total);
}

/* ---- walk_examples ------------------------------------------------------ */

/* The varint at p[pos] if it ends before limit and has at most 5 bytes; *nbytes = 0 otherwise. */
static inline int64_t varint5(const uint8_t *p, int64_t pos, int64_t limit, int *nbytes) {
    int64_t value = 0;
    for (int j = 0; j < 5; j++) {
        if (pos + j >= limit) break;
        uint8_t byte = p[pos + j];
        value |= (int64_t)(byte & 0x7F) << (7 * j);
        if (byte < 0x80) { *nbytes = j + 1; return value; }
    }
    *nbytes = 0;
    return 0;
}

PyDoc_STRVAR(walk_doc,
"walk_examples(buf, starts, lengths, out) -> count\n\n"
"Finds the feature-map entries of the serialized Examples buf[starts[i]:starts[i] + lengths[i]],\n"
"in the canonical layout (example.py's _walk): Example{1: Features{1: entry}*}, entry{1: key,\n"
"2: Feature{tag list}}.  out is int64 [6, cap] (cap >= sum(lengths) // 6 + 1); column j of the\n"
"count entries found, record by record, is: record index, key start, key length, list kind\n"
"(1 bytes, 2 float, 3 int64, 0 unset), list body start, list body end.  Returns -1 if a record\n"
"is not in that layout (the caller then uses the protobuf runtime).");

static PyObject *native_walk_examples(PyObject *self, PyObject *args) {
    Ranges r;
    if (ranges_get(args, "OOOO:walk_examples", OUT_I64, &r) < 0) return NULL;
    const int64_t *st = r.starts.buf, *ln = r.lengths.buf;
    Py_ssize_t cap = r.out.len / 8 / 6;
    if (r.out.len % 48 != 0 || cap < r.total / 6 + 1) {
        PyErr_SetString(PyExc_ValueError, "walk_examples: out must be int64 [6, cap] with cap >= sum(lengths) // 6 + 1");
        ranges_release(&r);
        return NULL;
    }
    const uint8_t *p = r.buf.buf;
    Py_ssize_t n = r.n;
    int64_t *rec_o = (int64_t *)r.out.buf, *ks_o = rec_o + cap, *kl_o = ks_o + cap, *kind_o = kl_o + cap,
            *b0_o = kind_o + cap, *b1_o = b0_o + cap;
    Py_ssize_t count = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        int64_t pos = st[i], end = st[i] + ln[i];
        if (ln[i] == 0) continue; /* an empty Example */
        int nb;
        if (p[pos] != 0x0A) { bad = 1; break; }
        int64_t size = varint5(p, pos + 1, end, &nb);
        if (nb == 0 || pos + 1 + nb + size != end) { bad = 1; break; }
        int64_t cur = pos + 1 + nb;
        while (cur < end) {
            /* entry: 0x0A le { 0x0A lk key  0x12 lf { tag ll list } } */
            int nb1, nb2, nb3, nb4 = 1;
            if (p[cur] != 0x0A) { bad = 1; break; }
            int64_t le = varint5(p, cur + 1, end, &nb1);
            int64_t e0 = cur + 1 + nb1, e1 = e0 + le;
            if (nb1 == 0 || e1 > end || e0 >= end || p[e0] != 0x0A) { bad = 1; break; }
            int64_t lk = varint5(p, e0 + 1, end, &nb2);
            int64_t k0 = e0 + 1 + nb2, k1 = k0 + lk;
            if (nb2 == 0 || k1 >= end || p[k1] != 0x12) { bad = 1; break; }
            int64_t lf = varint5(p, k1 + 1, end, &nb3);
            int64_t f0 = k1 + 1 + nb3;
            if (nb3 == 0 || f0 + lf != e1) { bad = 1; break; }
            int64_t kind = 0, b0 = e1;
            if (lf > 0) {
                int64_t tag = p[f0];
                int64_t ll = varint5(p, f0 + 1, end, &nb4);
                int64_t l0 = f0 + 1 + nb4;
                if ((tag & 7) != 2 || tag < 0x08 || tag > 0x1F || nb4 == 0 || l0 + ll != e1) { bad = 1; break; }
                kind = tag >> 3;
                b0 = l0;
            }
            if (count == cap) { bad = 1; break; } /* cannot happen: every entry has >= 6 bytes */
            rec_o[count] = i;
            ks_o[count] = k0;
            kl_o[count] = lk;
            kind_o[count] = kind;
            b0_o[count] = b0;
            b1_o[count] = e1;
            count++;
            cur = e1;
        }
    }
    Py_END_ALLOW_THREADS
    ranges_release(&r);
    return PyLong_FromSsize_t(bad ? -1 : count);
}

/* ---- match_keys ------------------------------------------------------- */

static inline uint64_t fnv1a(const uint8_t *p, int64_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

PyDoc_STRVAR(match_doc,
"match_keys(buf, starts, lengths, out, keys, key_offsets)\n\n"
"out[i] = the index j of the wanted key equal to buf[starts[i]:starts[i] + lengths[i]], or -1 if\n"
"none is (out: int64, one slot per range).  The wanted keys are keys[key_offsets[j]:key_offsets[j + 1]]\n"
"(key_offsets: int64 [k + 1], non-decreasing, inside keys); when two are equal the first wins.\n"
"One hash-table probe per range: the entries of a chunk are matched in one pass, whatever k.");

static PyObject *native_match_keys(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *s_obj, *l_obj, *o_obj, *keys_obj, *ko_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO:match_keys", &buf_obj, &s_obj, &l_obj, &o_obj, &keys_obj, &ko_obj)) return NULL;
    Ranges r;
    if (ranges_acquire(buf_obj, s_obj, l_obj, o_obj, OUT_I64, &r) < 0) return NULL;
    Py_buffer keys, ko;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(keys_obj, &keys, PyBUF_C_CONTIGUOUS) < 0) goto fail_r;
    if (get_i64(ko_obj, &ko, 0, "key_offsets") < 0) goto fail_keys;
    Py_ssize_t k = ko.len / 8 - 1;
    const int64_t *kof = ko.buf;
    if (r.out.len / 8 != r.n) {
        PyErr_SetString(PyExc_ValueError, "match_keys: out and starts differ in length");
        goto fail_ko;
    }
    if (k < 0 || k > (1 << 28)) {
        PyErr_SetString(PyExc_ValueError, "match_keys: key_offsets must have 1 to 2**28 + 1 entries");
        goto fail_ko;
    }
    if (check_pairs(kof, kof + 1, k, keys.len, "match_keys: key") < 0 || kof[0] < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "match_keys: key_offsets[0] is negative");
        goto fail_ko;
    }
    {
        Py_ssize_t size = 16;
        while (size < 2 * k) size *= 2;
        int32_t *table = PyMem_RawMalloc((size_t)(size + k + 1) * sizeof(int32_t)); /* hash table, then next_of */
        if (table == NULL) {
            PyErr_NoMemory();
            goto fail_ko;
        }
        const uint8_t *p = r.buf.buf, *kp = keys.buf;
        const int64_t *st = r.starts.buf, *ln = r.lengths.buf;
        int64_t *out = r.out.buf;
        Py_ssize_t n = r.n, mask = size - 1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = 0; j < size; j++) table[j] = -1;
        for (Py_ssize_t j = 0; j < k; j++) {
            int64_t len = kof[j + 1] - kof[j];
            Py_ssize_t slot = (Py_ssize_t)(fnv1a(kp + kof[j], len) & (uint64_t)mask);
            for (;; slot = (slot + 1) & mask) {
                int32_t t = table[slot];
                if (t < 0) { table[slot] = (int32_t)j; break; }
                if (kof[t + 1] - kof[t] == len && memcmp(kp + kof[t], kp + kof[j], (size_t)len) == 0) break; /* first wins */
            }
        }
        /* Records of one writer list their keys in one order: guess that a key follows the key that
         * followed it last time (next_of[k]: after an unwanted key), and probe only when wrong. */
        int32_t *next_of = table + size, prev = (int32_t)k;
        for (Py_ssize_t j = 0; j <= k; j++) next_of[j] = -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t guess = next_of[prev], found = -1;
            if (guess >= 0 && kof[guess + 1] - kof[guess] == ln[i] && memcmp(kp + kof[guess], p + st[i], (size_t)ln[i]) == 0) {
                found = guess;
            } else {
                Py_ssize_t slot = (Py_ssize_t)(fnv1a(p + st[i], ln[i]) & (uint64_t)mask);
                for (;; slot = (slot + 1) & mask) {
                    int32_t t = table[slot];
                    if (t < 0) break;
                    if (kof[t + 1] - kof[t] == ln[i] && memcmp(kp + kof[t], p + st[i], (size_t)ln[i]) == 0) { found = t; break; }
                }
                next_of[prev] = found;
            }
            out[i] = found;
            prev = found >= 0 ? found : (int32_t)k;
        }
        Py_END_ALLOW_THREADS
        PyMem_RawFree(table);
        result = Py_None;
        Py_INCREF(result);
    }
fail_ko:
    PyBuffer_Release(&ko);
fail_keys:
    PyBuffer_Release(&keys);
fail_r:
    ranges_release(&r);
    return result;
}

/* ---- place_entries ------------------------------------------------------ */

/* place_entries' loop (restrict: the int8 and uint8 outputs alias nothing, so the compiler keeps the
 * inputs in registers).  Returns 0, 1 (the general decoder must decode the chunk) or 2 (entry *at is
 * outside the grid or the buffer). */
static int place_loop(const uint8_t *restrict p, Py_ssize_t size, const int64_t *restrict rec, const int64_t *restrict kind_in,
                      const int64_t *restrict b0, const int64_t *restrict b1, const int64_t *restrict match,
                      const int64_t *restrict want, Py_ssize_t count, Py_ssize_t k, Py_ssize_t n, int8_t *restrict kind,
                      int64_t *restrict p0, int64_t *restrict p1, uint8_t *restrict decoded, Py_ssize_t *at) {
    memset(kind, 0xFF, (size_t)(k * n)); /* -1: no entry yet */
    memset(p0, 0, (size_t)(k * n) * 8);
    memset(p1, 0, (size_t)(k * n) * 8);
    int bad = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t j = match[i], r = rec[i], s0 = b0[i], s1 = b1[i], got = kind_in[i];
        if (j < -1 || j >= k || r < 0 || r >= n || s0 < 0 || s1 < s0 || s1 > (int64_t)size) {
            *at = i; /* checked before any use of the entry */
            return 2;
        }
        decoded[i] = 0;
        if (j < 0) continue;
        Py_ssize_t slot = (Py_ssize_t)(j * n + r);
        if (kind[slot] >= 0) { bad = 1; break; } /* a repeated map key: protobuf's last-wins */
        kind[slot] = (int8_t)got;
        if (got != want[j]) continue;
        if (got != 1 && s1 > s0) { /* one packed field: 0x0A, length, payload up to the body's end */
            int nb = 0;
            int64_t len = 0;
            if (p[s0] == 0x0A) len = varint5(p, s0 + 1, s1, &nb);
            if (nb == 0 || s0 + 1 + nb + len != s1 || (got == 2 && len % 4 != 0)) { bad = 1; break; }
            s0 += 1 + nb;
        }
        p0[slot] = s0;
        p1[slot] = s1;
        decoded[i] = 1;
    }
    for (Py_ssize_t s = 0; s < k * n; s++)
        if (kind[s] < 0) kind[s] = 0;
    return bad;
}

PyDoc_STRVAR(place_doc,
"place_entries(buf, entries, count, match, want, n, kind, p0, p1, decoded) -> status\n\n"
"Lays the first count entries found by walk_examples (entries: its int64 [6, cap] out) onto a grid\n"
"of k wanted keys x n records, slot j * n + r for wanted key j = match[i] (match_keys' output,\n"
"int64 [count], -1: not wanted) and record r: each key's values come out in record order.  want (int64 [k], each 1 to 3) is the list kind\n"
"wanted for each key.  Writes kind (int8 [k * n]: the entry's list kind, 0 where no entry), and\n"
"where the entry has the wanted kind the range of its values: p0, p1 (int64 [k * n]) are the\n"
"packed payload of an int64 or float list (after its one 0x0A field header; empty for an empty\n"
"list) or the whole body of a bytes list; elsewhere p0 = p1 = 0.  decoded[i] (uint8 [count]) is\n"
"1 for the entries placed with their values, 0 for the others (which the caller still checks).\n"
"Returns 0, or -1 when the chunk needs the general decoder: a key repeated in a record, a\n"
"numeric list that is not one packed field, a float payload that is not whole floats.");

static PyObject *native_place_entries(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *e_obj, *m_obj, *w_obj, *k_obj, *p0_obj, *p1_obj, *d_obj;
    Py_ssize_t count, n;
    if (!PyArg_ParseTuple(args, "OOnOOnOOOO:place_entries", &buf_obj, &e_obj, &count, &m_obj, &w_obj, &n, &k_obj, &p0_obj,
                          &p1_obj, &d_obj))
        return NULL;
    Py_buffer buf, e, m, w, kv, a, b, d;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (get_i64(e_obj, &e, 0, "entries") < 0) goto fail_buf;
    if (get_i64(m_obj, &m, 0, "match") < 0) goto fail_e;
    if (get_i64(w_obj, &w, 0, "want") < 0) goto fail_m;
    if (get_ints(k_obj, &kv, 1, 1, "bb", "kind", "int8") < 0) goto fail_w;
    if (get_i64(p0_obj, &a, 1, "p0") < 0) goto fail_k;
    if (get_i64(p1_obj, &b, 1, "p1") < 0) goto fail_a;
    if (get_ints(d_obj, &d, 1, 1, "BB", "decoded", "uint8") < 0) goto fail_b;
    Py_ssize_t cap = e.len / 48, k = w.len / 8;
    if (e.len % 48 != 0 || count < 0 || count > cap || m.len / 8 != count || d.len != count) {
        PyErr_SetString(PyExc_ValueError, "place_entries: want entries int64 [6, cap] with count <= cap, match and decoded [count]");
        goto fail_d;
    }
    if (n < 0 || (k > 0 && n > PY_SSIZE_T_MAX / 8 / k) || kv.len != k * n || a.len / 8 != k * n || b.len / 8 != k * n) {
        PyErr_SetString(PyExc_ValueError, "place_entries: kind, p0 and p1 must have k * n slots (k = len(want))");
        goto fail_d;
    }
    {
        const int64_t *rec = e.buf, *kind_in = rec + 3 * cap, *b0 = rec + 4 * cap, *b1 = rec + 5 * cap, *match = m.buf,
                      *want = w.buf;
        for (Py_ssize_t j = 0; j < k; j++) {
            if (want[j] < 1 || want[j] > 3) {
                PyErr_Format(PyExc_ValueError, "place_entries: want[%zd] = %lld is not a list kind (1 to 3)", j, (long long)want[j]);
                goto fail_d;
            }
        }
        Py_ssize_t i = count;
        int bad;
        Py_BEGIN_ALLOW_THREADS
        bad = place_loop(buf.buf, buf.len, rec, kind_in, b0, b1, match, want, count, k, n, kv.buf, a.buf, b.buf, d.buf, &i);
        Py_END_ALLOW_THREADS
        if (bad == 2) {
            PyErr_Format(PyExc_ValueError, "place_entries: entry %zd (match %lld, record %lld, body [%lld, %lld)) is "
                         "outside the grid or the %zd-byte buffer", i, (long long)match[i], (long long)rec[i],
                         (long long)b0[i], (long long)b1[i], buf.len);
            goto fail_d;
        }
        result = PyLong_FromLong(bad ? -1 : 0);
    }
fail_d:
    PyBuffer_Release(&d);
fail_b:
    PyBuffer_Release(&b);
fail_a:
    PyBuffer_Release(&a);
fail_k:
    PyBuffer_Release(&kv);
fail_w:
    PyBuffer_Release(&w);
fail_m:
    PyBuffer_Release(&m);
fail_e:
    PyBuffer_Release(&e);
fail_buf:
    PyBuffer_Release(&buf);
    return result;
}

/* ---- split_bytes_lists ------------------------------------------------- */

PyDoc_STRVAR(split_doc,
"split_bytes_lists(buf, b0, b1, starts, lengths, counts) -> total\n\n"
"Finds the items of the BytesList bodies buf[b0[i]:b1[i]], each canonically encoded as\n"
"0x0A, a varint length of at most 5 bytes, the bytes: writes each item's start and length, in\n"
"order, to starts and lengths (int64; sum(b1 - b0) // 2 slots suffice) and their number per body\n"
"to counts[i] (int64).  Returns the number of items, or -1 if a body is not in that form.");

static PyObject *native_split_bytes_lists(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *a_obj, *b_obj, *s_obj, *l_obj, *c_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO:split_bytes_lists", &buf_obj, &a_obj, &b_obj, &s_obj, &l_obj, &c_obj)) return NULL;
    Py_buffer buf, a, b, so, lo, c;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (get_i64(a_obj, &a, 0, "b0") < 0) goto fail_buf;
    if (get_i64(b_obj, &b, 0, "b1") < 0) goto fail_a;
    if (get_i64(s_obj, &so, 1, "starts") < 0) goto fail_b;
    if (get_i64(l_obj, &lo, 1, "lengths") < 0) goto fail_s;
    if (get_i64(c_obj, &c, 1, "counts") < 0) goto fail_l;
    Py_ssize_t n = a.len / 8;
    if (b.len / 8 != n || c.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "split_bytes_lists: b0, b1 and counts differ in length");
        goto fail_c;
    }
    {
        const int64_t *p0 = a.buf, *p1 = b.buf;
        int64_t need = check_pairs(p0, p1, n, buf.len, "split_bytes_lists");
        if (need < 0) goto fail_c;
        if (need / 2 > so.len / 8 || need / 2 > lo.len / 8) {
            PyErr_SetString(PyExc_ValueError, "split_bytes_lists: starts or lengths is too small (give each sum(b1 - b0) // 2 slots)");
            goto fail_c;
        }
        const uint8_t *p = buf.buf;
        int64_t *starts = so.buf, *lengths = lo.buf, *counts = c.buf;
        int64_t total = 0;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && !bad; i++) {
            int64_t pos = p0[i], end = p1[i], before = total;
            while (pos < end) {
                int nb;
                if (p[pos] != 0x0A) { bad = 1; break; }
                int64_t size = varint5(p, pos + 1, end, &nb);
                int64_t item = pos + 1 + nb;
                if (nb == 0 || size > end - item) { bad = 1; break; }
                starts[total] = item; /* total < need / 2: every item took >= 2 bytes of its body */
                lengths[total] = size;
                total++;
                pos = item + size;
            }
            counts[i] = total - before;
        }
        Py_END_ALLOW_THREADS
        result = PyLong_FromLongLong(bad ? -1 : total);
    }
fail_c:
    PyBuffer_Release(&c);
fail_l:
    PyBuffer_Release(&lo);
fail_s:
    PyBuffer_Release(&so);
fail_b:
    PyBuffer_Release(&b);
fail_a:
    PyBuffer_Release(&a);
fail_buf:
    PyBuffer_Release(&buf);
    return result;
}

/* ---- criteo_lines ------------------------------------------------------- */

/* The layout of a Criteo line (psflow/data/criteo.py): label, I1..I13, C1..C26, separated by tabs. */
enum { CRITEO_INTS = 13, CRITEO_CATS = 26 };

/* criteo_lines' per-line status codes (criteo.py names them too). */
enum { CRITEO_OK = 0, CRITEO_BLANK = 1, CRITEO_BAD_FIELDS = 2, CRITEO_BAD_LABEL = 3, CRITEO_BAD_INT = 4 /* + column */ };

/* psflow/data/hashing.py's splitmix64, on one word. */
static inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The index of the lowest byte of m with its high bit set (m != 0, only high bits set). */
static inline int64_t first_marked_byte(uint64_t m) {
#if defined(__GNUC__)
    return __builtin_ctzll(m) >> 3;
#else
    int64_t i = 0;
    for (; !(m & 0x80); m >>= 8) i++;
    return i;
#endif
}

/* The field starting at p[pos] ends at the first tab before end, or at end.  hash_field returns its
 * hash_strings(field, salt) (words of 8 bytes, the last one zero-padded, then the length) and sets
 * *stop to the field's end: each word is loaded once, both to look for the tab and to be mixed in.
 * Reads stay below size (bytes after end, up to size, may be loaded and are masked off). */
static inline uint64_t hash_field(const uint8_t *p, int64_t pos, int64_t end, int64_t size, uint64_t salt, int64_t *stop) {
    const uint64_t ones = 0x0101010101010101ull, tabs = 0x0909090909090909ull, highs = 0x8080808080808080ull;
    uint64_t h = salt;
    int64_t q = pos;
    for (;;) {
        uint64_t w = 0; /* little-endian: byte i is bits 8i.. */
        if (size - q >= 8)
            memcpy(&w, p + q, 8); /* one load */
        else
            memcpy(&w, p + q, (size_t)(size - q)); /* the buffer's last bytes */
        uint64_t x = w ^ tabs;
        uint64_t zero = (x - ones) & ~x & highs; /* its lowest set bit marks the first tab byte exactly */
        int64_t n = zero ? first_marked_byte(zero) : 8;
        if (n > end - q) n = end - q;
        if (n < 8) {
            if (n > 0) h = splitmix64(h ^ (w & ((1ull << (8 * n)) - 1)));
            q += n;
            break;
        }
        h = splitmix64(h ^ w);
        q += 8;
    }
    *stop = q;
    return splitmix64(h ^ (uint64_t)(q - pos));
}

/* Parses the integer field starting at p[pos] (ending at the first tab before end, or at end; *stop
 * is set to its end) as text.py's parse_ints does: [+-]? then 1 to 16 decimal digits.  Returns 1 and
 * sets *value when it is one, 0 for an empty field (*value = 0: missing), -1 otherwise. */
static inline int parse_int_field(const uint8_t *p, int64_t pos, int64_t end, int64_t *value, int64_t *stop) {
    int64_t q = pos;
    int negative = 0, bad = 0;
    if (q < end && (p[q] == '-' || p[q] == '+')) negative = p[q++] == '-';
    int64_t digits_at = q;
    uint64_t v = 0; /* wraps past 19 digits: such a field is bad anyway */
    for (; q < end && p[q] != '\t'; q++) {
        unsigned d = (unsigned)p[q] - '0';
        if (d > 9) bad = 1;
        v = v * 10 + d;
    }
    *stop = q;
    *value = 0;
    if (q == pos) return 0;
    if (bad || q - digits_at < 1 || q - digits_at > 16) return -1;
    *value = negative ? -(int64_t)v : (int64_t)v; /* < 10**16: no overflow */
    return 1;
}

/* The id of a categorical field from its 64-bit hash: h % num_features, or with num_features 0 (raw ids)
 * h itself, its bits read as int64 (two's complement, as numpy's .view(np.int64); memcpy, not a cast,
 * so it is defined for h >= 2**63 too). */
static inline int64_t criteo_id(uint64_t h, uint64_t num_features) {
    uint64_t v = num_features ? h % num_features : h;
    int64_t id;
    memcpy(&id, &v, sizeof id);
    return id;
}

/* One non-blank line p[pos:end]: writes its label, integers and ids to slot k of the outputs (whatever
 * its status: the slot is only kept when the line is good) and returns its status. */
static int criteo_line(const uint8_t *p, int64_t pos, int64_t end, int64_t size, const uint64_t *salts,
                       const uint64_t *missing, uint64_t num_features, float *labels, int64_t *ints, int64_t *ids,
                       Py_ssize_t cap, Py_ssize_t k) {
    int status = CRITEO_OK;
    int64_t stop = pos;
    while (stop < end && p[stop] != '\t') stop++;
    if (stop - pos != 1 || (p[pos] != '0' && p[pos] != '1')) status = CRITEO_BAD_LABEL;
    labels[k] = p[pos] == '1' ? 1.0f : 0.0f;
    for (int c = 0; c < CRITEO_INTS; c++) {
        if (stop == end) return CRITEO_BAD_FIELDS; /* fewer than 40 fields */
        int64_t value;
        if (parse_int_field(p, stop + 1, end, &value, &stop) < 0 && status == CRITEO_OK) status = CRITEO_BAD_INT + c;
        ints[c * cap + k] = value;
    }
    for (int c = 0; c < CRITEO_CATS; c++) {
        if (stop == end) return CRITEO_BAD_FIELDS;
        int64_t start = stop + 1;
        uint64_t h = hash_field(p, start, end, size, salts[c], &stop);
        ids[c * cap + k] = criteo_id(stop > start ? h : missing[c], num_features);
    }
    return stop == end ? status : CRITEO_BAD_FIELDS; /* a tab after the 40th field: more than 40 */
}

static Py_ssize_t count_newlines(const uint8_t *p, Py_ssize_t size) {
    Py_ssize_t lines = 0;
    for (const uint8_t *q = p; size > 0 && (q = memchr(q, '\n', (size_t)(p + size - q))) != NULL; q++) lines++;
    return lines;
}

PyDoc_STRVAR(count_newlines_doc,
"count_newlines(buf) -> int\n\n"
"The number of newline bytes in buf: the number of lines criteo_lines(buf, None, ...) walks.");

static PyObject *native_count_newlines(PyObject *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t lines;
    Py_BEGIN_ALLOW_THREADS
    lines = count_newlines(buf.buf, buf.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(lines);
}

PyDoc_STRVAR(criteo_doc,
"criteo_lines(buf, newlines, salts, num_features, labels, ints, ids, status) -> good\n\n"
"Parses the Criteo lines of buf (label, I1..I13, C1..C26, tab-separated; see psflow/data/criteo.py)\n"
"in one pass per line.  Line i ends at newlines[i] (int64, strictly increasing, inside buf) and\n"
"starts after newlines[i - 1]; with newlines None, every newline byte of buf ends a line (the bytes\n"
"after the last one are ignored).  status (int8, one slot per line) gets each line's status: 0 good,\n"
"1 blank, 2 not 40 fields, 3 bad label, 4 + c a bad integer in column I(c + 1) (the first one; a\n"
"wrong field count wins over a bad label, which wins over a bad integer).  The good lines, in order,\n"
"fill the first `good` slots of labels (float32 [n]: 0.0 or 1.0), ints (int64 [13, n]: the\n"
"integers as text.py's parse_ints reads them, 0 where missing) and ids (int64 [26, n]: column c's\n"
"hash_strings(field, salts[c]), or splitmix64(~salts[c]) for an empty field, % num_features),\n"
"where n = len(status); salts is uint64 [26].  num_features is an int >= 0; 0 means raw ids: the\n"
"full 64-bit hash (no modulo), its bits read as int64 (two's complement: negative ids too), for\n"
"tables keyed by the id itself.  A negative num_features raises ValueError.  Returns the number\n"
"of good lines.");

static PyObject *native_criteo_lines(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *nl_obj, *salts_obj, *nf_obj, *lab_obj, *ints_obj, *ids_obj, *st_obj;
    if (!PyArg_ParseTuple(args, "OOOOOOOO:criteo_lines", &buf_obj, &nl_obj, &salts_obj, &nf_obj, &lab_obj, &ints_obj,
                          &ids_obj, &st_obj))
        return NULL;
    if (!PyLong_Check(nf_obj)) {
        PyErr_Format(PyExc_TypeError, "criteo_lines: num_features must be an int, got %.100s", Py_TYPE(nf_obj)->tp_name);
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) return NULL;
    int negative = PyObject_RichCompareBool(nf_obj, zero, Py_LT);
    Py_DECREF(zero);
    if (negative < 0) return NULL;
    if (negative) {
        PyErr_Format(PyExc_ValueError, "criteo_lines: num_features must be >= 0 (0: raw 64-bit ids), got %S", nf_obj);
        return NULL;
    }
    unsigned long long num_features = PyLong_AsUnsignedLongLong(nf_obj); /* 0: raw ids (criteo_id) */
    if (num_features == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_buffer buf, nl = {0}, salts, lab, iv, idv, st;
    PyObject *result = NULL;
    int have_nl = nl_obj != Py_None;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (have_nl && get_i64(nl_obj, &nl, 0, "newlines") < 0) goto fail_buf;
    if (get_ints(salts_obj, &salts, 0, 8, "QL", "salts", "uint64") < 0) goto fail_nl;
    if (get_ints(lab_obj, &lab, 1, 4, "ff", "labels", "float32") < 0) goto fail_salts;
    if (get_i64(ints_obj, &iv, 1, "ints") < 0) goto fail_lab;
    if (get_i64(ids_obj, &idv, 1, "ids") < 0) goto fail_ints;
    if (get_ints(st_obj, &st, 1, 1, "bb", "status", "int8") < 0) goto fail_ids;
    Py_ssize_t n = st.len;
    if (salts.len != 8 * CRITEO_CATS || lab.len != 4 * n || iv.len != 8 * CRITEO_INTS * n || idv.len != 8 * CRITEO_CATS * n) {
        PyErr_Format(PyExc_ValueError, "criteo_lines: want salts [%d] and, for n = len(status) = %zd, labels [n], "
                     "ints [%d, n], ids [%d, n]", CRITEO_CATS, n, CRITEO_INTS, CRITEO_CATS);
        goto fail_st;
    }
    const uint8_t *p = buf.buf;
    const int64_t *newlines = nl.buf;
    const int64_t size = (int64_t)buf.len;
    if (have_nl) {
        if (nl.len / 8 != n) {
            PyErr_Format(PyExc_ValueError, "criteo_lines: %zd newlines but %zd status slots", nl.len / 8, n);
            goto fail_st;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (newlines[i] <= (i ? newlines[i - 1] : -1) || newlines[i] >= size) {
                PyErr_Format(PyExc_ValueError, "criteo_lines: newlines[%zd] = %lld is out of order or outside the "
                             "%zd-byte buffer", i, (long long)newlines[i], buf.len);
                goto fail_st;
            }
        }
    }
    {
        uint64_t missing[CRITEO_CATS];
        const uint64_t *salt = salts.buf;
        for (int c = 0; c < CRITEO_CATS; c++) missing[c] = splitmix64(~salt[c]);
        float *labels = lab.buf;
        int64_t *ints = iv.buf, *ids = idv.buf;
        int8_t *status = st.buf;
        Py_ssize_t lines = 0, good = 0;
        Py_BEGIN_ALLOW_THREADS
        if (!have_nl) lines = count_newlines(p, size); /* first: more lines than status slots must not write past them */
        if (have_nl || lines == n) {
            int64_t start = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t end = have_nl ? newlines[i] : (int64_t)((const uint8_t *)memchr(p + start, '\n', (size_t)(size - start)) - p);
                int s = end == start ? CRITEO_BLANK
                                     : criteo_line(p, start, end, size, salt, missing, num_features, labels, ints, ids, n, good);
                status[i] = (int8_t)s;
                good += s == CRITEO_OK;
                start = end + 1;
            }
        }
        Py_END_ALLOW_THREADS
        if (have_nl || lines == n)
            result = PyLong_FromSsize_t(good);
        else
            PyErr_Format(PyExc_ValueError, "criteo_lines: buf has %zd lines but status has %zd slots", lines, n);
    }
fail_st:
    PyBuffer_Release(&st);
fail_ids:
    PyBuffer_Release(&idv);
fail_ints:
    PyBuffer_Release(&iv);
fail_lab:
    PyBuffer_Release(&lab);
fail_salts:
    PyBuffer_Release(&salts);
fail_nl:
    if (have_nl) PyBuffer_Release(&nl);
fail_buf:
    PyBuffer_Release(&buf);
    return result;
}

/* ---- crc32c (tests) ----------------------------------------------------- */

PyDoc_STRVAR(crc_doc,
"crc32c(data, software=False) -> int\n\n"
"The (unmasked) CRC32C of data, by the fastest path or, with software=True, the table path.");

static PyObject *native_crc32c(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"data", "software", NULL};
    Py_buffer data;
    int software = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|p:crc32c", kwlist, &data, &software)) return NULL;
    uint32_t crc = (software ? crc_software : crc_best)(0, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"frame", native_frame, METH_VARARGS, frame_doc},
    {"masked_crc32c_ranges", native_masked_crc32c_ranges, METH_VARARGS, ranges_doc},
    {"decode_varints", native_decode_varints, METH_VARARGS, varints_doc},
    {"copy_ranges", native_copy_ranges, METH_VARARGS, copy_doc},
    {"walk_examples", native_walk_examples, METH_VARARGS, walk_doc},
    {"match_keys", native_match_keys, METH_VARARGS, match_doc},
    {"place_entries", native_place_entries, METH_VARARGS, place_doc},
    {"split_bytes_lists", native_split_bytes_lists, METH_VARARGS, split_doc},
    {"count_newlines", native_count_newlines, METH_O, count_newlines_doc},
    {"criteo_lines", native_criteo_lines, METH_VARARGS, criteo_doc},
    {"crc32c", (PyCFunction)(void (*)(void))native_crc32c, METH_VARARGS | METH_KEYWORDS, crc_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "psflow.data._native",
    "The input pipeline's per-byte loops in C (see psflow/data/native.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "psflow.data._native supports little-endian hosts only");
        return NULL;
    }
    crc_init();
#if HAVE_SSE42_PATH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_best = crc_sse42;
        crc_hardware = 1;
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "CRC_HARDWARE", crc_hardware) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
