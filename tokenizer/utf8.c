// UTF-8 validation and repair. Python replaces invalid input one "maximal subpart" at a time
// (Unicode's recommended practice, chapter 3 "U+FFFD Substitution of Maximal Subparts"): the lead
// byte and as many following bytes as could still belong to a valid character become one U+FFFD,
// and decoding resumes at the first byte that did not fit.
#include "utf8.h"

#include <string.h>

#include "common.h"

// ----------------------------------------------------------------------------
// One character

size_t utf8_char(const unsigned char *s, size_t n, size_t *subpart, bool *at_end) {
    unsigned b = s[0];
    if (b < 0x80) return 1;
    // The second byte's range depends on the lead: it rules out overlong forms (E0, F0),
    // surrogates (ED) and code points past U+10FFFF (F4). Later bytes are plain continuations.
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b >= 0xE1 && b <= 0xEF) need = 2;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else {
        *subpart = 1;
        *at_end = false;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) {
            *subpart = i;
            *at_end = true;
            return 0;
        }
        if (s[i] < lo || s[i] > hi) {
            *subpart = i;
            *at_end = false;
            return 0;
        }
        lo = 0x80, hi = 0xBF;
    }
    return need + 1;
}

// ----------------------------------------------------------------------------
// Repair

// Length of the valid run starting at s: ASCII is checked eight bytes at a time, since nearly all
// input is valid and mostly ASCII.
static size_t valid_run(const unsigned char *s, size_t n) {
    size_t i = 0, subpart;
    bool at_end;
    while (i < n) {
        if (i + 8 <= n) {
            unsigned long long w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        size_t k = utf8_char(s + i, n - i, &subpart, &at_end);
        if (!k) break;
        i += k;
    }
    return i;
}

size_t utf8_repair(const char *text, size_t len, char **out, size_t *out_len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = valid_run(s, len);
    *out = NULL;
    *out_len = len;
    if (i == len) return 0;

    // Each replaced subpart of k >= 1 bytes becomes 3 bytes, so 3 * len bounds the result.
    char *r = xmalloc(3 * len + 1);
    memcpy(r, s, i);
    size_t o = i, replaced = 0;
    while (i < len) {
        size_t subpart;
        bool at_end;
        size_t k = utf8_char(s + i, len - i, &subpart, &at_end);
        if (k) {
            size_t run = valid_run(s + i, len - i);
            memcpy(r + o, s + i, run);
            o += run, i += run;
            continue;
        }
        memcpy(r + o, "\xEF\xBF\xBD", 3);
        o += 3, i += subpart, replaced++;
    }
    r[o] = '\0';
    *out = r;
    *out_len = o;
    return replaced;
}

// ----------------------------------------------------------------------------
// Streaming

size_t utf8_incomplete_tail(const unsigned char *s, size_t n) {
    // Walk back over at most three continuation bytes to the last lead byte, then ask whether the
    // character it starts is a valid prefix cut short by the end of s.
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned b = s[n - back];
        if (b >= 0x80 && b < 0xC0) continue;
        if (b < 0x80) return 0;
        size_t subpart;
        bool at_end;
        if (utf8_char(s + n - back, back, &subpart, &at_end) == 0 && at_end && subpart == back) return back;
        return 0;
    }
    return 0;
}
