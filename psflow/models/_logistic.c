/*
 * psflow.models._logistic: the two per-entry loops of LogisticRegression.compute, in C
 * (psflow/models/logistic.py holds their numpy twins and picks one).
 *
 *   entry_products(values, weights, inverse, out)        out[j] = values[j] * weights[inverse[j]]
 *   row_gradients(values, inverse, indptr, d, out)       out[inverse[j]] += values[j] * d[e] for the entries
 *                                                        j = indptr[e] .. indptr[e + 1] - 1 of e = 0, 1, ...
 *
 * values float32 [entries]; weights, d and out float64; inverse int64 [entries]; indptr int64 [examples + 1].
 * A step's forward is one entry_products (numpy: a gather and a multiply over ~20,000 entries), its backward
 * one row_gradients (numpy: np.repeat, a multiply and np.bincount).
 *
 * Same numbers as the twins: each float32 value is widened to float64 and the product rounded once (built
 * with -ffp-contract=off: no fused multiply-add), and row_gradients adds the products in entry order into
 * out as the caller gives it (zeros), as np.bincount(inverse, weights=values * np.repeat(d, counts)) does.
 *
 * Guarantees: arguments are checked before any item is read or written (types, sizes, indptr's runs,
 * every inverse index in range), so a wrong call raises ValueError instead of reading or writing out of
 * bounds. The GIL is held: a batch's loop takes microseconds, less than releasing and retaking it.
 */
#include "../native/buffers.h"
#include <stdint.h>

/* get() for the 1-d arrays every argument here is: ValueError "<name> must be a 1-d C-contiguous <type> array"
 * where the buffer was had but is not that (an object without one keeps its TypeError). */
static int get1(PyObject *obj, Buf *b, int writable, char kind, const char *name) {
    if (get(obj, b, writable, kind, name) == 0 && b->view.ndim == 1) return 0;
    if (b->held) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a 1-d C-contiguous %s array", name, kind_name(kind));
    }
    return -1;
}

static Py_ssize_t items(Buf *b) { return b->view.len / b->view.itemsize; }

/* -1 (ValueError set) unless every index is in [0, size). */
static int check_index(const int64_t *index, Py_ssize_t n, Py_ssize_t size, const char *name) {
    for (Py_ssize_t j = 0; j < n; j++) {
        if (index[j] < 0 || index[j] >= size) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] = %lld is outside [0, %zd)", name, j, (long long)index[j], size);
            return -1;
        }
    }
    return 0;
}

static PyObject *entry_products(PyObject *self, PyObject *args) {
    PyObject *v_obj, *w_obj, *i_obj, *o_obj;
    if (!PyArg_ParseTuple(args, "OOOO:entry_products", &v_obj, &w_obj, &i_obj, &o_obj)) return NULL;
    Buf b[4] = {{.held = 0}};
    if (get1(v_obj, &b[0], 0, 'f', "values") < 0 || get1(w_obj, &b[1], 0, 'd', "weights") < 0 ||
        get1(i_obj, &b[2], 0, 'q', "inverse") < 0 || get1(o_obj, &b[3], 1, 'd', "out") < 0)
        goto fail;
    Py_ssize_t n = items(&b[0]), rows = items(&b[1]);
    if (items(&b[2]) != n || items(&b[3]) != n) {
        PyErr_Format(PyExc_ValueError, "values, inverse and out must have the same length, got %zd, %zd and %zd", n,
                     items(&b[2]), items(&b[3]));
        goto fail;
    }
    const float *values = b[0].view.buf;
    const double *weights = b[1].view.buf;
    const int64_t *inverse = b[2].view.buf;
    double *out = b[3].view.buf;
    if (check_index(inverse, n, rows, "inverse") < 0) goto fail;
    for (Py_ssize_t j = 0; j < n; j++) out[j] = (double)values[j] * weights[inverse[j]];
    release(b, 4);
    Py_RETURN_NONE;
fail:
    release(b, 4);
    return NULL;
}

static PyObject *row_gradients(PyObject *self, PyObject *args) {
    PyObject *v_obj, *i_obj, *p_obj, *d_obj, *o_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:row_gradients", &v_obj, &i_obj, &p_obj, &d_obj, &o_obj)) return NULL;
    Buf b[5] = {{.held = 0}};
    if (get1(v_obj, &b[0], 0, 'f', "values") < 0 || get1(i_obj, &b[1], 0, 'q', "inverse") < 0 ||
        get1(p_obj, &b[2], 0, 'q', "indptr") < 0 || get1(d_obj, &b[3], 0, 'd', "d") < 0 ||
        get1(o_obj, &b[4], 1, 'd', "out") < 0)
        goto fail;
    Py_ssize_t n = items(&b[0]), examples = items(&b[3]), rows = items(&b[4]);
    const float *values = b[0].view.buf;
    const int64_t *inverse = b[1].view.buf, *indptr = b[2].view.buf;
    const double *d = b[3].view.buf;
    double *out = b[4].view.buf;
    if (items(&b[1]) != n || items(&b[2]) != examples + 1) {
        PyErr_Format(PyExc_ValueError, "inverse must have values' length (%zd, got %zd) and indptr one more item than "
                     "d (%zd, got %zd)", n, items(&b[1]), examples + 1, items(&b[2]));
        goto fail;
    }
    if (indptr[0] != 0 || indptr[examples] != n) {
        PyErr_Format(PyExc_ValueError, "indptr must run from 0 to the %zd entries, got %lld to %lld", n,
                     (long long)indptr[0], (long long)indptr[examples]);
        goto fail;
    }
    for (Py_ssize_t e = 0; e < examples; e++) {
        if (indptr[e + 1] < indptr[e]) {
            PyErr_Format(PyExc_ValueError, "indptr decreases at %zd", e + 1);
            goto fail;
        }
    }
    if (check_index(inverse, n, rows, "inverse") < 0) goto fail;
    for (Py_ssize_t e = 0; e < examples; e++) {
        const double de = d[e];
        for (int64_t j = indptr[e]; j < indptr[e + 1]; j++) out[inverse[j]] += (double)values[j] * de;
    }
    release(b, 5);
    Py_RETURN_NONE;
fail:
    release(b, 5);
    return NULL;
}

static PyMethodDef methods[] = {
    {"entry_products", entry_products, METH_VARARGS,
     "entry_products(values, weights, inverse, out): out[j] = values[j] * weights[inverse[j]] (float64)."},
    {"row_gradients", row_gradients, METH_VARARGS,
     "row_gradients(values, inverse, indptr, d, out): out[inverse[j]] += values[j] * d[e] for each example e's "
     "entries j, in entry order."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_logistic",
    .m_doc = "The per-entry loops of LogisticRegression.compute (psflow/models/logistic.py).", .m_size = -1,
    .m_methods = methods};

PyMODINIT_FUNC PyInit__logistic(void) { return PyModule_Create(&module); }
