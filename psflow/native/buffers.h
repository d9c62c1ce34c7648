/*
 * The buffer helpers psflow's C extensions share (psflow/ps/_kernels.c, psflow/torch/_lookup.c,
 * psflow/models/_logistic.c): each argument array is taken as a Py_buffer, checked for its item type, and
 * released on every path.
 *
 *   Buf                      a Py_buffer and whether it is held (released only then)
 *   release(b, n)            releases the held ones of b[0..n)
 *   get(obj, b, w, kind, n)  takes obj's C-contiguous buffer (writable if w) of items of `kind`:
 *                            'f' float32, 'd' float64, 'q' int64 (format 'q' or 'l', 8 bytes);
 *                            -1 with ValueError "<n> must be <float32|float64|int64>" otherwise
 *
 * The format is matched one character at a time (f[1] is read only once f[0] matched, so a one-character
 * format is never read past its end) and must be exactly one item code, after an optional byte-order mark.
 * Header-only (static functions): each extension compiles its own copy.
 */
#ifndef PSFLOW_NATIVE_BUFFERS_H
#define PSFLOW_NATIVE_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static void release(Buf *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

static const char *kind_name(char kind) {
    return kind == 'f' ? "float32" : kind == 'd' ? "float64" : "int64";
}

static int get(PyObject *obj, Buf *b, int writable, char kind, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    b->held = 1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = kind == 'f'   ? f[0] == 'f' && f[1] == 0 && b->view.itemsize == 4
             : kind == 'd' ? f[0] == 'd' && f[1] == 0 && b->view.itemsize == 8
                           : (f[0] == 'q' || f[0] == 'l') && f[1] == 0 && b->view.itemsize == 8;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s must be %s", name, kind_name(kind));
        return -1;
    }
    return 0;
}

#endif
