/*
 * psflow.torch._lookup: the two loops of a worker's embedding lookups, in C (psflow/torch/lookup_rows.py is
 * their face and holds their torch twins).
 *
 *   gather_scaled(rows, index, weights, out)    out[e, :] = rows[index[e], :] * weights[e]
 *   scatter_scaled(grad, index, weights, out)   out = 0; out[index[e], :] += grad[e, :] * weights[e], e = 0, 1, ...
 *
 * rows/out/grad are C-contiguous float32 [n, width]; index int64 [entries]; weights float32 [entries].
 * The forward of every lookup group of a step is one gather_scaled, its backward one scatter_scaled:
 * what index_select, mul and index_add_ do in three PyTorch ops (and three autograd nodes) per group.
 *
 * Same numbers as the twins: each product is rounded to float32 before it is added (built with
 * -ffp-contract=off: no fused multiply-add), and scatter_scaled adds in entry order, as PyTorch's
 * index_add_ on the CPU does for each element of out; out starts at +0.0 as torch.zeros does.
 *
 * Guarantees: arguments are checked before any item is read or written (types, shapes, every index in
 * range), so a wrong call raises ValueError instead of reading or writing out of bounds. Loops over at
 * least 256 KiB run with the GIL released (a CPU tower's thread computes while another runs Python);
 * smaller ones hold it, as releasing and retaking it would cost more than the loop.
 */
#include "../native/buffers.h"
#include <stdint.h>
#include <string.h>

#define GIL_FREE_BYTES (1 << 18)

/* Parses (table, index, weights, entries) buffers and checks them: table [n, width] (2-d), entries
 * [len(index), width], one weight per index, every index in [0, n). Sets *num_rows, *width, *count. */
static int check(PyObject *const objs[4], Buf b[4], int table_at, int entries_at, const char *table_name,
                 const char *entries_name, Py_ssize_t *num_rows, Py_ssize_t *width, Py_ssize_t *count) {
    if (get(objs[table_at], &b[table_at], table_at == 3, 'f', table_name) < 0 ||
        get(objs[1], &b[1], 0, 'q', "index") < 0 || get(objs[2], &b[2], 0, 'f', "weights") < 0 ||
        get(objs[entries_at], &b[entries_at], entries_at == 3, 'f', entries_name) < 0)
        return -1;
    Buf *table = &b[table_at], *entries = &b[entries_at];
    if (table->view.ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s must be 2-d [rows, width], got %d dimensions", table_name, table->view.ndim);
        return -1;
    }
    *num_rows = table->view.shape[0];
    *width = table->view.shape[1];
    *count = b[1].view.len / 8;
    if (b[2].view.len / 4 != *count) {
        PyErr_Format(PyExc_ValueError, "%zd weights for %zd indices: want one weight per index", b[2].view.len / 4, *count);
        return -1;
    }
    if (entries->view.ndim != 2 || entries->view.shape[0] != *count || entries->view.shape[1] != *width) {
        PyErr_Format(PyExc_ValueError, "%s does not hold one row of %s per index (want [%zd, %zd])", entries_name,
                     table_name, *count, *width);
        return -1;
    }
    const int64_t *index = b[1].view.buf;
    for (Py_ssize_t e = 0; e < *count; e++)
        if (index[e] < 0 || index[e] >= *num_rows) {
            PyErr_Format(PyExc_ValueError, "index %zd: row %lld is outside 0-%zd", e, (long long)index[e], *num_rows - 1);
            return -1;
        }
    return 0;
}

static PyObject *gather_scaled(PyObject *self, PyObject *args) {
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO:gather_scaled", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    Buf b[4] = {{.held = 0}};
    Py_ssize_t num_rows, width, count;
    if (check(objs, b, 0, 3, "rows", "out", &num_rows, &width, &count) < 0) {
        release(b, 4);
        return NULL;
    }
    const float *rows = b[0].view.buf, *weights = b[2].view.buf;
    const int64_t *index = b[1].view.buf;
    float *out = b[3].view.buf;
    PyThreadState *unlocked = count * width * 4 >= GIL_FREE_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t e = 0; e < count; e++) {
        const float *src = rows + index[e] * width;
        float *dst = out + e * width;
        const float w = weights[e];
        for (Py_ssize_t j = 0; j < width; j++) dst[j] = src[j] * w;
    }
    if (unlocked) PyEval_RestoreThread(unlocked);
    release(b, 4);
    Py_RETURN_NONE;
}

static PyObject *scatter_scaled(PyObject *self, PyObject *args) {
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO:scatter_scaled", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    Buf b[4] = {{.held = 0}};
    Py_ssize_t num_rows, width, count;
    if (check(objs, b, 3, 0, "out", "grad", &num_rows, &width, &count) < 0) {
        release(b, 4);
        return NULL;
    }
    const float *grad = b[0].view.buf, *weights = b[2].view.buf;
    const int64_t *index = b[1].view.buf;
    float *out = b[3].view.buf;
    PyThreadState *unlocked = count * width * 4 >= GIL_FREE_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < num_rows * width; i++) out[i] = 0.0f;
    for (Py_ssize_t e = 0; e < count; e++) {
        const float *src = grad + e * width;
        float *dst = out + index[e] * width;
        const float w = weights[e];
        for (Py_ssize_t j = 0; j < width; j++) {
            const float g = src[j] * w; /* rounded here: PyTorch multiplies, then index_add_ adds */
            dst[j] = dst[j] + g;
        }
    }
    if (unlocked) PyEval_RestoreThread(unlocked);
    release(b, 4);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"gather_scaled", gather_scaled, METH_VARARGS,
     "gather_scaled(rows, index, weights, out): out[e] = rows[index[e]] * weights[e] (float32 [n, width], int64, "
     "float32, float32 [len(index), width]); everything is checked first (ValueError, nothing written)."},
    {"scatter_scaled", scatter_scaled, METH_VARARGS,
     "scatter_scaled(grad, index, weights, out): out = 0, then out[index[e]] += grad[e] * weights[e] in entry "
     "order (index_add_'s additions); everything is checked first (ValueError, nothing written)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lookup",
                                    "The gather and scatter-add of a worker's embedding lookups.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__lookup(void) { return PyModule_Create(&module); }
