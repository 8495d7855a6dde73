#!/usr/bin/env python3
"""Writes the tokenizer test data under tests/data/tokenizer/ with the HF `tokenizers` package (CPU, seconds).

Three small byte-level BPE tokenizers (vocab ~2000) are trained on GSM8K train questions/answers plus a little
multilingual text written here, and for each one the ids HF gives for a mixed set of test strings:

  tokenizer.json          Ling-family layout: Sequence[Split(Ling regex, Isolated), ByteLevel(use_regex=false)],
                          merges stored as ["a","b"] pairs          -> cases.jsonl
  tokenizer_gpt2.json     GPT-2 layout: ByteLevel(use_regex=true), merges rewritten as "a b" strings
                                                                     -> cases_gpt2.jsonl
  tokenizer_gpt2_prefix.json  the GPT-2 one with add_prefix_space=true, ignore_merges=true and an lstrip/rstrip
                          added token                                -> cases_gpt2_prefix.jsonl

Each case line: {"text": str, "ids": [...], "ids_no_special": [...]} where ids_no_special is HF's result with
`encode_special_tokens = True` (special added tokens are not split out), or {"bytes_hex": hex, "ids": [...]} for
invalid UTF-8 input, whose expected ids are HF's ids for bytes.decode("utf-8", "replace") (the policy of
ling::io::Tokenizer, see docs/text.md).

Run from the repository root:  python3 tools/tokenizer/make_testdata.py
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
GSM8K = os.path.join(ROOT, "..", "shared", "data", "gsm8k", "train.jsonl")
if not os.path.exists(GSM8K):
    GSM8K = "/work/shared/data/gsm8k/train.jsonl"

# The Ling / Bailing pre-tokenizer split regex, as quoted ("original regex from tokenizer.json") in llama.cpp
# src/llama-vocab.cpp, case LLAMA_VOCAB_PRE_TYPE_BAILINGMOE. GPT-4-like, but \p{N} is one digit at a time.
LING_REGEX = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""

SPECIALS = ["<|endoftext|>", "<role>", "</role>", "<|role_end|>", "<think>", "</think>"]

MULTILINGUAL = [
    "Le chat noir dort sur le canapé. Où est la bibliothèque ? Ça coûte 12,50 €.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Ärger.",
    "El niño comió una manzana. ¿Dónde está la estación? ¡Qué día tan bonito!",
    "Быстрая коричневая лиса прыгает через ленивую собаку. Сколько будет два плюс два?",
    "小明有三个苹果，他又买了五个。他现在一共有几个苹果？答案是八个。",
    "今日はいい天気ですね。りんごを三つ買いました。カタカナとひらがな。",
    "나는 사과를 좋아합니다. 서울은 한국의 수도입니다.",
    "مرحبا بالعالم. كم عدد التفاحات؟ القطة تنام على الأريكة.",
    "नमस्ते दुनिया। मेरे पास पाँच सेब हैं। आप कैसे हैं?",
    "Γεια σου κόσμε. Η γάτα κοιμάται.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n\tprint(i, add(i, 2))\n",
    "int main() { std::vector<int> v{1, 2, 3}; return v.size() > 2 ? 0 : 1; }\n",
    "Emoji: 😀 😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ — and math: ∑ x² ≤ ∞, π ≈ 3.14159.",
]

CASES = [
    "Hello world",
    "Hello, world! How are you today?",
    "",
    " ",
    "   leading spaces and trailing   ",
    "multiple\n\nnewlines\n\n\n",
    "trailing newline\n",
    "\n\n\nleading newlines",
    "tabs\tand\t\ttabs\t",
    "mixed \t \n \r\n whitespace  \n",
    "a  b   c    d",
    "Digits 0123456789 and a long number 3141592653589793238462643383279",
    "Prices: $1,234.56, 7% off, 1e-9, 0x1F, 12:30pm, 2024-05-17.",
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
    "I'm sure you'll see they've said we'd done it. DON'T SHOUT, IT'S LOUD. He's here.",
    "小明有三个苹果，他又买了五个。他现在一共有几个苹果？",
    "日本語のテキストと English mixed テキスト。",
    "한국어 텍스트입니다.",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 heart ❤️ end",
    "Combining: e\u0301 a\u0300 n\u0303 o\u0308\u0304 Z\u0335\u0321\u0322a\u0336lgo",
    "Arabic: مرحبا بالعالم ١٢٣",
    "Hindi: नमस्ते दुनिया १२३",
    "Special <role>HUMAN</role>What is 2+2?<|role_end|><role>ASSISTANT</role>",
    "<|endoftext|>",
    "<role><role></role>",
    "text<|endoftext|>more text<think>reasoning</think>answer",
    "almost special <role HUMAN> and <|role_end| and <thinking>",
    "<role>SYSTEM</role>detailed thinking on<|role_end|><role>HUMAN</role>Janet has 3 apples.<|role_end|>"
    "<role>ASSISTANT</role>\n<think>\nShe has 3.\n</think>\n\nThe answer is 3.<|role_end|>",
    "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
    "Symbols ~!@#$%^&*()_+-={}[]|\\:;\"'<>,.?/ end",
    "Ünïcödé àccents ñ ç ß æ ø å œ",
    "\u00a0non-breaking\u00a0space and\u2003em space and\u3000ideographic",
    "zero\u200bwidth\u200cjoiner\u200d",
    "line1\r\nline2\rline3\n",
    "'s 's 'S 'll 'LL 'Ve 're 'd 'm 't",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "How many clips did Natalia sell altogether in April and May?",
    "   \n   \n",
    "x" * 3 + " " * 7 + "y",
    "\U0001F600\U0001F600\U0001F600",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 letters",
    # long runs: BPE over long words, long whitespace and digit runs, a long special-token sequence
    "a" * 3000 + " " * 2000 + "9" * 500 + "\n" * 300 + "的" * 400 + "<role>" * 50 + "xy" * 700,
]

# Invalid UTF-8 inputs: expected ids are HF's for bytes.decode("utf-8", "replace").
INVALID = [
    b"abc\xffdef",
    b"\x80\x80 lone continuation",
    b"truncated \xe4\xb8",
    b"\xe4\xb8 middle \xf0\x9f\x98 end",
    b"overlong \xc0\xaf and surrogate \xed\xa0\x80 x",
    b"\xf5\xf6\xf7\xf8\xf9\xfa\xfb\xfc\xfd\xfe\xff",
    b"ok \xf0\x9f\x98\x80 then \xf0\x9f",
]


def corpus():
    lines = []
    with open(GSM8K, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 3000:
                break
            d = json.loads(line)
            lines.append(d["question"])
            lines.append(d["answer"])
    for _ in range(20):
        lines.extend(MULTILINGUAL)
    return lines


def train(pre_tokenizer, vocab_size=2000):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    # Special tokens after the learned vocabulary, as in the real Ling tokenizer (ids at the end).
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def random_strings(n, seed):
    rng = random.Random(seed)
    pool = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"-\n\t  "
            "éüßñçøЖжπλ中文字日本語한국어عربيहिन्दी😀👍🏽\u200d\u0301")
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        out.append("".join(rng.choice(pool) for _ in range(k)))
    return out


def write_cases(tok, path, texts):
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            tok.encode_special_tokens = False
            ids = tok.encode(t, add_special_tokens=False).ids
            tok.encode_special_tokens = True
            ids_ns = tok.encode(t, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            # decode(encode(s)) must give s back for these tokenizers (no normalizer)
            assert tok.decode(ids, skip_special_tokens=False) == t, t
            f.write(json.dumps({"text": t, "ids": ids, "ids_no_special": ids_ns}, ensure_ascii=False) + "\n")
        for b in INVALID:
            t = b.decode("utf-8", "replace")
            ids = tok.encode(t, add_special_tokens=False).ids
            f.write(json.dumps({"bytes_hex": b.hex(), "ids": ids, "replaced": t}, ensure_ascii=False) + "\n")
        # decode checks: HF decode of arbitrary id lists (may split characters) with and without skip_special
        rng = random.Random(7)
        n_vocab = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(40):
            ids = [rng.randrange(n_vocab) for _ in range(rng.randint(1, 12))]
            f.write(json.dumps({"decode_ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                                "decoded_skip": tok.decode(ids, skip_special_tokens=True)},
                               ensure_ascii=False) + "\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    texts = CASES + random_strings(60, seed=1234)

    ling = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LING_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ]))
    ling.save(os.path.join(OUT, "tokenizer.json"))
    write_cases(ling, os.path.join(OUT, "cases.jsonl"), texts)

    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    path = os.path.join(OUT, "tokenizer_gpt2.json")
    gpt2.save(path)
    # Rewrite merges in the older "a b" string form so that both forms are exercised.
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)
    gpt2 = Tokenizer.from_file(path)
    write_cases(gpt2, os.path.join(OUT, "cases_gpt2.jsonl"), texts)

    # Prefix-space + ignore_merges variant, with a non-special added token that strips whitespace around it.
    j["pre_tokenizer"]["add_prefix_space"] = True
    j["model"]["ignore_merges"] = True
    path = os.path.join(OUT, "tokenizer_gpt2_prefix.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)
    pre = Tokenizer.from_file(path)
    pre.add_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True, special=False, normalized=False)])
    pre.save(path)
    pre = Tokenizer.from_file(path)
    extra = ["a [MASK] b", "[MASK]", "x  [MASK]  y", "  [MASK]\n\nz"]
    # prefix-space decode does not round-trip (the added space stays), so write these cases without the assert
    with open(os.path.join(OUT, "cases_gpt2_prefix.jsonl"), "w", encoding="utf-8") as f:
        for t in texts + extra:
            ids = pre.encode(t, add_special_tokens=False).ids
            pre.encode_special_tokens = True
            ids_ns = pre.encode(t, add_special_tokens=False).ids
            pre.encode_special_tokens = False
            f.write(json.dumps({"text": t, "ids": ids, "ids_no_special": ids_ns}, ensure_ascii=False) + "\n")
    write_variants()
    print("wrote", OUT, file=sys.stderr)


# ---- variants of tokenizer.json for the less common paths: Split behaviors / invert, String patterns,
# single_word and normalized added tokens. Each line names the edits; the C++ test applies them to tokenizer.json.
SPLIT_TEXTS = ["Hello  world 123 abc", "  lead and trail  ", "a1b22c333", "x\n\ny\tz", "calc calculator recalc calc!",
               "(calc) _calc calc_ 1calc", "ünï calc ß", "", "   ", "no separators"]


def write_variants():
    base = json.load(open(os.path.join(OUT, "tokenizer.json"), encoding="utf-8"))
    variants = []
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            variants.append({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"\s+|\d"}, "behavior": behavior, "invert": invert},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}})
    variants.append({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}]}})
    for single_word, normalized in [(True, True), (True, False), (False, True)]:
        variants.append({"extra_added": [{"id": 2006, "content": "calc", "single_word": single_word, "lstrip": False,
                                          "rstrip": False, "normalized": normalized, "special": False}]})
    with open(os.path.join(OUT, "cases_variants.jsonl"), "w", encoding="utf-8") as f:
        for v in variants:
            j = json.loads(json.dumps(base))
            if "pre_tokenizer" in v:
                j["pre_tokenizer"] = v["pre_tokenizer"]
            for a in v.get("extra_added", []):
                j["added_tokens"].append(a)
            tok = Tokenizer.from_str(json.dumps(j))
            cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in SPLIT_TEXTS]
            f.write(json.dumps({"edit": v, "cases": cases}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
