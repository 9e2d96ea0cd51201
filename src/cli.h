// Command-line parsing shared by the subcommands: every malformed value is a usage error that
// names the flag and points at --help, with exit status 2.
#pragma once

#include "model.h"

// The value after argv[*i] (advancing *i); a missing value is a usage error.
const char *cli_value(int argc, char **argv, int *i);
long cli_int(const char *s, const char *flag, long lo, long hi);
double cli_double(const char *s, const char *flag, double lo, double hi);
DType cli_dtype(const char *s, const char *flag);

// "gpt2: <message> (see --help)" on stderr, exit status 2.
GPT2_PRINTF(1, 2) GPT2_NORETURN void cli_usage_error(const char *fmt, ...);
