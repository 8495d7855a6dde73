"""Train the byte-level BPE tokenizer of the embedded default model (docs/default-model.md).

Byte-level BPE (HF `tokenizers`) on GSM8K train.jsonl (MIT, openai/grade-school-math), vocab ~4096.
Pre-tokenizer: the Ling/Bailing split regex (as quoted from the Ling tokenizer.json in llama.cpp's
src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_BAILINGMOE) as a Split(Isolated), then ByteLevel(use_regex=False).
Special tokens are added tokens, so they are split off before the regex (spec §5).

    python3 tools/train/tokenizer.py --data ../shared/data/gsm8k --out models/ling-gsm8k
"""
import argparse
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

import chat

LING_SPLIT_REGEX = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
                    r"|\s*[\r\n]|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<role>", "</role>", "<|role_end|>", "<think>", "</think>"]


def build(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LING_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data/gsm8k")
    ap.add_argument("--out", default="models/ling-gsm8k")
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()
    rows = chat.load_jsonl(os.path.join(a.data, "train.jsonl"))
    texts = []
    for r in rows:  # the text the model sees, without the special markers (they are added tokens)
        sol, ans = chat.split_answer(r["answer"])
        texts += [r["question"], sol + "\nThe answer is " + ans + ".", "SYSTEM", "HUMAN", "ASSISTANT",
                  "detailed thinking on", "detailed thinking off"]
    tok = build(texts, a.vocab)
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|role_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": SPECIAL_TOKENS,
        "chat_template": chat.JINJA_TEMPLATE,
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    print("vocab", tok.get_vocab_size(), "specials", ids)
    s = chat.prompt("What is 2+3?", True) + chat.target("2+3 = 5", "5", True)
    enc = tok.encode(s)
    assert tok.decode(enc.ids, skip_special_tokens=False) == s, "round trip"
    print(len(enc.ids), enc.tokens[:40])


if __name__ == "__main__":
    main()
