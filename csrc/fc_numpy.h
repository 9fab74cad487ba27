/* NumPy C API for every file but module.c (which defines FC_NUMPY_MAIN). */
#ifndef FC_NUMPY_H
#define FC_NUMPY_H
#define PY_ARRAY_UNIQUE_SYMBOL fc_ARRAY_API
#ifndef FC_NUMPY_MAIN
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>
#endif
