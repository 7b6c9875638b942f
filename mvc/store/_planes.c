/* Un-grouping byte planes: the one loop of a dense read that numpy cannot do fast.
 *
 * interleave(planes, out): byte j of element i of ``out`` is planes[j][i].
 * ``planes`` is a sequence of w buffers of n bytes each (1 <= w <= 16) and
 * ``out`` a writable buffer of n * w bytes. The copy runs without the GIL,
 * so the store's reader threads un-group records side by side.
 *
 * Why C: numpy does this as a strided copy per plane or as shifts over
 * whole arrays, 3-4 GB/s per core here; this loop, which gcc vectorises at
 * -O2/-O3 for widths 2, 4 and 8, runs at about 11 GB/s (benchmarks/bench_codec.py).
 * Without a compiler the package still installs and mvc/store/codec.py
 * takes the numpy path, which writes the same bytes (tests/test_codec.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_WIDTH 16

static void join2(const uint8_t *const *p, size_t n, uint8_t *out) {
    const uint8_t *a = p[0], *b = p[1];
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(a[i] | ((uint16_t)b[i] << 8));
        memcpy(out + 2 * i, &v, 2);  /* little-endian only: the caller checks */
    }
}

static void join4(const uint8_t *const *p, size_t n, uint8_t *out) {
    const uint8_t *a = p[0], *b = p[1], *c = p[2], *d = p[3];
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)a[i] | ((uint32_t)b[i] << 8) | ((uint32_t)c[i] << 16) | ((uint32_t)d[i] << 24);
        memcpy(out + 4 * i, &v, 4);
    }
}

static void join8(const uint8_t *const *p, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int j = 7; j >= 0; j--)
            v = (v << 8) | p[j][i];
        memcpy(out + 8 * i, &v, 8);
    }
}

static void join_any(const uint8_t *const *p, size_t w, size_t n, uint8_t *out) {
    for (size_t j = 0; j < w; j++) {
        const uint8_t *src = p[j];
        for (size_t i = 0; i < n; i++)
            out[i * w + j] = src[i];
    }
}

static int little_endian(void) {
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

static PyObject *interleave(PyObject *self, PyObject *args) {
    PyObject *seq;
    Py_buffer out, planes[MAX_WIDTH];
    const uint8_t *ptrs[MAX_WIDTH];
    Py_ssize_t w, got = 0, n;
    PyObject *result = NULL;

    if (!PyArg_ParseTuple(args, "Ow*", &seq, &out))
        return NULL;
    seq = PySequence_Fast(seq, "planes must be a sequence of buffers");
    if (seq == NULL)
        goto done;
    w = PySequence_Fast_GET_SIZE(seq);
    if (w < 1 || w > MAX_WIDTH) {
        PyErr_Format(PyExc_ValueError, "width %zd is not between 1 and %d", w, MAX_WIDTH);
        goto done;
    }
    for (; got < w; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &planes[got], PyBUF_SIMPLE) < 0)
            goto done;
        ptrs[got] = (const uint8_t *)planes[got].buf;
    }
    n = planes[0].len;
    for (Py_ssize_t j = 1; j < w; j++) {
        if (planes[j].len != n) {
            PyErr_SetString(PyExc_ValueError, "planes differ in length");
            goto done;
        }
    }
    if (out.len != n * w) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, the planes %zd", out.len, n * w);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    if (w == 1)
        memcpy(out.buf, ptrs[0], (size_t)n);
    else if (w == 2 && little_endian())
        join2(ptrs, (size_t)n, out.buf);
    else if (w == 4 && little_endian())
        join4(ptrs, (size_t)n, out.buf);
    else if (w == 8 && little_endian())
        join8(ptrs, (size_t)n, out.buf);
    else
        join_any(ptrs, (size_t)w, (size_t)n, out.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t j = 0; j < got; j++)
        PyBuffer_Release(&planes[j]);
    PyBuffer_Release(&out);
    Py_XDECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"interleave", interleave, METH_VARARGS,
     "interleave(planes, out): byte j of element i of out is planes[j][i]; the GIL is released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planes", NULL, -1, methods};

PyMODINIT_FUNC PyInit__planes(void) { return PyModule_Create(&module); }
