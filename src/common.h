// Small shared pieces of the host code: the error record every loader fills in, checked
// allocation, and bf16 <-> fp32 conversion (the checkpoint's storage type).
#pragma once

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Errors: a function that can fail on user input returns -1 and writes one line into an Error,
// naming the file or argument at fault. The caller decides whether that ends the program.

typedef struct {
    char msg[512];
} Error;

// GCC/Clang attributes, spelled so that the CUDA (C++) side can include this header too.
#if defined(__GNUC__)
#define GPT2_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define GPT2_NORETURN __attribute__((noreturn))
#else
#define GPT2_PRINTF(fmt, args)
#define GPT2_NORETURN
#endif

// Writes the message and returns -1, so that `return fail(err, ...)` reads as one step.
static inline GPT2_PRINTF(2, 3) int fail(Error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return -1;
}

// Prints "gpt2: <message>" on stderr and exits with status 1.
static inline GPT2_PRINTF(1, 2) GPT2_NORETURN void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("gpt2: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

// Allocation that cannot return NULL: running out of host memory ends the program with the size asked.
static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of host memory allocating %zu bytes", bytes);
    return p;
}

static inline void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) die("out of host memory allocating %zu x %zu bytes", count, size);
    return p;
}

// ----------------------------------------------------------------------------
// bf16: the top 16 bits of an IEEE fp32. Rounding to nearest even, NaN kept quiet.

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);  // NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}
