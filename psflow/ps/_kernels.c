/*
 * psflow.ps._kernels: the ps tasks' optimizer updates, fused into one pass, and the
 * hot loops of a dynamic table (its id -> slot index) and of a sync step (summing
 * the workers' sparse pieces).
 *
 * numpy applies Adagrad to k sparse rows in about ten passes (gather the rows of
 * var and of each slot, a temporary per arithmetic step, scatter them back).
 * These loops do the same arithmetic in one pass over the touched rows.
 *
 * The GIL: a loop over at least GIL_FREE_BYTES releases it (other threads decode
 * requests meanwhile); a smaller one keeps it.  A ps answering two workers runs
 * two request threads: where each released the GIL for every table's few
 * microseconds of work, each call ended waiting for the other thread to let go
 * of it, and the two queued behind each other (numpy's gather does the same: it
 * releases the GIL from a few hundred elements on).  Keeping it: a sync step's
 * two reads 2.6x faster, an async push's apply 2.7x (Wide & Deep, 52 tables).
 *
 *   adagrad(var, accum, grad, rows, lr)
 *   ftrl(var, accum, linear, grad, rows, lr, l1, two_l2, two_shrinkage)   (learning_rate_power -0.5; rows of
 *       one element are updated in gathered blocks, so the arithmetic runs in vector registers)
 *   rmsprop(var, rms, mom, mg, grad, rows, lr, decay, momentum, epsilon)  (mg None unless centered; TF's
 *       dense formula where rows is None, its sparse kernel's where rows are given: they round differently)
 *   gather(value, rows, out)   (out[i] = value[rows[i]], any item size: the ps's reads)
 *   scatter_rows(targets, rows, block)   (targets[j][rows[i]] = block[j, i]: a backup's write of a replicated
 *       partition's rows, value and slots stacked in one block; any row size)
 *   first_touch(marks, rows, out) -> n   (a lazy partition's rows not built yet: each row of rows whose
 *       mark is 0, once, in order of first appearance, into out[:n], its mark set to 1; the numpy twin is
 *       psflow/ps/lazy_rows.py's ``~marks[rows]`` test and np.unique, which gives the same rows sorted; touch_rows'
 *       pass with changed None)
 *   touch_rows(marks, changed, epoch, rows, out) -> n   (a sparse update's one pass over its rows: first_touch's
 *       claim where marks is not None, and changed[r] = epoch (uint8 or uint32 row marks, psflow/ps/row_marks.py) for
 *       every row built before the call, where changed is not None; the claimed rows (and their repeats) are
 *       not stamped: the caller stamps them once built. Twins: first_touch's, and numpy's ``changed[rows] = epoch``)
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
 *
 * The id index (psflow/ps/dynamic/id_index.py, whose numpy code is the twin):
 *
 *   index_find(keys, vals, ids, slots_out, where_out)
 *   index_touch(keys, vals, ids, slots_out, freq, last, step, lookup)   (find, and mark the rows found as used)
 *   index_place(keys, vals, ids, slots)
 *   index_remove(keys, vals, where)
 *
 * keys and vals are the index's C-contiguous int64 arrays of a power-of-two
 * number of buckets; a bucket is empty where vals is -1.  The home bucket of id x
 * is splitmix64's mix of (x ^ INDEX_SALT) masked to the bucket count, exactly as
 * IdIndex._home computes it; probing is linear.  These are the sequential forms
 * of the numpy loops: find gives the same slots for the same content, and place
 * and remove keep the same invariants (no empty bucket between an id's home and
 * its bucket), but place puts each id in the first empty bucket from its home one
 * id at a time, so where ids of one batch compete for a bucket the layout (which
 * bucket holds which id) may differ from the numpy twin's.  Every argument is
 * checked before anything is written (ValueError, nothing changed), except that
 * index_place raises RuntimeError if it finds no empty bucket, which the caller's
 * at-most-half-full rule rules out.  They run with the GIL released (one
 * table's lock serializes the calls on its arrays).
 *
 *   merge_sum(rows, values, bounds, out_rows, out_sums, start_zero)
 *
 * A sync step's sparse pieces (psflow/ps/sync.py _sum_rows), each sorted and
 * distinct, merged with their values summed in float64 in piece order: the same
 * additions as the numpy code; -1 when a piece is not sorted (numpy sums then).
 */
#include "../native/buffers.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Loops over fewer bytes than this run holding the GIL. Releasing it for a few microseconds of work hands
 * it to another thread of the ps, and taking it back then waits for that thread: with two workers'
 * requests in flight the threads answering them queue behind each other at every call (measured: the
 * reads of a sync step took twice as long). */
#define GIL_FREE_BYTES (1 << 18)
#define UNLOCK_IF_LARGE(bytes) PyThreadState *unlocked_ = (bytes) >= GIL_FREE_BYTES ? PyEval_SaveThread() : NULL
#define RELOCK() if (unlocked_) PyEval_RestoreThread(unlocked_)

/* Checks that each of the k rows is in 0..num_rows-1: else ValueError "<who>row R is outside 0-N", -1. */
static int check_rows(const int64_t *r, Py_ssize_t k, Py_ssize_t num_rows, const char *who) {
    for (Py_ssize_t i = 0; i < k; i++)
        if (r[i] < 0 || r[i] >= num_rows) {
            PyErr_Format(PyExc_ValueError, "%srow %lld is outside 0-%zd", who, (long long)r[i], num_rows - 1);
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
    if (check_rows(rows->view.buf, k, num_rows, "") < 0) return -1;
    *width = w;
    *count = k;
    return 0;
}

#define ROW_PREFETCH_AHEAD 8

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
    UNLOCK_IF_LARGE(k * w * 4);
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_ssize_t at = r ? (Py_ssize_t)r[i] * w : 0;
        if (r && i + ROW_PREFETCH_AHEAD < k) {
            Py_ssize_t ahead = (Py_ssize_t)r[i + ROW_PREFETCH_AHEAD] * w;
            __builtin_prefetch(var + ahead, 1);
            __builtin_prefetch(accum + ahead, 1);
        }
        adagrad_span(var + at, accum + at, g + i * w, w, lr);
    }
    RELOCK();
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

/* Rows of one element (a linear model's weights): a row's span is one float, so ftrl_span's loop cannot
 * run in vector registers. Blocks of rows are gathered into contiguous buffers, updated by ftrl_span (which
 * then vectorizes: the same IEEE operations per element, so the same bits) and scattered back. Rows are
 * distinct, so no row is read after another's write to it within a block. */
#define FTRL_BLOCK 256

static void ftrl_single_rows(float *var, float *accum, float *linear, const float *g, const int64_t *r,
                             Py_ssize_t k, FtrlParams p) {
    float bv[FTRL_BLOCK], ba[FTRL_BLOCK], bl[FTRL_BLOCK];
    for (Py_ssize_t lo = 0; lo < k; lo += FTRL_BLOCK) {
        Py_ssize_t n = k - lo < FTRL_BLOCK ? k - lo : FTRL_BLOCK;
        const int64_t *rr = r + lo;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (lo + i + ROW_PREFETCH_AHEAD < k) {
                int64_t ahead = r[lo + i + ROW_PREFETCH_AHEAD];
                __builtin_prefetch(var + ahead, 1);
                __builtin_prefetch(accum + ahead, 1);
                __builtin_prefetch(linear + ahead, 1);
            }
            bv[i] = var[rr[i]];
            ba[i] = accum[rr[i]];
            bl[i] = linear[rr[i]];
        }
        ftrl_span(bv, ba, bl, g + lo, n, p);
        for (Py_ssize_t i = 0; i < n; i++) {
            var[rr[i]] = bv[i];
            accum[rr[i]] = ba[i];
            linear[rr[i]] = bl[i];
        }
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
    UNLOCK_IF_LARGE(k * w * 4);
    if (r && w == 1)
        ftrl_single_rows(var, accum, linear, g, r, k, p);
    else
        for (Py_ssize_t i = 0; i < k; i++) {
            Py_ssize_t at = r ? (Py_ssize_t)r[i] * w : 0;
            if (r && i + ROW_PREFETCH_AHEAD < k) {
                Py_ssize_t ahead = (Py_ssize_t)r[i + ROW_PREFETCH_AHEAD] * w;
                __builtin_prefetch(var + ahead, 1);
                __builtin_prefetch(accum + ahead, 1);
                __builtin_prefetch(linear + ahead, 1);
            }
            ftrl_span(var + at, accum + at, linear + at, g + i * w, w, p);
        }
    RELOCK();
    release(b, 5);
    Py_RETURN_NONE;
}

typedef struct {
    float lr, decay, one_minus_decay, momentum, epsilon;
} RmspropParams;

/* TF's ApplyRMSProp / ApplyCenteredRMSProp (mg NULL: not centered). */
static void rmsprop_dense_span(float *restrict var, float *restrict rms, float *restrict mom, float *restrict mg,
                               const float *restrict g, Py_ssize_t w, RmspropParams p) {
    for (Py_ssize_t j = 0; j < w; j++) {
        float gj = g[j];
        float sq = gj * gj;
        float r = rms[j] + (sq - rms[j]) * p.one_minus_decay;
        rms[j] = r;
        float d;
        if (mg) {
            float a = mg[j] + (gj - mg[j]) * p.one_minus_decay;
            mg[j] = a;
            d = (r - a * a) + p.epsilon;
        } else {
            d = r + p.epsilon;
        }
        float step = (gj * p.lr) / sqrtf(d);
        float m = mom[j] * p.momentum + step;
        mom[j] = m;
        var[j] = var[j] - m;
    }
}

/* TF's SparseApplyRMSProp / SparseApplyCenteredRMSProp on one row (its scalar rsqrt: 1 / sqrt). */
static void rmsprop_row_span(float *restrict var, float *restrict rms, float *restrict mom, float *restrict mg,
                             const float *restrict g, Py_ssize_t w, RmspropParams p) {
    for (Py_ssize_t j = 0; j < w; j++) {
        float gj = g[j];
        float sq = gj * gj;
        float r = rms[j] * p.decay + sq * p.one_minus_decay;
        rms[j] = r;
        float d;
        if (mg) {
            float a = mg[j] * p.decay + gj * p.one_minus_decay;
            mg[j] = a;
            d = (r - a * a) + p.epsilon;
        } else {
            d = r + p.epsilon;
        }
        float s = 1.0f / sqrtf(d);
        s = s * p.lr;
        s = s * gj;
        float m = mom[j] * p.momentum + s;
        mom[j] = m;
        var[j] = var[j] - m;
    }
}

static PyObject *rmsprop(PyObject *self, PyObject *args) {
    PyObject *v_obj, *r_obj_ms, *m_obj, *mg_obj, *g_obj, *r_obj;
    Py_ssize_t num_rows;
    RmspropParams p;
    if (!PyArg_ParseTuple(args, "OOOOOOnffff:rmsprop", &v_obj, &r_obj_ms, &m_obj, &mg_obj, &g_obj, &r_obj, &num_rows,
                          &p.lr, &p.decay, &p.momentum, &p.epsilon))
        return NULL;
    p.one_minus_decay = 1.0f - p.decay;
    int centered = mg_obj != Py_None;
    /* b: var, rms, mom, mg (held only when centered), grad, rows: the state buffers first, as check_shapes
     * compares the first nstate of them. */
    Buf b[6] = {{.held = 0}};
    int nstate = centered ? 4 : 3;
    Py_ssize_t w, k;
    if (get(v_obj, &b[0], 1, 'f', "var") < 0 || get(r_obj_ms, &b[1], 1, 'f', "rms") < 0 ||
        get(m_obj, &b[2], 1, 'f', "momentum") < 0 || (centered && get(mg_obj, &b[3], 1, 'f', "mg") < 0) ||
        get(g_obj, &b[4], 0, 'f', "grad") < 0 || (r_obj != Py_None && get(r_obj, &b[5], 0, 'q', "rows") < 0)) {
        release(b, 6);
        return NULL;
    }
    if (check_shapes(b, nstate, &b[4], r_obj, &b[5], num_rows, &w, &k) < 0) {
        release(b, 6);
        return NULL;
    }
    float *var = b[0].view.buf, *rms = b[1].view.buf, *mom = b[2].view.buf;
    float *mg = centered ? b[3].view.buf : NULL;
    const float *g = b[4].view.buf;
    const int64_t *r = r_obj == Py_None ? NULL : b[5].view.buf;
    UNLOCK_IF_LARGE(k * w * 4);
    if (!r) {
        rmsprop_dense_span(var, rms, mom, mg, g, w, p);
    } else {
        for (Py_ssize_t i = 0; i < k; i++) {
            Py_ssize_t at = (Py_ssize_t)r[i] * w;
            if (i + ROW_PREFETCH_AHEAD < k) {
                Py_ssize_t ahead = (Py_ssize_t)r[i + ROW_PREFETCH_AHEAD] * w;
                __builtin_prefetch(var + ahead, 1);
                __builtin_prefetch(rms + ahead, 1);
                __builtin_prefetch(mom + ahead, 1);
            }
            rmsprop_row_span(var + at, rms + at, mom + at, mg ? mg + at : NULL, g + i * w, w, p);
        }
    }
    RELOCK();
    release(b, 6);
    Py_RETURN_NONE;
}

/* ---- reads ------------------------------------------------------------------------------------------ */

static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *v_obj, *r_obj, *o_obj;
    if (!PyArg_ParseTuple(args, "OOO:gather", &v_obj, &r_obj, &o_obj)) return NULL;
    Buf b[3] = {{.held = 0}};
    if (PyObject_GetBuffer(v_obj, &b[0].view, PyBUF_ND | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    b[0].held = 1;
    if (get(r_obj, &b[1], 0, 'q', "rows") < 0 ||
        PyObject_GetBuffer(o_obj, &b[2].view, PyBUF_WRITABLE | PyBUF_ND | PyBUF_C_CONTIGUOUS) < 0) {
        release(b, 3);
        return NULL;
    }
    b[2].held = 1;
    Py_ssize_t num_rows = b[0].view.ndim >= 1 ? b[0].view.shape[0] : 0;
    Py_ssize_t k = b[1].view.len / 8;
    if (num_rows <= 0 || b[0].view.len % num_rows != 0 || b[2].view.itemsize != b[0].view.itemsize) {
        PyErr_SetString(PyExc_ValueError, "gather: value must have rows, and out its item size");
        release(b, 3);
        return NULL;
    }
    Py_ssize_t row_bytes = b[0].view.len / num_rows;
    if (b[2].view.len != k * row_bytes) {
        PyErr_SetString(PyExc_ValueError, "gather: out does not hold one row of value per index");
        release(b, 3);
        return NULL;
    }
    const int64_t *r = b[1].view.buf;
    if (check_rows(r, k, num_rows, "gather: ") < 0) {
        release(b, 3);
        return NULL;
    }
    const char *src = b[0].view.buf;
    char *dst = b[2].view.buf;
    UNLOCK_IF_LARGE(k * row_bytes);
    if (row_bytes == 4) {
        const float *s4 = (const float *)src;
        float *d4 = (float *)dst;
        for (Py_ssize_t i = 0; i < k; i++) {
            if (i + ROW_PREFETCH_AHEAD < k) __builtin_prefetch(s4 + r[i + ROW_PREFETCH_AHEAD]);
            d4[i] = s4[r[i]];
        }
    } else {
        for (Py_ssize_t i = 0; i < k; i++) {
            if (i + ROW_PREFETCH_AHEAD < k) __builtin_prefetch(src + r[i + ROW_PREFETCH_AHEAD] * row_bytes);
            memcpy(dst + i * row_bytes, src + r[i] * row_bytes, (size_t)row_bytes);
        }
    }
    RELOCK();
    release(b, 3);
    Py_RETURN_NONE;
}

/* ---- a lazy partition's first touches ----------------------------------------------------------------- */

/* Takes obj's writable C-contiguous buffer of uint8 or uint32 items (row marks): -1 with ValueError
 * "<name> must be uint8 or uint32" otherwise. */
static int get_row_marks(PyObject *obj, Buf *b, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    b->held = 1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (!((f[0] == 'I' && b->view.itemsize == 4) || (f[0] == 'B' && b->view.itemsize == 1)) || f[1] != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be uint8 or uint32", name);
        return -1;
    }
    return 0;
}

/* One pass over a sparse update's rows: the lazy partition's new rows claimed (marks not None: each row whose
 * mark is 0, once, in order of first appearance, into out, its mark set to 1), the built ones stamped
 * changed[r] = epoch (changed not None). Both arrays, when given, hold one item per row of the partition; every
 * row is checked before anything is written. who: "<kernel>: ", the errors' prefix. */
static PyObject *touch(PyObject *m_obj, PyObject *c_obj, unsigned long epoch_arg, PyObject *r_obj, PyObject *o_obj,
                       const char *who) {
    Buf b[4] = {{.held = 0}};
    Py_ssize_t num_rows = -1;
    if (m_obj != Py_None) {
        if (PyObject_GetBuffer(m_obj, &b[0].view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
        b[0].held = 1;
        if (b[0].view.itemsize != 1) {
            PyErr_Format(PyExc_ValueError, "%smarks must hold one byte a row", who);
            release(b, 4);
            return NULL;
        }
        num_rows = b[0].view.len;
    }
    if (c_obj != Py_None) {
        if (get_row_marks(c_obj, &b[1], "touch_rows: changed") < 0) {
            release(b, 4);
            return NULL;
        }
        if (epoch_arg > (b[1].view.itemsize == 1 ? 0xFFUL : 0xFFFFFFFFUL)) {
            PyErr_Format(PyExc_ValueError, "%sepoch does not fit in an item of changed", who);
            release(b, 4);
            return NULL;
        }
        Py_ssize_t n = b[1].view.len / b[1].view.itemsize;
        if (num_rows >= 0 && n != num_rows) {
            PyErr_Format(PyExc_ValueError, "%smarks and changed differ in rows", who);
            release(b, 4);
            return NULL;
        }
        num_rows = n;
    }
    if (get(r_obj, &b[2], 0, 'q', "rows") < 0) {
        release(b, 4);
        return NULL;
    }
    Py_ssize_t k = b[2].view.len / 8;
    if (m_obj != Py_None) {
        if (get(o_obj, &b[3], 1, 'q', "out") < 0) {
            release(b, 4);
            return NULL;
        }
        if (b[3].view.len / 8 < k) {
            PyErr_Format(PyExc_ValueError, "%sout is shorter than rows", who);
            release(b, 4);
            return NULL;
        }
    }
    const int64_t *r = b[2].view.buf;
    if (num_rows < 0) num_rows = 0;  /* neither array: nothing to write, every row is out of range */
    if (check_rows(r, k, num_rows, who) < 0) {
        release(b, 4);
        return NULL;
    }
    unsigned char *marks = m_obj != Py_None ? b[0].view.buf : NULL;
    uint32_t *changed = c_obj != Py_None && b[1].view.itemsize == 4 ? b[1].view.buf : NULL;
    unsigned char *changed8 = c_obj != Py_None && b[1].view.itemsize == 1 ? b[1].view.buf : NULL;
    int64_t *out = marks ? b[3].view.buf : NULL;
    const uint32_t epoch = (uint32_t)epoch_arg;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (i + ROW_PREFETCH_AHEAD < k) {
            int64_t ahead = r[i + ROW_PREFETCH_AHEAD];
            if (marks) __builtin_prefetch(marks + ahead, 1);
            if (changed) __builtin_prefetch(changed + ahead, 1);
            if (changed8) __builtin_prefetch(changed8 + ahead, 1);
        }
        int64_t row = r[i];
        if (marks && marks[row] != 1) {
            if (!marks[row]) {
                marks[row] = 2; /* claimed by this call: a repeat of it further on is neither claimed nor stamped */
                out[n++] = row;
            }
        } else if (changed8) {
            changed8[row] = (unsigned char)epoch;
        } else if (changed) {
            changed[row] = epoch;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) marks[out[i]] = 1;
    release(b, 4);
    return PyLong_FromSsize_t(n);
}

static PyObject *touch_rows(PyObject *self, PyObject *args) {
    PyObject *m_obj, *c_obj, *r_obj, *o_obj;
    unsigned long epoch;
    if (!PyArg_ParseTuple(args, "OOkOO:touch_rows", &m_obj, &c_obj, &epoch, &r_obj, &o_obj)) return NULL;
    if (epoch > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_ValueError, "touch_rows: epoch does not fit in an item of changed");
        return NULL;
    }
    return touch(m_obj, c_obj, epoch, r_obj, o_obj, "touch_rows: ");
}

/* touch_rows with no row marks: the claim alone (a read's build, a replica's marks). */
static PyObject *first_touch(PyObject *self, PyObject *args) {
    PyObject *m_obj, *r_obj, *o_obj;
    if (!PyArg_ParseTuple(args, "OOO:first_touch", &m_obj, &r_obj, &o_obj)) return NULL;
    if (m_obj == Py_None) {
        PyErr_SetString(PyExc_TypeError, "first_touch: marks must be a writable buffer, not None");
        return NULL;
    }
    return touch(m_obj, Py_None, 0, r_obj, o_obj, "first_touch: ");
}

/* ---- the id index --------------------------------------------------------------------------------- */

#define INDEX_EMPTY (-1)
#define INDEX_SALT 0x5851F42D4C957F2DULL
#define PREFETCH_AHEAD 16

static inline uint64_t index_home(int64_t id, uint64_t mask) {
    uint64_t z = ((uint64_t)id ^ INDEX_SALT) + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (z ^ (z >> 31)) & mask;
}

static inline void prefetch_bucket(const int64_t *keys, const int64_t *vals, uint64_t b) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(keys + b);
    __builtin_prefetch(vals + b);
#else
    (void)keys, (void)vals, (void)b;
#endif
}

/* keys and vals (int64, same power-of-two length): sets *mask. */
static int get_index(PyObject *k_obj, PyObject *v_obj, Buf *b, int writable, uint64_t *mask) {
    if (get(k_obj, &b[0], writable, 'q', "keys") < 0 || get(v_obj, &b[1], writable, 'q', "vals") < 0) return -1;
    Py_ssize_t n = b[0].view.len / 8;
    if (b[1].view.len / 8 != n || n < 1 || (n & (n - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "keys and vals must have the same power-of-two length");
        return -1;
    }
    *mask = (uint64_t)n - 1;
    return 0;
}

/* Puts (id, slot) in the first empty bucket from the id's home; 0, or -1 when every bucket is full. */
static inline int place_one(int64_t *keys, int64_t *vals, uint64_t mask, int64_t id, int64_t slot) {
    uint64_t b = index_home(id, mask);
    for (uint64_t step = 0; step <= mask; step++, b = (b + 1) & mask)
        if (vals[b] == INDEX_EMPTY) {
            keys[b] = id;
            vals[b] = slot;
            return 0;
        }
    return -1;
}

/* The slot of id (-1 if absent), probing linearly from bucket home; *at: its bucket (-1 if absent). */
static inline int64_t probe(const int64_t *keys, const int64_t *vals, uint64_t mask, int64_t id, uint64_t home,
                            int64_t *at) {
    uint64_t pos = home;
    for (uint64_t step = 0; step <= mask; step++, pos = (pos + 1) & mask) {
        int64_t v = vals[pos];
        if (v == INDEX_EMPTY) break;
        if (v >= 0 && keys[pos] == id) {
            *at = (int64_t)pos;
            return v;
        }
    }
    *at = -1;
    return -1;
}

static PyObject *index_find(PyObject *self, PyObject *args) {
    PyObject *k_obj, *v_obj, *i_obj, *s_obj, *w_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:index_find", &k_obj, &v_obj, &i_obj, &s_obj, &w_obj)) return NULL;
    Buf b[5] = {{.held = 0}};
    uint64_t mask;
    if (get_index(k_obj, v_obj, b, 0, &mask) < 0 || get(i_obj, &b[2], 0, 'q', "ids") < 0 ||
        get(s_obj, &b[3], 1, 'q', "slots_out") < 0 || get(w_obj, &b[4], 1, 'q', "where_out") < 0) {
        release(b, 5);
        return NULL;
    }
    Py_ssize_t k = b[2].view.len / 8;
    if (b[3].view.len / 8 != k || b[4].view.len / 8 != k) {
        release(b, 5);
        PyErr_SetString(PyExc_ValueError, "slots_out and where_out must have one item per id");
        return NULL;
    }
    const int64_t *keys = b[0].view.buf, *vals = b[1].view.buf, *ids = b[2].view.buf;
    int64_t *slots = b[3].view.buf, *where = b[4].view.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) where[i] = (int64_t)index_home(ids[i], mask);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (i + PREFETCH_AHEAD < k) prefetch_bucket(keys, vals, (uint64_t)where[i + PREFETCH_AHEAD]);
        int64_t at;
        slots[i] = probe(keys, vals, mask, ids[i], (uint64_t)where[i], &at);
        where[i] = at;
    }
    Py_END_ALLOW_THREADS
    release(b, 5);
    Py_RETURN_NONE;
}

/* index_touch(keys, vals, ids, slots_out, freq, last, step, lookup): index_find's slots (no buckets) and, for
 * each id found, the row's use: lookup != 0: freq[slot] += 1 and last[slot] = step (a training lookup);
 * lookup == 0: last[slot] = max(last[slot], step) (an update). Returns how many ids have no row. ids are
 * distinct (as DynamicTable passes them). One pass instead of a find and three numpy gathers/scatters. */
static PyObject *index_touch(PyObject *self, PyObject *args) {
    PyObject *k_obj, *v_obj, *i_obj, *s_obj, *f_obj, *l_obj;
    long long step;
    int lookup;
    if (!PyArg_ParseTuple(args, "OOOOOOLp:index_touch", &k_obj, &v_obj, &i_obj, &s_obj, &f_obj, &l_obj, &step,
                          &lookup))
        return NULL;
    Buf b[6] = {{.held = 0}};
    uint64_t mask;
    if (get_index(k_obj, v_obj, b, 0, &mask) < 0 || get(i_obj, &b[2], 0, 'q', "ids") < 0 ||
        get(s_obj, &b[3], 1, 'q', "slots_out") < 0 || get(f_obj, &b[4], 1, 'q', "freq") < 0 ||
        get(l_obj, &b[5], 1, 'q', "last") < 0) {
        release(b, 6);
        return NULL;
    }
    Py_ssize_t k = b[2].view.len / 8, rows = b[4].view.len / 8;
    if (b[3].view.len / 8 != k || b[5].view.len / 8 != rows) {
        release(b, 6);
        PyErr_SetString(PyExc_ValueError, "slots_out must have one item per id, freq and last one per row");
        return NULL;
    }
    const int64_t *keys = b[0].view.buf, *vals = b[1].view.buf, *ids = b[2].view.buf;
    int64_t *slots = b[3].view.buf, *freq = b[4].view.buf, *last = b[5].view.buf;
    Py_ssize_t missing = 0, bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) slots[i] = (int64_t)index_home(ids[i], mask);
    for (Py_ssize_t i = 0; i < k; i++) {
        if (i + PREFETCH_AHEAD < k) prefetch_bucket(keys, vals, (uint64_t)slots[i + PREFETCH_AHEAD]);
        int64_t at, slot = probe(keys, vals, mask, ids[i], (uint64_t)slots[i], &at);
        slots[i] = slot;
        if (slot < 0) {
            missing++;
        } else if (slot >= rows) {
            bad++;
        } else if (lookup) {
            freq[slot] += 1;
            last[slot] = step;
        } else if (last[slot] < step) {
            last[slot] = step;
        }
    }
    Py_END_ALLOW_THREADS
    release(b, 6);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "the id index holds a slot beyond freq and last");
        return NULL;
    }
    return PyLong_FromSsize_t(missing);
}

static PyObject *index_place(PyObject *self, PyObject *args) {
    PyObject *k_obj, *v_obj, *i_obj, *s_obj;
    if (!PyArg_ParseTuple(args, "OOOO:index_place", &k_obj, &v_obj, &i_obj, &s_obj)) return NULL;
    Buf b[4] = {{.held = 0}};
    uint64_t mask;
    if (get_index(k_obj, v_obj, b, 1, &mask) < 0 || get(i_obj, &b[2], 0, 'q', "ids") < 0 ||
        get(s_obj, &b[3], 0, 'q', "slots") < 0) {
        release(b, 4);
        return NULL;
    }
    Py_ssize_t k = b[2].view.len / 8;
    const int64_t *ids = b[2].view.buf, *slots = b[3].view.buf;
    int bad = b[3].view.len / 8 != k;
    for (Py_ssize_t i = 0; i < k && !bad; i++) bad = slots[i] < 0;
    if (bad) {
        release(b, 4);
        PyErr_SetString(PyExc_ValueError, "slots must hold one slot >= 0 per id");
        return NULL;
    }
    int64_t *keys = b[0].view.buf, *vals = b[1].view.buf;
    int full = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k && !full; i++) {
        if (i + PREFETCH_AHEAD < k) prefetch_bucket(keys, vals, index_home(ids[i + PREFETCH_AHEAD], mask));
        full = place_one(keys, vals, mask, ids[i], slots[i]) < 0;
    }
    Py_END_ALLOW_THREADS
    release(b, 4);
    if (full) {
        PyErr_SetString(PyExc_RuntimeError, "index_place: every bucket is full");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Empties the buckets `where` (distinct, full), then walks the run of full buckets after each of them, taking
 * out every entry it meets and putting it back in the first empty bucket from its home (Knuth's deletion for
 * linear probing, batched as in the numpy twin): no tombstones, and every remaining id stays reachable.
 *
 * Why the walks suffice: an entry can only become unreachable when a bucket on its probe path (home to
 * bucket) empties, and then it lies in the run of full buckets right after that bucket.  A walk empties
 * each bucket it takes an entry out of only for that moment and goes on through the whole run after it;
 * an entry put back lands at or before the bucket it came from (that bucket is empty then) with a full path,
 * and later take-outs of the same walk lie beyond it.  Filling a bucket never hides an entry. */
static PyObject *index_remove(PyObject *self, PyObject *args) {
    PyObject *k_obj, *v_obj, *w_obj;
    if (!PyArg_ParseTuple(args, "OOO:index_remove", &k_obj, &v_obj, &w_obj)) return NULL;
    Buf b[3] = {{.held = 0}};
    uint64_t mask;
    if (get_index(k_obj, v_obj, b, 1, &mask) < 0 || get(w_obj, &b[2], 0, 'q', "where") < 0) {
        release(b, 3);
        return NULL;
    }
    int64_t *keys = b[0].view.buf, *vals = b[1].view.buf;
    const int64_t *where = b[2].view.buf;
    Py_ssize_t k = b[2].view.len / 8, checked = 0;
    int error = 0; /* 1: a bucket outside the index, 2: an empty bucket or a repeated one */
    Py_BEGIN_ALLOW_THREADS
    /* Check every bucket before changing anything: in range, full, distinct (a checked bucket's value is
     * flipped to -2 - value, below -1, until all are checked, so a repeat shows; undone on error). */
    for (; checked < k; checked++) {
        int64_t w = where[checked];
        if (checked + PREFETCH_AHEAD < k) prefetch_bucket(keys, vals, (uint64_t)where[checked + PREFETCH_AHEAD] & mask);
        if (w < 0 || (uint64_t)w > mask) {
            error = 1;
            break;
        }
        if (vals[w] < 0) {
            error = 2;
            break;
        }
        vals[w] = -2 - vals[w];
    }
    for (Py_ssize_t i = 0; i < checked; i++) vals[where[i]] = error ? -2 - vals[where[i]] : INDEX_EMPTY;
    for (Py_ssize_t i = 0; i < k && !error; i++) {
        if (i + PREFETCH_AHEAD < k) prefetch_bucket(keys, vals, ((uint64_t)where[i + PREFETCH_AHEAD] + 1) & mask);
        uint64_t pos = ((uint64_t)where[i] + 1) & mask;
        for (uint64_t step = 0; step <= mask && vals[pos] != INDEX_EMPTY; step++, pos = (pos + 1) & mask) {
            int64_t id = keys[pos], slot = vals[pos];
            vals[pos] = INDEX_EMPTY;
            place_one(keys, vals, mask, id, slot); /* finds a bucket: pos itself is empty */
        }
    }
    Py_END_ALLOW_THREADS
    long long bad = error ? (long long)where[checked] : 0;
    release(b, 3);
    if (error == 1) return PyErr_Format(PyExc_ValueError, "bucket %lld is outside the index", bad);
    if (error == 2) return PyErr_Format(PyExc_ValueError, "bucket %lld is empty or given twice", bad);
    Py_RETURN_NONE;
}

/* merge_sum(rows, values, bounds, out_rows, out_sums, start_zero): a sync step's sparse pieces summed per row.
 * rows: int64 [n], the pieces' rows one after another, piece p = [bounds[p], bounds[p+1]); values: float32
 * [n, d] (C order); out_rows: int64 [n]; out_sums: float64 [n, d]. Each piece must be strictly increasing (what
 * clients send): a k-way merge then gives the distinct rows in order and, per row, its values added in float64
 * in piece order: from 0.0 (start_zero, as np.bincount) or from the first value (as psflow.ps.sync._sum_rows'
 * wide rows), the same additions in the same order as the numpy code. Returns the distinct row count, or -1
 * (nothing written that matters) when a piece is not strictly increasing: the caller sums with numpy then. */
static PyObject *merge_sum(PyObject *self, PyObject *args) {
    PyObject *r_obj, *v_obj, *b_obj, *o_obj, *s_obj;
    int start_zero;
    if (!PyArg_ParseTuple(args, "OOOOOp:merge_sum", &r_obj, &v_obj, &b_obj, &o_obj, &s_obj, &start_zero)) return NULL;
    Buf b[5] = {{.held = 0}};
    if (get(r_obj, &b[0], 0, 'q', "rows") < 0 || get(v_obj, &b[1], 0, 'f', "values") < 0 ||
        get(b_obj, &b[2], 0, 'q', "bounds") < 0 || get(o_obj, &b[3], 1, 'q', "out_rows") < 0) {
        release(b, 5);
        return NULL;
    }
    if (PyObject_GetBuffer(s_obj, &b[4].view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        release(b, 5);
        return NULL;
    }
    b[4].held = 1;
    const char *f = b[4].view.format ? b[4].view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    Py_ssize_t n = b[0].view.len / 8, k = b[2].view.len / 8 - 1;
    const char *error = NULL;
    if (f[0] != 'd' || f[1] != 0 || b[4].view.itemsize != 8) error = "out_sums must be float64";
    else if (n == 0 || b[1].view.len / 4 % n != 0) error = "values must hold a whole row per row id";
    else if (b[3].view.len / 8 != n) error = "out_rows must have one item per row id";
    else if (k < 1) error = "bounds must hold at least two offsets";
    Py_ssize_t d = n ? b[1].view.len / 4 / n : 0;
    const int64_t *bounds = b[2].view.buf;
    if (!error && b[4].view.len / 8 != n * d) error = "out_sums must be shaped like values";
    for (Py_ssize_t p = 0; !error && p < k; p++)
        if (bounds[p] < 0 || bounds[p] > bounds[p + 1] || bounds[p + 1] > n) error = "bounds must rise from 0 to n";
    if (!error && (bounds[0] != 0 || bounds[k] != n)) error = "bounds must rise from 0 to n";
    if (error) {
        release(b, 5);
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    const int64_t *rows = b[0].view.buf;
    const float *values = b[1].view.buf;
    int64_t *out_rows = b[3].view.buf;
    double *sums = b[4].view.buf;
    Py_ssize_t *head = PyMem_RawMalloc((size_t)k * sizeof(Py_ssize_t));
    if (head == NULL) {
        release(b, 5);
        return PyErr_NoMemory();
    }
    Py_ssize_t count = 0;
    UNLOCK_IF_LARGE(n * d * 4);
    for (Py_ssize_t p = 0; p < k && count >= 0; p++) {
        head[p] = bounds[p];
        for (Py_ssize_t i = bounds[p] + 1; i < bounds[p + 1]; i++)
            if (rows[i] <= rows[i - 1]) {
                count = -1;
                break;
            }
    }
    while (count >= 0) {
        int64_t low = 0;
        int any = 0;
        for (Py_ssize_t p = 0; p < k; p++)
            if (head[p] < bounds[p + 1] && (!any || rows[head[p]] < low)) {
                low = rows[head[p]];
                any = 1;
            }
        if (!any) break;
        double *out = sums + count * d;
        int first = 1;
        for (Py_ssize_t p = 0; p < k; p++) {
            if (head[p] >= bounds[p + 1] || rows[head[p]] != low) continue;
            const float *v = values + head[p] * d;
            if (first && !start_zero) {
                for (Py_ssize_t j = 0; j < d; j++) out[j] = (double)v[j];
            } else {
                if (first)
                    for (Py_ssize_t j = 0; j < d; j++) out[j] = 0.0;
                for (Py_ssize_t j = 0; j < d; j++) out[j] += (double)v[j];
            }
            first = 0;
            head[p]++;
        }
        out_rows[count++] = low;
    }
    RELOCK();
    PyMem_RawFree(head);
    release(b, 5);
    return PyLong_FromSsize_t(count);
}

/* ---- a backup's write of a replicated partition's rows: one block into several arrays -------------------- */

#define MAX_STACKED 16

/* The arrays of `seq` (a tuple or list of 1 to MAX_STACKED C-contiguous buffers, `writable` for targets), each
 * of `num_rows` rows of `row_bytes` bytes (the first sets both). -1 with ValueError on any mismatch. */
static int stacked(PyObject *seq, int writable, Buf *b, Py_ssize_t *count, Py_ssize_t *num_rows, Py_ssize_t *row_bytes,
                   const char *who) {
    PyObject *fast = PySequence_Fast(seq, who);
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n < 1 || n > MAX_STACKED) {
        PyErr_Format(PyExc_ValueError, "%s: want 1 to %d arrays, got %zd", who, MAX_STACKED, n);
        Py_DECREF(fast);
        return -1;
    }
    *count = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        Buf *x = &b[j];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, j), &x->view,
                               (writable ? PyBUF_WRITABLE : 0) | PyBUF_ND | PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        x->held = 1;
        *count = j + 1;
        Py_ssize_t rows_j = x->view.ndim >= 1 ? x->view.shape[0] : 0;
        if (rows_j <= 0 || x->view.len % rows_j != 0) {
            PyErr_Format(PyExc_ValueError, "%s: array %zd has no rows", who, j);
            Py_DECREF(fast);
            return -1;
        }
        if (j == 0) {
            *num_rows = rows_j;
            *row_bytes = x->view.len / rows_j;
        } else if (rows_j != *num_rows || x->view.len / rows_j != *row_bytes) {
            PyErr_Format(PyExc_ValueError, "%s: array %zd has %zd rows of %zd bytes, array 0 %zd of %zd", who, j,
                         rows_j, x->view.len / rows_j, *num_rows, *row_bytes);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

/* scatter_rows(targets, rows, block): targets[j][rows[i]] = block[j, i], in order of i (a repeated row keeps
 * its last). Every size and row is checked before a byte is written (ValueError, nothing changed). */
static PyObject *scatter_rows(PyObject *self, PyObject *args) {
    PyObject *t_obj, *r_obj, *blk_obj;
    if (!PyArg_ParseTuple(args, "OOO:scatter_rows", &t_obj, &r_obj, &blk_obj)) return NULL;
    Buf b[MAX_STACKED + 2] = {{.held = 0}};
    Py_ssize_t n = 0, num_rows = 0, row_bytes = 0;
    if (stacked(t_obj, 1, b, &n, &num_rows, &row_bytes, "scatter_rows") < 0) {
        release(b, MAX_STACKED + 2);
        return NULL;
    }
    Buf *rows = &b[MAX_STACKED], *blk = &b[MAX_STACKED + 1];
    if (get(r_obj, rows, 0, 'q', "rows") < 0 || PyObject_GetBuffer(blk_obj, &blk->view, PyBUF_C_CONTIGUOUS) < 0) {
        release(b, MAX_STACKED + 2);
        return NULL;
    }
    blk->held = 1;
    Py_ssize_t k = rows->view.len / 8;
    if (blk->view.len != n * k * row_bytes) {
        PyErr_Format(PyExc_ValueError, "scatter_rows: the block has %zd bytes, not %zd arrays x %zd rows x %zd bytes",
                     blk->view.len, n, k, row_bytes);
        release(b, MAX_STACKED + 2);
        return NULL;
    }
    const int64_t *r = rows->view.buf;
    if (check_rows(r, k, num_rows, "scatter_rows: ") < 0) {
        release(b, MAX_STACKED + 2);
        return NULL;
    }
    const char *block = blk->view.buf;
    UNLOCK_IF_LARGE(n * k * row_bytes);
    for (Py_ssize_t j = 0; j < n; j++) {
        char *array = b[j].view.buf;
        const char *part = block + j * k * row_bytes;
        if (row_bytes == 4) {
            float *a4 = (float *)array;
            const float *p4 = (const float *)part;
            for (Py_ssize_t i = 0; i < k; i++) {
                if (i + ROW_PREFETCH_AHEAD < k) __builtin_prefetch(a4 + r[i + ROW_PREFETCH_AHEAD], 1);
                a4[r[i]] = p4[i];
            }
        } else {
            for (Py_ssize_t i = 0; i < k; i++) {
                if (i + ROW_PREFETCH_AHEAD < k) __builtin_prefetch(array + r[i + ROW_PREFETCH_AHEAD] * row_bytes, 1);
                memcpy(array + r[i] * row_bytes, part + i * row_bytes, (size_t)row_bytes);
            }
        }
    }
    RELOCK();
    release(b, MAX_STACKED + 2);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"adagrad", adagrad, METH_VARARGS,
     "adagrad(var, accum, grad, rows, num_rows, lr): TF's Adagrad update, in place, on all of var (rows=None) "
     "or on the given distinct rows."},
    {"ftrl", ftrl, METH_VARARGS,
     "ftrl(var, accum, linear, grad, rows, num_rows, lr, l1, two_l2, two_shrinkage): TF's FTRL update "
     "(learning_rate_power -0.5), in place, on all of var (rows=None) or on the given distinct rows."},
    {"rmsprop", rmsprop, METH_VARARGS,
     "rmsprop(var, rms, mom, mg, grad, rows, num_rows, lr, decay, momentum, epsilon): TF1's RMSProp update, in "
     "place (mg None: not centered), on all of var with TF's dense formula (rows=None) or on the given distinct "
     "rows with its sparse kernel's."},
    {"gather", gather, METH_VARARGS,
     "gather(value, rows, out): out[i] = value[rows[i]] for C-contiguous value [n, ...] and out [k, ...] of one "
     "item size; every row is checked first (ValueError, nothing written)."},
    {"scatter_rows", scatter_rows, METH_VARARGS,
     "scatter_rows(targets, rows, block): targets[j][rows[i]] = block[j, i] for 1 to 16 C-contiguous targets of "
     "the same row count and row size, in order of i (a repeated row keeps its last); every size and row is "
     "checked first (ValueError, nothing written)."},
    {"first_touch", first_touch, METH_VARARGS,
     "first_touch(marks, rows, out): the rows whose one-byte mark is 0, each once, in order of first appearance, "
     "written to out and marked 1; returns their count. Every row is checked first (ValueError, nothing written)."},
    {"touch_rows", touch_rows, METH_VARARGS,
     "touch_rows(marks, changed, epoch, rows, out): one pass over a sparse update's rows: where marks (one byte a "
     "row) is not None, each unmarked row is marked 1 and written to out once, in order of first appearance; where "
     "changed (uint8 or uint32 a row) is not None, changed[row] = epoch for every row marked before the call. Returns the "
     "count written to out. Every row is checked first (ValueError, nothing written)."},
    {"merge_sum", merge_sum, METH_VARARGS,
     "merge_sum(rows, values, bounds, out_rows, out_sums, start_zero): strictly increasing pieces of sparse rows "
     "merged, values summed per row in float64 in piece order; returns the row count, or -1 if a piece is not "
     "strictly increasing."},
    {"index_find", index_find, METH_VARARGS,
     "index_find(keys, vals, ids, slots_out, where_out): each id's slot and bucket in the id index, -1 for "
     "both where absent."},
    {"index_touch", index_touch, METH_VARARGS,
     "index_touch(keys, vals, ids, slots_out, freq, last, step, lookup): each (distinct) id's slot, -1 where "
     "absent; found rows: lookup: freq += 1, last = step; else last = max(last, step). Returns the absent count."},
    {"index_place", index_place, METH_VARARGS,
     "index_place(keys, vals, ids, slots): puts each id (distinct, absent) in the first empty bucket from its "
     "home, in order."},
    {"index_remove", index_remove, METH_VARARGS,
     "index_remove(keys, vals, where): empties the buckets where (distinct, full) and re-places the entries "
     "of the runs after them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "Fused optimizer updates and id-index loops for ps tasks.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
