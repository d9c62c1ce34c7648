/*
 * psflow.native._ids: the id loops every layer runs, in C (psflow/native/ids.py is their face).
 *
 *   unique_sorted(ids, unique_out, inverse_out, scratch)   np.unique(ids, return_inverse=True) in O(n)
 *   unique_scratch_size(n)                                 the scratch unique_sorted needs for n ids
 *   scan_ids(ids, num_rows)                                the first id outside [0, num_rows), and
 *                                                          whether the ids are strictly increasing
 *
 * A worker dedupes a batch's ids before it pulls rows, a model before it looks
 * them up, the ps again where a request may hold repeats; every request's ids are
 * range- and order-checked several times a step.  Both the input pipeline and the
 * ps tasks use these loops, so they live in their own extension below both:
 * a ps task never loads the input pipeline's (psflow.data._native).
 *
 * Each has a numpy twin in psflow/native/ids.py with the same results, used when
 * this module was not built or PSFLOW_NATIVE=0 is set; the tests compare the two.
 *
 * Guarantees: arguments are checked before any item is read or written (types,
 * sizes), so a wrong call raises ValueError or TypeError instead of reading or
 * writing out of bounds.  unique_sorted runs with the GIL released; scan_ids holds
 * it (a few hundred ids: releasing it would cost more than the loop).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

/* splitmix64's finalizer on one word (the hash set's bucket of an id). */
static inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- a batch's distinct ids ---- */
/* The hash set's buckets for n ids: a power of two >= 2n (at least 16). */
static uint64_t unique_buckets(Py_ssize_t n) {
    uint64_t buckets = 16;
    while (buckets < 2 * (uint64_t)n) buckets <<= 1;
    return buckets;
}

/* unique_scratch_size(n): the int64 items of scratch unique_sorted needs for n ids. */
static PyObject *ids_unique_scratch_size(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n:unique_scratch_size", &n)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(unique_buckets(n) + 4 * (uint64_t)n);
}

/* unique_sorted(ids, unique_out, inverse_out, scratch): np.unique(ids, return_inverse=True) in O(n): the
 * distinct ids through a hash set (linear probing, at most half full), then only those sorted, by an LSD
 * radix sort of their bytes (a byte on which all of them agree is skipped: small ids cost few passes).
 * Writes the sorted distinct ids to unique_out[:count] and inverse_out[i] = the position of ids[i] among
 * them; returns count. scratch: int64, at least unique_scratch_size(n) items, overwritten (the caller keeps
 * it between calls: fresh memory of this size would cost a page fault per 4 KiB on every call). */
static PyObject *ids_unique_sorted(PyObject *self, PyObject *args) {
    PyObject *i_obj, *u_obj, *v_obj, *s_obj;
    if (!PyArg_ParseTuple(args, "OOOO:unique_sorted", &i_obj, &u_obj, &v_obj, &s_obj)) return NULL;
    Py_buffer b[4];
    int held = 0;
    const char *names[4] = {"ids", "unique_out", "inverse_out", "scratch"};
    PyObject *objs[4] = {i_obj, u_obj, v_obj, s_obj};
    for (; held < 4; held++)
        if (get_i64(objs[held], &b[held], held > 0, names[held]) < 0) break;
    const char *error = NULL;
    Py_ssize_t n = held == 4 ? b[0].len / 8 : 0;
    uint64_t buckets = unique_buckets(n), mask = buckets - 1;
    if (held == 4 && (b[1].len / 8 != n || b[2].len / 8 != n))
        error = "unique_out and inverse_out must have one item per id";
    else if (held == 4 && (uint64_t)(b[3].len / 8) < buckets + 4 * (uint64_t)n)
        error = "scratch is smaller than unique_scratch_size(len(ids))";
    if (held < 4 || error) {
        for (int j = 0; j < held; j++) PyBuffer_Release(&b[j]);
        if (error) PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    const int64_t *ids = b[0].buf;
    int64_t *unique = b[1].buf, *inverse = b[2].buf;
    Py_ssize_t count = 0;
    Py_BEGIN_ALLOW_THREADS
    /* pos: the hash set (position among the distinct ids, -1: empty bucket); then the ranks. */
    int64_t *pos = b[3].buf;
    uint64_t *work = (uint64_t *)pos + buckets;
    {
        memset(pos, 0xff, buckets * sizeof(int64_t));
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t id = ids[i];
            uint64_t h = splitmix64((uint64_t)id) & mask;
            for (;;) {
                int64_t p = pos[h];
                if (p < 0) {
                    pos[h] = count;
                    unique[count] = id;
                    inverse[i] = count++;
                    break;
                }
                if (unique[p] == id) {
                    inverse[i] = p;
                    break;
                }
                h = (h + 1) & mask;
            }
        }
        /* Sort (key, first position) pairs; keys with the sign bit flipped sort as unsigned. */
        uint64_t *key = work, *key2 = work + n, *at = work + 2 * n, *at2 = work + 3 * n;
        uint64_t all_or = 0, all_and = ~(uint64_t)0;
        for (Py_ssize_t j = 0; j < count; j++) {
            key[j] = (uint64_t)unique[j] ^ 0x8000000000000000ULL;
            at[j] = (uint64_t)j;
            all_or |= key[j];
            all_and &= key[j];
        }
        for (int shift = 0; shift < 64; shift += 8) {
            if ((((all_or ^ all_and) >> shift) & 0xff) == 0) continue;  /* every key has this byte */
            Py_ssize_t offsets[256] = {0};
            for (Py_ssize_t j = 0; j < count; j++) offsets[(key[j] >> shift) & 0xff]++;
            Py_ssize_t total = 0;
            for (int d = 0; d < 256; d++) {
                Py_ssize_t c = offsets[d];
                offsets[d] = total;
                total += c;
            }
            for (Py_ssize_t j = 0; j < count; j++) {
                Py_ssize_t o = offsets[(key[j] >> shift) & 0xff]++;
                key2[o] = key[j];
                at2[o] = at[j];
            }
            uint64_t *t = key; key = key2; key2 = t;
            t = at; at = at2; at2 = t;
        }
        int64_t *rank = pos;  /* count <= n < buckets entries */
        for (Py_ssize_t j = 0; j < count; j++) {
            rank[at[j]] = j;
            unique[j] = (int64_t)(key[j] ^ 0x8000000000000000ULL);
        }
        for (Py_ssize_t i = 0; i < n; i++) inverse[i] = rank[inverse[i]];
    }
    Py_END_ALLOW_THREADS
    for (int j = 0; j < 4; j++) PyBuffer_Release(&b[j]);
    return PyLong_FromSsize_t(count);
}

static const char unique_doc[] =
    "unique_sorted(ids, unique_out, inverse_out, scratch) -> count: np.unique(ids, return_inverse=True) in O(n) "
    "(a hash set, then a radix sort of the distinct ids only): the sorted distinct ids in unique_out[:count], "
    "inverse_out[i] the position of ids[i] among them. scratch: int64, unique_scratch_size(len(ids)) items or more.";
static const char unique_scratch_doc[] = "unique_scratch_size(n): the int64 items of scratch unique_sorted needs for n ids.";

/* scan_ids(ids, num_rows) -> (first, increasing): the position of the first id outside [0, num_rows)
 * (-1: none; the scan stops there) and whether the ids are strictly increasing. ids: C-contiguous int64.
 * One pass holding the GIL (a few hundred ids: releasing it would cost more than the loop). The range and
 * order checks of a row request, which numpy does in four passes and four calls. */
static PyObject *ids_scan_ids(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t num_rows;
    if (!PyArg_ParseTuple(args, "On:scan_ids", &obj, &num_rows)) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    const char *f = b.format ? b.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (!((f[0] == 'q' || f[0] == 'l') && f[1] == 0 && b.itemsize == 8)) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "scan_ids: ids must be int64");
        return NULL;
    }
    const int64_t *ids = b.buf;
    Py_ssize_t n = b.len / 8, first = -1;
    int increasing = 1;
    const uint64_t limit = num_rows < 0 ? 0 : (uint64_t)num_rows;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((uint64_t)ids[i] >= limit) { /* negative ids are huge as unsigned */
            first = i;
            break;
        }
        if (i && ids[i] <= ids[i - 1]) increasing = 0;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(nO)", first, increasing ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"unique_sorted", ids_unique_sorted, METH_VARARGS, unique_doc},
    {"scan_ids", ids_scan_ids, METH_VARARGS,
     "scan_ids(ids, num_rows) -> (first, increasing): the first position of an id outside [0, num_rows) "
     "(-1: none) and whether ids are strictly increasing (checked up to that position)."},
    {"unique_scratch_size", ids_unique_scratch_size, METH_VARARGS, unique_scratch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "psflow.native._ids",
    "The id loops every layer runs, in C (see psflow/native/ids.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ids(void) { return PyModule_Create(&module); }
