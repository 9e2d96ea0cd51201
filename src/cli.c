// Command-line value parsing: strict (the whole string must be a number in range), one error line.
#include "cli.h"

#include <errno.h>
#include <math.h>

GPT2_NORETURN void cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("gpt2: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see --help)\n", stderr);
    va_end(ap);
    exit(2);
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) cli_usage_error("%s needs a value", argv[*i]);
    return argv[++*i];
}

long cli_int(const char *s, const char *flag, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        cli_usage_error("%s: '%s' is not an integer in %ld..%ld", flag, s, lo, hi);
    return v;
}

double cli_double(const char *s, const char *flag, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        cli_usage_error("%s: '%s' is not a number in %g..%g", flag, s, lo, hi);
    return v;
}

DType cli_dtype(const char *s, const char *flag) {
    if (!strcmp(s, "fp32") || !strcmp(s, "f32") || !strcmp(s, "float32")) return DTYPE_F32;
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) return DTYPE_BF16;
    cli_usage_error("%s: '%s' is not fp32 or bf16", flag, s);
}
