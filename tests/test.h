// The whole test framework: each check prints one line the runner counts.
//   PASS name            the check held
//   FAIL name: why       it did not (the binary then exits non-zero)
//   SKIP name: reason    it could not run here (no GPU, no PyTorch, ...)
// tests/run.sh runs every tests/test_* binary and tests/e2e_*.sh script and sums the lines.
#pragma once

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int test_failures = 0;

static inline void test_result(int ok, const char *name, const char *fmt, ...) {
    if (ok) {
        printf("PASS %s\n", name);
    } else {
        printf("FAIL %s: ", name);
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
        test_failures++;
    }
    fflush(stdout);
}

static inline void test_skip(const char *name, const char *reason) {
    printf("SKIP %s: %s\n", name, reason);
    fflush(stdout);
}

// CHECK(cond, name, fmt, ...): one counted check; the message says what was seen.
#define CHECK(cond, name, ...) test_result((cond) ? 1 : 0, name, __VA_ARGS__)

static inline int test_exit_code(void) { return test_failures ? 1 : 0; }
