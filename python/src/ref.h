/* SPDX-License-Identifier: MIT */
/* ref.h: shmref.Ref, a descriptor as a Python value. */
#ifndef SHMREFPY_REF_H
#define SHMREFPY_REF_H

#include "errors.h"

typedef struct {
    PyObject_HEAD
    shmref_desc desc;
} RefObject;

extern PyTypeObject Ref_Type;

/* ref_new: a Ref for desc. */
PyObject *ref_new(const shmref_desc *desc);
/* ref_parse: a Ref, its text or its binary form into *ret. -1 with TypeError/ValueError. */
int ref_parse(PyObject *obj, shmref_desc *ret);

#endif
