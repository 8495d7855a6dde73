#!/usr/bin/env python3
"""How well a MoE layer's experts are predicted from the layer's input (the guess behind LING_PREDICT), measured on a
checkpoint with the PyTorch reference (tools/oracle/ling_ref.py), on the CPU.

The router of layer l reads RMSNorm(h + attn(h)) * w_post. The guess reads what the layer's first launch stages,
x^ = RMSNorm(h) * w_in, through P = W_router * (w_post / w_in) per column (0 where w_in is 0): the attention's
addition to the residual stream is what it leaves out. Reported per layer and in all, for every token of the prompts
and of their greedy continuations:
  hits    the real picks that the guess also picked (the look-ahead's L2 hits), over all real picks;
  fp8     the same with P rounded to block FP8 as the CUDA model stores it (route_predict.cuh), when asked;
  chance  top_k / experts, the rate of a guess that knows nothing.

Usage: python3 tools/perf/predict_hits.py --model models/ling-gsm8k [--prompt TEXT ...] [--steps 48] [--fp8]
       python3 tools/perf/predict_hits.py --random-config tests/data/ling3-flash-config/config.json --layers 6
A random model at a config's widths (--random-config: make_testdata's weight distributions, the config cut to
--layers layers and a 4096-token vocabulary; the routed experts drawn as 16 distinct weight sets shared round robin so
that 512 experts fit in memory, each MoE layer's router and bias its own) asks how the selection's shape (8 of 512 in
groups, against 4 of 16) changes the rate. It is not Ling's rate either.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import ling_ref  # noqa: E402
import make_testdata  # noqa: E402

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
    "did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. Her parents "
    "decided to give her $15 for that purpose, and her grandparents twice as much as her parents. How much more money "
    "does Betty need to buy the wallet?",
]


def chat(q: str) -> str:  # docs/default-model.md "Chat format"
    return ("<role>SYSTEM</role>detailed thinking on<|role_end|><role>HUMAN</role>" + q +
            "<|role_end|><role>ASSISTANT</role>")


class Counter:
    def __init__(self):
        self.hits, self.fp8, self.picks = {}, {}, {}

    def add(self, layer, real, guess, guess8):
        for t in range(real.shape[0]):
            r = set(real[t].tolist())
            self.picks[layer] = self.picks.get(layer, 0) + len(r)
            self.hits[layer] = self.hits.get(layer, 0) + len(r & set(guess[t].tolist()))
            if guess8 is not None:
                self.fp8[layer] = self.fp8.get(layer, 0) + len(r & set(guess8[t].tolist()))


def folded(model, i):
    w = model.w
    p = f"model.layers.{i}."
    w_in, w_post = w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"]
    ratio = torch.where(w_in != 0, w_post / torch.where(w_in != 0, w_in, torch.ones_like(w_in)), torch.zeros_like(w_in))
    return ratio


def guess_route(model, i, u, router):
    """model.route with the router rows replaced by `router` (the input u is x^)."""
    key = f"model.layers.{i}.mlp.gate.weight"
    saved = model.w[key]
    model.w[key] = router
    try:
        return model.route(i, u)[0]
    finally:
        model.w[key] = saved


def forward_counting(model, tokens, cache, counter, fp8_rows):
    """ling_ref.Model.forward, counting each MoE layer's guess against its real picks."""
    c, w = model.cfg, model.w
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    pos0 = cache.pos
    x = w["model.word_embeddings.weight"][tokens]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        u = ling_ref.rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
        mix = model.mla(i, u, cache, pos0) if c.layer_types[i] == "mla" else model.kda(i, u, cache)
        h = x + mix
        xin = ling_ref.rms_norm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        if c.mlp_types[i] == "moe":
            real = model.route(i, xin)[0]
            router = w[p + "mlp.gate.weight"]
            guess = guess_route(model, i, u, router * folded(model, i))
            guess8 = guess_route(model, i, u, fp8_rows[i]) if fp8_rows is not None else None
            counter.add((i, c.layer_types[i]), real, guess, guess8)
        x = h + model.ffn(i, xin)
    cache.pos += len(tokens)
    hn = ling_ref.rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
    return hn @ w["lm_head.weight"].T


def random_model(config_json: str, layers: int, seed: int):
    """A random Model at the config's widths (see the usage above)."""
    cfg = json.load(open(config_json))
    cfg["num_hidden_layers"] = layers
    cfg["num_nextn_predict_layers"] = 0
    cfg["vocab_size"] = 4096
    for k in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        if isinstance(cfg.get(k), list):
            cfg[k] = cfg[k][:layers]
    pool = 16
    small = dict(cfg, num_experts=pool, n_group=1, topk_group=1, num_experts_per_tok=1)
    w = make_testdata.ling_weights(small, seed)
    c = ling_ref.RefConfig.from_dict(cfg)
    init = make_testdata.Init(seed + 1)
    D, E = c.hidden_size, c.num_experts
    for i in range(layers):
        if c.mlp_types[i] != "moe":
            continue
        p = f"model.layers.{i}.mlp."
        w[p + "gate.weight"] = init.lin(E, D, gain=1.5)
        w[p + "gate.expert_bias"] = init.normal(E, std=0.1)
        for e in range(pool, E):
            for n in ("gate_proj", "up_proj", "down_proj"):
                w[p + f"experts.{e}.{n}.weight"] = w[p + f"experts.{e % pool}.{n}.weight"]
    return ling_ref.Model(c, w)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint directory")
    ap.add_argument("--random-config", help="config.json of a random model instead of --model")
    ap.add_argument("--layers", type=int, default=6, help="--random-config: layers kept")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prompt", action="append", help="question text (chat format applied); default: 3 GSM8K ones")
    ap.add_argument("--tokens", help="comma-separated token ids instead of prompts (checkpoints without a tokenizer)")
    ap.add_argument("--steps", type=int, default=48, help="greedy tokens after each prompt")
    ap.add_argument("--fp8", action="store_true", help="also the guess with P in block FP8 (as the CUDA model)")
    a = ap.parse_args()

    if bool(a.model) == bool(a.random_config):
        ap.error("give --model or --random-config")
    model = ling_ref.load_model(a.model) if a.model else random_model(a.random_config, a.layers, a.seed)
    name = a.model or f"random model at {a.random_config}'s widths, {a.layers} layers, seed {a.seed}"
    c = model.cfg
    fp8_rows = None
    if a.fp8:
        fp8_rows = {}
        for i in range(c.num_hidden_layers):
            if c.mlp_types[i] == "moe":
                p = model.w[f"model.layers.{i}.mlp.gate.weight"] * folded(model, i)
                q, s = ling_ref.quant_fp8_block(p)
                fp8_rows[i] = ling_ref.dequant_fp8_block(q, s).to(model.dtype)
    if a.tokens:
        runs = [[int(t) for t in a.tokens.split(",")]]
    elif a.random_config:
        g = torch.Generator().manual_seed(a.seed)
        runs = [torch.randint(0, c.vocab_size, (16,), generator=g).tolist() for _ in range(2)]
    else:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
        runs = [tok.encode(chat(q)).ids for q in (a.prompt or PROMPTS)]

    counter = Counter()
    with torch.no_grad():
        for ids in runs:
            cache = ling_ref.Cache()
            logits = forward_counting(model, ids, cache, counter, fp8_rows)
            for _ in range(a.steps):
                nxt = int(logits[-1].argmax())
                logits = forward_counting(model, [nxt], cache, counter, fp8_rows)

    k, e = c.num_experts_per_tok, c.num_experts
    print(f"{name}: {len(runs)} prompt(s) + {a.steps} greedy tokens each; top {k} of {e} experts "
          f"(chance {100.0 * k / e:.1f}%)")
    print("| layer | mixer | picks | predicted | rate |" + (" FP8 P rate |" if a.fp8 else ""))
    print("|---:|---|---:|---:|---:|" + ("---:|" if a.fp8 else ""))
    tot = {"picks": 0, "hits": 0, "fp8": 0}
    kda = {"picks": 0, "hits": 0, "fp8": 0}
    for key in sorted(counter.picks):
        n, h = counter.picks[key], counter.hits[key]
        f = counter.fp8.get(key, 0)
        for d in (tot,) + ((kda,) if key[1] == "kda" else ()):
            d["picks"] += n
            d["hits"] += h
            d["fp8"] += f
        print(f"| {key[0]} | {key[1]} | {n} | {h} | {100.0 * h / n:.1f}% |" + (f" {100.0 * f / n:.1f}% |" if a.fp8 else ""))
    for name, d in (("KDA layers (where LING_PREDICT runs)", kda), ("all MoE layers", tot)):
        if d["picks"]:
            line = f"{name}: {d['hits']} of {d['picks']} picks predicted ({100.0 * d['hits'] / d['picks']:.1f}%)"
            if a.fp8:
                line += f"; FP8 P {100.0 * d['fp8'] / d['picks']:.1f}%"
            print(line)


if __name__ == "__main__":
    main()
