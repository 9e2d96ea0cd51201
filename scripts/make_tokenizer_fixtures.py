#!/usr/bin/env python3
"""Reference token ids for the C tokenizer's test: tests/fixtures/tokenizer/cases.jsonl.

Builds the test corpus (below, deterministic), then encodes every case with two independent
implementations built from this repository's tokenizer/encoder.json and tokenizer/vocab.bpe:
  - tiktoken: an Encoding made from the same files (the reference the C encoder must match),
  - Hugging Face `tokenizers`: a ByteLevel BPE from the same files, for a second opinion.
Each output line is one case:
  {"name": ..., "text": ... | "hex": ..., "replaced": N, "tiktoken": [ids], "hf": [ids]}
"hex" holds raw bytes (invalid UTF-8, NULs); both references see them decoded as Python's
bytes.decode(errors="replace") does, and "replaced" counts the U+FFFD that decoding made.

Needs tiktoken and tokenizers (pip). Usage:
  python3 scripts/make_tokenizer_fixtures.py [--out tests/fixtures/tokenizer/cases.jsonl]
"""
import argparse
import json
import os
import random
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER_DIR = os.path.join(HERE, "..", "tokenizer")

# GPT-2's pre-tokenizer pattern, as in OpenAI's encoder.py.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's map from bytes to the printable characters its files spell them with."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_encoder(tokenizer_dir=TOKENIZER_DIR):
    with open(os.path.join(tokenizer_dir, "encoder.json"), encoding="utf-8") as f:
        return json.load(f)


def tiktoken_encoding(tokenizer_dir=TOKENIZER_DIR):
    import tiktoken

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    encoder = load_encoder(tokenizer_dir)
    ranks = {bytes(byte_of[c] for c in tok): i for tok, i in encoder.items() if tok != EOT}
    return tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: encoder[EOT]})


def hf_tokenizer(tokenizer_dir=TOKENIZER_DIR):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    with tempfile.TemporaryDirectory() as tmp:
        vocab, merges = os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt")
        with open(vocab, "w", encoding="utf-8") as f:
            json.dump(load_encoder(tokenizer_dir), f, ensure_ascii=False)
        with open(os.path.join(tokenizer_dir, "vocab.bpe"), encoding="utf-8") as src, open(merges, "w", encoding="utf-8") as dst:
            dst.write(src.read())
        tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    got = tok.encode("Hello world").ids
    assert got == [15496, 995], f"HF tokenizer built wrong: 'Hello world' -> {got}"
    return tok


# ----------------------------------------------------------------------------
# The corpus

PROSE = """It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness. \
The quick brown fox jumps over the lazy dog; 1,234.56 dollars (about €1.100,50) were paid on 2024-03-15 at 09:45am.
Dr. O'Neill's co-workers—who'd "never" seen such a thing—said it's e-mail's fault… or isn't it?

"We're here," she said. 'They'll see.' I've got 3 cats, 12 dogs & 1,000,000 reasons. U.S.A. vs. U.K.: 50/50 odds!"""

CODE_C = """#include <stdio.h>

// Sum of squares, the slow way.
static long sumsq(const int *x, size_t n) {
\tlong s = 0;
\tfor (size_t i = 0; i < n; i++) s += (long)x[i] * x[i];
\treturn s;
}

int main(int argc, char **argv) {
    int xs[] = {1, 2, 3, 0x7fffffff, -42};
    printf("%ld\\n", sumsq(xs, sizeof xs / sizeof *xs));
    return argc > 1 ? 1 : 0;
}
"""

CODE_PY = '''def encode(self, text: str) -> list[int]:
    """Encode `text`; returns ids."""
    bpe_tokens = []
    for token in re.findall(self.pat, text):
        token = ''.join(self.byte_encoder[b] for b in token.encode('utf-8'))
        bpe_tokens.extend(self.encoder[bpe_token] for bpe_token in self.bpe(token).split(' '))
    return bpe_tokens  # noqa: E501

if __name__ == "__main__":
    print(f"{len(sys.argv)=}", {'a': [1, 2.5e-3, None]}, lambda x: x**2 // 3 % 7)
'''

CODE_JS = """const fetchAll = async (urls) => {
  const res = await Promise.all(urls.map(u => fetch(u).then(r => r.json())));
  return res.filter(Boolean).reduce((acc, x) => ({ ...acc, [x.id]: x }), {});
};
export default fetchAll; // ES2017+
"""

MARKDOWN = """# Title with `code` and **bold**

- item one
- item two with [a link](https://example.com/path?q=1&r=2#frag)
  1. nested *emphasis*
> quoted text

| col A | col B |
|-------|------:|
| 1     | 2.50  |

```bash
$ make test && ./gpt2 -p "Hello" | tee out.txt
```
"""

JSON_TEXT = '{"name": "gpt2", "n_layer": 12, "dims": [768, 3072], "ok": true, "null": null, "esc": "a\\"b\\\\c\\u00e9"}'

SCRIPTS = {
    "cjk_chinese": "我们今天去北京天安门广场。人工智能正在改变世界！这是一个测试句子，包含标点符号：「引号」和《书名号》。",
    "cjk_japanese": "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。カタカナとひらがな、ｈａｌｆｗｉｄｔｈ ｶﾀｶﾅ。",
    "cjk_korean": "대한민국의 수도는 서울입니다. 한국어 문장을 토큰화합니다! 안녕하세요?",
    "arabic": "اللغة العربية جميلة جداً. مرحباً بالعالم! كَتَبَ الوَلَدُ الدَّرْسَ ١٢٣ ٤٥٦.",
    "hebrew": "שלום עולם! זהו משפט בעברית עם ניקוד: בְּרֵאשִׁית בָּרָא.",
    "devanagari": "नमस्ते दुनिया! हिन्दी भाषा में यह एक वाक्य है। संख्याएँ: ०१२३४५६७८९ और क्षत्रिय।",
    "bengali_tamil": "আমি বাংলায় গান গাই। தமிழ் ஒரு அழகான மொழி. ౧౨౩ తెలుగు",
    "thai": "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ สวัสดีครับ ๑๒๓๔",
    "cyrillic": "Съешь же ещё этих мягких французских булок, да выпей чаю. ЁЛКИ-ПАЛКИ! Україна, Беларусь.",
    "greek": "Ξεσκεπάζω τὴν ψυχοφθόρα βδελυγμία. Ἀρχιμήδης εἶπε· «Εὕρηκα!»",
    "misc_scripts": "Հայերեն Ქართული ንግግር ᏣᎳᎩ ᠮᠣᠩᠭᠣᠯ ᚠᚢᚦᚨᚱᚲ Tiếng Việt có dấu: Nguyễn Đăng Khoa.",
    "numbers_many_scripts": "0123 ٠١٢٣ ۰۱۲۳ ०१२३ ০১২৩ ๐๑๒๓ １２３ ²³¹ ½ ¾ ⅓ Ⅻ ⅻ ① ⑳ 〇 ፩ 𝟘𝟙𝟚 ¹²³⁴",
    "latin_accents": "Façade, naïve, coöperate, Ångström, Œuvre, straße, ĳssel, ǅemal, ﬁnance ﬂow.",
    "letters_and_digits": "abc123def 3.14159 1,000,000 x²+y² H₂O 4th 1st 2ND v1.2.3-rc4 0xDEADbeef 1e-9 ʰʷ ˢ",
}

COMBINING = [
    "e\u0301te\u0301 cafe\u0301 re\u0301sume\u0301",
    "Z\u0351\u036b\u0343a\u0306l\u0350g\u0360o\u0339 t\u0334e\u0315x\u0322t",
    " \u0301\u0302 leading combining after space",
    "1\u0301 2\u20e3 3\ufe0f\u20e3 digits with marks",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab decomposed hangul jamo",
    "क्षि त्र ज्ञ ँ ं ः",
    "a\u0308\u0304 o\u0328\u0301 \u0300\u0300\u0300",
]

EMOJI = [
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag, 🧑🏿‍🤝‍🧑🏻 people",
    "👍👍🏻👍🏼👍🏽👍🏾👍🏿 skin tones",
    "🇯🇵🇺🇸🇫🇷🇩🇪🇧🇷 flags and 🏴󠁧󠁢󠁳󠁣󠁴󠁿 tag flag",
    "1️⃣ #️⃣ ❤️ ❤︎ ☺️ ✌🏼 keycaps and variation selectors",
    "😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘",
    "text🎉with🎉emoji🎉inside and 🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉",
]

WHITESPACE = [
    "", " ", "  ", "\n", "\n\n\n", "\t", " \t \n ", "a", "a ", "a  ", " a", "  a", "a  b", "a   b   c",
    "word\n\nword", "line one\r\nline two\r\n\r\nline four\r\n", "\tindented\n\t\tmore\n    spaces\n",
    "trailing spaces   \n   leading", "a \n b", "a\n \nb", "  \n  \n  ", "x\u00a0y\u00a0 z", "ideographic\u3000space\u3000\u3000x",
    "em\u2003space thin\u2009space", "line\u2028sep para\u2029sep", "nel\u0085next", "vt\x0bff\x0cend",
    "mongolian\u180evowel\u180e sep", "file\x1cgroup\x1drecord\x1eunit\x1fsep", "narrow\u202fnbsp\u205fmath",
    "ogham\u1680space", " \u00a0 \u00a0", "\u3000\u3000word", "end with spaces and newline  \n",
    "a  !", "x \n!", "   ?", "\n\n\nfoo", "tab\t\t(paren", "  123", " \t 'll",
]

CONTRACTIONS = [
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "'Re 'rE 'Ve 'vE 'Ll 'lL",
    "it's IT'S It'S don't DON'T Don'T we're WE'RE We'Re I've I'VE I'm I'M you'll YOU'LL he'd HE'D",
    "''s '''t 's's x's's 'sss 'tis 'twas rock'n'roll",
    "it’s don’t curly apostrophes",
    " 's ' s 's' \"'s\" ('ll) [ve] 'd'd'd",
    "'", "''", "'a 'b 'x 'z 'é 'ß '1 '2",
]

EOT_CASES = [
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|endoftext|> ",
    "Hello world<|endoftext|>The next document", "<|endoftext|", "<|endoftext|>>", "<<|endoftext|>",
    "foo<|endoftext|>bar<|endoftext|>", "<|ENDOFTEXT|>", "<| endoftext |>", "\n\n<|endoftext|>\n\n",
    "<|endoftext|><|endoftext|", "< |endoftext|>",
]

CONTROL = [
    "bell\x07back\x08esc\x1b[31mred\x1b[0m del\x7f", "zero\u200bwidth\u200cnon\u200djoiner\u2060wj",
    "\ufeffBOM at start", "soft\u00adhyphen", "c1 \u0080\u0085\u009f controls", "rtl \u202eevil\u202c mark \u200f\u200e",
    "private \ue000\uf8ff use", "replacement \ufffd char", "noncharacters \ufdd0 \uffff",
    "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐁𝐨𝐥𝐝 𐍈 𓀀 𠜎𠜱",
]

# Raw bytes: invalid UTF-8 and NULs. The references see them through errors="replace".
RAW = [
    b"a\x00b", b"\x00", b"\x00" * 10, b"nul \x00 inside \x00\x00 words\x00",
    b"\x80", b"\xbf\x80", b"lone \x80 continuation", b"\xc0\x80 overlong nul", b"\xc1\xbf",
    b"\xe0\x80\x80 overlong 3", b"\xe0\x9f\xbf", b"\xed\xa0\x80 surrogate", b"\xed\xbf\xbf",
    b"\xf4\x90\x80\x80 too big", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe\xff",
    b"truncated at end \xe2\x82", b"truncated \xe2\x82 middle", b"\xe2\x82\x41", b"\xf0\x9f\x98 emoji cut",
    b"\xf0\x9f\x98\x80\xf0\x9f\x98", b"\xf0\x9f", b"\xf0", b"\xc3", b"\xc3\x28", b"\xa0\xa1",
    b"mixed \xff valid \xc3\xa9 invalid \xc3 and \xe2\x82\xac euro", b"\xef\xbb\xbf\xff\xfe\xfd",
    b"latin1 caf\xe9 na\xefve", b"\xf1\x80\x80\xe1\x80\xc2 runs of subparts",
]


def random_cases(rng):
    """Random mixes of characters from long-stable Unicode blocks (assigned long before Unicode 14,
    so that PCRE2's and the references' tables agree on them)."""
    ranges = [(0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E), (0xA0, 0xFF), (0x100, 0x17F), (0x391, 0x3C9),
              (0x410, 0x44F), (0x5D0, 0x5EA), (0x621, 0x64A), (0x660, 0x669), (0x905, 0x939), (0x966, 0x96F),
              (0xE01, 0xE30), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
              (0x2000, 0x206F), (0x1F600, 0x1F64F), (0x1F300, 0x1F3FF), (0x300, 0x36F), (0x30, 0x39), (0xFF10, 0xFF5A)]
    out = []
    for i in range(20):
        n = rng.randint(1, 50)
        s = []
        for _ in range(n):
            lo, hi = rng.choice(ranges)
            s.append(chr(rng.randint(lo, hi)))
            if rng.random() < 0.15:
                s.append(rng.choice([" ", "  ", "\n", "\t", "'s", "'LL", " '", "\r\n"]))
        out.append((f"random_{i}", "".join(s)))
    return out


def long_cases(rng):
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(500))
    digits = "".join(rng.choice("0123456789") for _ in range(500))
    return [
        ("long_a", "a" * 600),
        ("long_random_letters", letters),
        ("long_random_digits", digits),
        ("long_digit_cycle", "1234567890" * 30),
        ("long_word_repeated", "supercalifragilisticexpialidocious" * 15),
        ("long_spaces_then_word", " " * 300 + "word"),
        ("long_newlines", "\n" * 100 + "x" + "\n" * 100),
        ("long_punct", "!?" * 100 + "=-" * 100),
        ("long_cjk", "東京大阪京都" * 20),
        ("long_emoji", "🙂" * 60),
        ("long_mixed_run", ("x1Y2" * 40) + ("é" * 60) + ("٣" * 60)),
        ("long_spaces_mid", "a" + " " * 200 + "b" + "\t" * 40 + "\n"),
    ]


def corpus():
    rng = random.Random(1234)
    cases = [("prose", PROSE), ("code_c", CODE_C), ("code_py", CODE_PY), ("code_js", CODE_JS),
             ("markdown", MARKDOWN), ("json", JSON_TEXT)]
    cases += list(SCRIPTS.items())
    for group, texts in [("combining", COMBINING), ("emoji", EMOJI), ("whitespace", WHITESPACE),
                         ("contraction", CONTRACTIONS), ("eot", EOT_CASES), ("control", CONTROL), ("raw", RAW)]:
        cases += [(f"{group}_{i}", t) for i, t in enumerate(texts)]
    cases += long_cases(rng)
    cases += random_cases(rng)
    return cases


# ----------------------------------------------------------------------------
# Writing the fixtures

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "cases.jsonl"))
    args = ap.parse_args()
    enc, hf = tiktoken_encoding(), hf_tokenizer()
    disagree = []
    with open(args.out, "w", encoding="utf-8") as f:
        for name, t in corpus():
            raw = t if isinstance(t, bytes) else t.encode("utf-8")
            text = raw.decode("utf-8", errors="replace")
            replaced = text.count("\ufffd") - raw.count("\ufffd".encode("utf-8"))
            ids_tt = enc.encode(text, allowed_special="all")
            ids_hf = hf.encode(text, add_special_tokens=False).ids
            assert enc.decode_bytes(ids_tt) == text.encode("utf-8"), name
            case = {"name": name}
            if isinstance(t, bytes) or "\0" in t:
                case["hex"] = raw.hex()
            else:
                case["text"] = t
            case.update(replaced=replaced, tiktoken=ids_tt, hf=ids_hf)
            if ids_tt != ids_hf:
                disagree.append(name)
            f.write(json.dumps(case, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}; tiktoken and HF disagree on {len(disagree)} cases: {disagree}")


if __name__ == "__main__":
    sys.exit(main())
