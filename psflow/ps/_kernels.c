/*
 * psflow.ps._kernels: the ps tasks' optimizer updates, fused into one pass.
 *
 * numpy applies Adagrad to k sparse rows in about ten passes (gather the rows of
 * var and of each slot, a temporary per arithmetic step, scatter them back), each
 * a separate call holding the GIL.  These loops do the same arithmetic in one
 * pass over the touched rows, with the GIL released, so a ps task applies one
 * worker's push while its other threads decode the next request.
 *
 *   adagrad(var, accum, grad, rows, lr)
 *   ftrl(var, accum, linear, grad, rows, lr, l1, two_l2, two_shrinkage)   (learning_rate_power -0.5)
 *
 * var and the slots are C-contiguous float32 buffers of the same size; rows is
 * None (dense: grad is shaped like var) or a C-contiguous int64 buffer of k
 * distinct row indices (grad holds k rows of var.size / num_rows elements).
 *
 * Same results as the numpy twins in psflow/ps/optimizers.py, bit for bit: the
 * same float32 operations in the same order (built with -ffp-contract=off so no
 * multiply-add is fused, no -ffast-math).  The tests compare the two.
 *
 * Guarantees: every size and every row is checked before anything is written,
 * so a wrong call raises ValueError and changes nothing.  Rows must be distinct
 * (the caller sums duplicates first); with repeated rows the result is that of
 * applying each entry in turn.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static void release(Buf *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

/* A C-contiguous buffer of `itemsize`-byte items of format `fmt` ('f' or 'q'/'l'). */
static int get(PyObject *obj, Buf *b, int writable, char kind, const char *what) {
    if (PyObject_GetBuffer(obj, &b->view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    b->held = 1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = kind == 'f' ? (f[0] == 'f' && f[1] == 0 && b->view.itemsize == 4)
                         : ((f[0] == 'q' || f[0] == 'l') && f[1] == 0 && b->view.itemsize == 8);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s must be %s", what, kind == 'f' ? "float32" : "int64");
        return -1;
    }
    return 0;
}

/* Checks sizes and rows; sets *width (elements per row) and *count (rows or 1 for dense). */
static int check_shapes(Buf *vars, int nvars, Buf *grad, PyObject *rows_obj, Buf *rows, Py_ssize_t num_rows,
                        Py_ssize_t *width, Py_ssize_t *count) {
    Py_ssize_t n = vars[0].view.len / 4;
    for (int i = 1; i < nvars; i++)
        if (vars[i].view.len / 4 != n) {
            PyErr_SetString(PyExc_ValueError, "var and slots differ in size");
            return -1;
        }
    Py_ssize_t g = grad->view.len / 4;
    if (rows_obj == Py_None) {
        if (g != n) {
            PyErr_SetString(PyExc_ValueError, "dense gradient is not shaped like var");
            return -1;
        }
        *width = n;
        *count = 1;
        return 0;
    }
    if (num_rows <= 0 || n % num_rows != 0) {
        PyErr_SetString(PyExc_ValueError, "num_rows does not divide var");
        return -1;
    }
    Py_ssize_t k = rows->view.len / 8, w = n / num_rows;
    if (g != k * w) {
        PyErr_SetString(PyExc_ValueError, "sparse gradient does not hold one row of var per index");
        return -1;
    }
    const int64_t *r = (const int64_t *)rows->view.buf;
    for (Py_ssize_t i = 0; i < k; i++)
        if (r[i] < 0 || r[i] >= num_rows) {
            PyErr_Format(PyExc_ValueError, "row %lld is outside 0-%zd", (long long)r[i], num_rows - 1);
            return -1;
        }
    *width = w;
    *count = k;
    return 0;
}

static void adagrad_span(float *restrict var, float *restrict accum, const float *restrict g, Py_ssize_t w, float lr) {
    for (Py_ssize_t j = 0; j < w; j++) {
        float gj = g[j];
        float sq = gj * gj;
        float a = accum[j] + sq;
        accum[j] = a;
        float s = sqrtf(a);
        s = 1.0f / s;
        s = s * (gj * lr);
        var[j] = var[j] - s;
    }
}

static PyObject *adagrad(PyObject *self, PyObject *args) {
    PyObject *v_obj, *a_obj, *g_obj, *r_obj;
    Py_ssize_t num_rows;
    float lr;
    if (!PyArg_ParseTuple(args, "OOOOnf:adagrad", &v_obj, &a_obj, &g_obj, &r_obj, &num_rows, &lr)) return NULL;
    Buf b[4] = {{.held = 0}};
    Py_ssize_t w, k;
    if (get(v_obj, &b[0], 1, 'f', "var") < 0 || get(a_obj, &b[1], 1, 'f', "accumulator") < 0 ||
        get(g_obj, &b[2], 0, 'f', "grad") < 0 || (r_obj != Py_None && get(r_obj, &b[3], 0, 'q', "rows") < 0) ||
        check_shapes(b, 2, &b[2], r_obj, &b[3], num_rows, &w, &k) < 0) {
        release(b, 4);
        return NULL;
    }
    float *var = b[0].view.buf, *accum = b[1].view.buf;
    const float *g = b[2].view.buf;
    const int64_t *r = r_obj == Py_None ? NULL : b[3].view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t at = r ? (Py_ssize_t)r[i] * w : 0;
        adagrad_span(var + at, accum + at, g + i * w, w, lr);
    }
    Py_END_ALLOW_THREADS
    release(b, 4);
    Py_RETURN_NONE;
}

typedef struct {
    float lr, l1, two_l2, two_shrinkage;
} FtrlParams;

static void ftrl_span(float *restrict var, float *restrict accum, float *restrict linear, const float *restrict g,
                      Py_ssize_t w, FtrlParams p) {
    const float lr = p.lr, l1 = p.l1, neg_l1 = -p.l1, two_l2 = p.two_l2, two_shrinkage = p.two_shrinkage;
    const int shrink = two_shrinkage > 0.0f;
    for (Py_ssize_t j = 0; j < w; j++) {
        float gj = g[j], v = var[j], old = accum[j];
        float na = gj * gj;
        na = na + old;
        float powered_new = sqrtf(na);
        float sigma = powered_new - sqrtf(old);
        sigma = sigma / lr;
        sigma = sigma * v;
        float gs = shrink ? v * two_shrinkage + gj : gj;
        float lin = linear[j] + (gs - sigma);
        linear[j] = lin;
        float quadratic = powered_new / lr;
        quadratic = quadratic + two_l2;
        float c = lin < neg_l1 ? neg_l1 : lin;
        c = c > l1 ? l1 : c;
        var[j] = (c - lin) / quadratic;
        accum[j] = na;
    }
}

static PyObject *ftrl(PyObject *self, PyObject *args) {
    PyObject *v_obj, *a_obj, *l_obj, *g_obj, *r_obj;
    Py_ssize_t num_rows;
    FtrlParams p;
    if (!PyArg_ParseTuple(args, "OOOOOnffff:ftrl", &v_obj, &a_obj, &l_obj, &g_obj, &r_obj, &num_rows, &p.lr, &p.l1,
                          &p.two_l2, &p.two_shrinkage))
        return NULL;
    Buf b[5] = {{.held = 0}};
    Py_ssize_t w, k;
    if (get(v_obj, &b[0], 1, 'f', "var") < 0 || get(a_obj, &b[1], 1, 'f', "accum") < 0 ||
        get(l_obj, &b[2], 1, 'f', "linear") < 0 || get(g_obj, &b[3], 0, 'f', "grad") < 0 ||
        (r_obj != Py_None && get(r_obj, &b[4], 0, 'q', "rows") < 0) ||
        check_shapes(b, 3, &b[3], r_obj, &b[4], num_rows, &w, &k) < 0) {
        release(b, 5);
        return NULL;
    }
    float *var = b[0].view.buf, *accum = b[1].view.buf, *linear = b[2].view.buf;
    const float *g = b[3].view.buf;
    const int64_t *r = r_obj == Py_None ? NULL : b[4].view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t at = r ? (Py_ssize_t)r[i] * w : 0;
        ftrl_span(var + at, accum + at, linear + at, g + i * w, w, p);
    }
    Py_END_ALLOW_THREADS
    release(b, 5);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"adagrad", adagrad, METH_VARARGS,
     "adagrad(var, accum, grad, rows, num_rows, lr): TF's Adagrad update, in place, on all of var (rows=None) "
     "or on the given distinct rows."},
    {"ftrl", ftrl, METH_VARARGS,
     "ftrl(var, accum, linear, grad, rows, num_rows, lr, l1, two_l2, two_shrinkage): TF's FTRL update "
     "(learning_rate_power -0.5), in place, on all of var (rows=None) or on the given distinct rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "Fused optimizer updates for ps tasks.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
