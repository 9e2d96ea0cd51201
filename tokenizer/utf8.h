// The UTF-8 rules the tokenizer needs at its two edges: repairing invalid input exactly as
// Python's bytes.decode(errors="replace") does (the reference encoders see Python strings), and
// finding where a byte stream stops in the middle of a character (the streaming decoder).
#pragma once

#include <stdbool.h>
#include <stddef.h>

// The character at s (n > 0 bytes available). Returns its length (1 to 4) when it is complete and
// valid. Otherwise returns 0 and sets *subpart to the length of its maximal subpart, the bytes that
// one U+FFFD replaces (at least 1), and *at_end to whether that subpart runs to the end of s
// (a character the next bytes could still complete).
size_t utf8_char(const unsigned char *s, size_t n, size_t *subpart, bool *at_end);

// Copies text into *out (malloc'ed, NUL-terminated, *out_len bytes before the NUL) with each
// maximal invalid subpart replaced by U+FFFD, following Python's rules. Returns the number of
// replacements; when that is 0 nothing is allocated and *out is NULL: the text was valid already.
size_t utf8_repair(const char *text, size_t len, char **out, size_t *out_len);

// How many bytes at the end of s (0 to 3) are the start of a valid character still incomplete.
size_t utf8_incomplete_tail(const unsigned char *s, size_t n);
