// A whole file mapped read-only into memory: how the checkpoint readers see their input. The
// kernel pages it in as the bytes are touched, and an llm.c checkpoint's tensors are used in place.
#pragma once

#include "common.h"

typedef struct {
    void *data;    // NULL for an empty file
    size_t bytes;
} MappedFile;

// Maps the regular file at path; -1 with "PATH: cannot open: ...", "PATH: not a regular file" or
// "PATH: cannot memory-map: ..." in err.
int mapped_file_open(MappedFile *f, const char *path, Error *err);
void mapped_file_close(MappedFile *f);
