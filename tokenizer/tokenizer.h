// GPT-2's tokenizer: byte-level BPE, encoding and decoding exactly as OpenAI's encoder (and
// tiktoken's "gpt2" encoding) do, from the original encoder.json and vocab.bpe.
//
//   Tokenizer *tok = tokenizer_create(tokenizer_default_dir(), &err);
//   tokenizer_encode(tok, text, len, &ids, &n_ids, &n_replaced, &err);
//
//   TokenDecoder dec;
//   token_decoder_init(&dec);
//   char buf[TOKEN_DECODE_MAX];
//   for each id: tokenizer_decode_next(tok, &dec, id, buf, &n, &err); fwrite(buf, 1, n, out);
//   n = token_decoder_flush(&dec, buf); fwrite(buf, 1, n, out);
#pragma once

#include <stddef.h>

#include "common.h"

typedef struct Tokenizer Tokenizer;

// Loads encoder.json + vocab.bpe from dir; NULL and a one-line message naming the file on failure.
Tokenizer *tokenizer_create(const char *dir, Error *err);
void tokenizer_free(Tokenizer *t);

// The directory to load by default: $GPT2_TOKENIZER if set, else ./tokenizer if it holds
// encoder.json, else <directory of /proc/self/exe>/tokenizer.
const char *tokenizer_default_dir(void);

int tokenizer_vocab_size(const Tokenizer *t);  // 50257
int tokenizer_eot(const Tokenizer *t);         // 50256, <|endoftext|>

// ----------------------------------------------------------------------------
// Encoding

// UTF-8 text of len bytes (NULs allowed) → *ids (malloc'ed, caller frees; NULL when *n_ids is 0).
// Each literal "<|endoftext|>" becomes the single id 50256, as Hugging Face's tokenizer does.
// Invalid UTF-8 is first repaired as Python's bytes.decode(errors="replace") does; *n_replaced
// (may be NULL) counts the U+FFFD substitutions. Returns 0, or -1 with err set.
// Thread-safe: the Tokenizer is only read.
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int **ids, size_t *n_ids,
                     size_t *n_replaced, Error *err);

// ----------------------------------------------------------------------------
// Decoding, one id at a time
//
// A token's bytes need not end on a character boundary (an emoji is often two or three tokens).
// The decoder holds back an incomplete UTF-8 character at the end of what it has seen until the
// next tokens complete it, so every chunk it returns is whole characters and can be printed as
// it comes. Bytes that can never form a character (from ids no encoder would produce) are passed
// through as they are: the concatenated output is always exactly the tokens' bytes.

// The most bytes one tokenizer_decode_next or token_decoder_flush call writes.
#define TOKEN_DECODE_MAX 256

typedef struct {
    unsigned char held[4];  // the start of a character whose remaining bytes have not arrived
    size_t n_held;
} TokenDecoder;

void token_decoder_init(TokenDecoder *dec);

// Appends token id to the stream and writes into out (room for TOKEN_DECODE_MAX bytes) the bytes
// that are now complete, *out_len of them (possibly 0). An id outside [0, vocab size) returns -1
// with err set and leaves the decoder as it was.
int tokenizer_decode_next(const Tokenizer *t, TokenDecoder *dec, int id, char *out, size_t *out_len,
                          Error *err);

// Ends the stream: writes whatever is still held (an incomplete character, as raw bytes) into out
// and returns its length. The decoder is then ready for a new stream.
size_t token_decoder_flush(TokenDecoder *dec, char *out);
