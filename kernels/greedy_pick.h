// Greedy decoding's pick, taken by the kernel that writes the logits (logits_rows.h; the GEMV of
// fused_ln_linear.h) so that no sampler kernel runs after them: next[t] = the first index of row t's
// largest logit (sampling.h's greedy choice; a row of only -inf or NaN picks 0). Each block folds
// its rows' best into best[t] (one 64-bit atomic max of a rank key a row: rank_key.cuh), and the
// last block to finish (ticket) turns them into ids (greedy_pick.cuh). best [M] and ticket must be
// zero before a call and are left zero after it, so one zeroed workspace serves every call and graph
// replay; one call at a time per workspace. With ids_only the kernel writes only the ids, not the
// logits (a decode step reads nothing else: at 64 rows that is 12.9 MB of stores less).
#pragma once

typedef struct {
    int *next;                 // [M] (device)
    unsigned long long *best;  // [M] (device, 8-byte aligned)
    unsigned *ticket;          // (device)
    int ids_only;              // 1: y is left as it was
    int *next_copy;            // [M] (device), or NULL: the ids again (a decode step's next tokens)
} LogitsGreedy;
