"""kimi-bf16 test set: a tiny Kimi-Linear checkpoint written by HF transformers' own KimiLinearForCausalLM and the
logits of transformers' own forward (its torch fallback paths: no fla / CUDA kernels are needed on CPU).
Also cross-checks ling_ref on the same checkpoint (spec §3 Kimi names)."""
from __future__ import annotations

import json
import math
import os
import shutil

import torch
from safetensors.torch import save_file

import ling_ref as R

KIMI_CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
    norm_topk_prob=True, routed_scaling_factor=2.446,
    kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    linear_num_heads=2, linear_head_dim=16, linear_conv_kernel_dim=4,
    rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    max_position_embeddings=4096,
)


def _reinit(model, seed):
    """Replaces HF's std-0.02 init with scales that give non-degenerate logits; values rounded to bf16."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if name.endswith("A_log"):
                v = torch.log(torch.rand(shape, generator=g) * 15 + 1)
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.rand(shape, generator=g) * (math.log(1e-1) - math.log(1e-3)) + math.log(1e-3))
                v = dt + torch.log(-torch.expm1(-dt))  # inverse softplus, as FLA initialises it
            elif "norm" in name:
                v = 1 + 0.1 * torch.randn(shape, generator=g)
            elif "conv1d" in name:
                v = 0.5 * torch.randn(shape, generator=g)
            elif name.endswith("embed_tokens.weight"):
                v = torch.randn(shape, generator=g)
            else:
                fan_in = shape[-1]
                gain = 0.3 if "f_b_proj" in name else (2.0 if name == "lm_head.weight" else 1.2)
                v = torch.randn(shape, generator=g) * gain / math.sqrt(fan_in)
            p.copy_(v.to(torch.bfloat16).float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((0.1 * torch.randn(b.shape, generator=g)).to(torch.bfloat16).float())


def _cache_of(out):
    c = getattr(out, "cache", None)
    return c if c is not None else getattr(out, "past_key_values", None)


def make(out_dir, seed, T, N, dtype, report, version):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    torch.manual_seed(seed)
    cfg = KimiLinearConfig(**KIMI_CONFIG)
    model = KimiLinearForCausalLM(cfg).float().eval()
    _reinit(model, seed)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg.vocab_size, (T,), generator=g)
    ids = tokens[None]

    with torch.no_grad():
        # prefill with cache, then greedy decode one token at a time through the cache
        out = model(input_ids=ids, use_cache=True)
        prefill = out.logits[0].float()
        cache = _cache_of(out)
        nxt = int(prefill[-1].argmax())
        dec_tokens, dec_logits = [], []
        for _ in range(N):
            dec_tokens.append(nxt)
            o = model(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
            cache = _cache_of(o)
            dec_logits.append(o.logits[0, -1].float())
            nxt = int(o.logits[0, -1].argmax())
        dec_logits = torch.stack(dec_logits)
        # the same sequence in one full forward (no cache): HF's own chunked vs recurrent consistency
        full = model(input_ids=torch.tensor([tokens.tolist() + dec_tokens]), use_cache=False).logits[0].float()

    # bf16 storage (the values are exact bf16 already; router weight, bias and dt_bias stay F32 as HF keeps them)
    model_bf16 = model.to(torch.bfloat16)
    model_bf16.save_pretrained(out_dir, safe_serialization=True)
    model.float()

    stats = {"hf_cached_vs_full_prefill": R.rel_l2(prefill, full[:T]),
             "hf_cached_vs_full_decode": R.rel_l2(dec_logits, full[T:])}
    # ling_ref on the saved checkpoint (Kimi names of spec §3), float64 and float32
    for dt in (torch.float64, torch.float32):
        ref = R.load_model(out_dir, dtype=dt)
        o, s = R.reference_outputs(ref, tokens.tolist(), N, False)
        tag = str(dt).split(".")[-1]
        stats[f"ling_ref_{tag}_vs_hf_prefill"] = R.rel_l2(o["prefill_logits"], prefill)
        stats[f"ling_ref_{tag}_vs_hf_decode"] = R.rel_l2(o["decode_logits"], dec_logits)
        stats[f"ling_ref_{tag}_same_decode_tokens"] = o["decode_tokens"] == dec_tokens
        stats.update({f"ling_ref_{tag}_{k}": v for k, v in s.items()})
    t = {"tokens": tokens.to(torch.int32), "prefill_logits": prefill.contiguous(),
         "decode_tokens": torch.tensor(dec_tokens, dtype=torch.int32), "decode_logits": dec_logits.contiguous()}
    import transformers
    meta = {"seed": str(seed), "script_version": version, "set": "kimi-bf16",
            "oracle": f"transformers {transformers.__version__} KimiLinearForCausalLM forward, float32",
            "stats": json.dumps(stats)}
    save_file(t, os.path.join(out_dir, "expected.safetensors"), metadata=meta)
    R.canonicalize_safetensors_header(os.path.join(out_dir, "expected.safetensors"))
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    report["kimi-bf16"] = {"bytes": size, "stats": stats, "decode_tokens": dec_tokens}
    print("kimi-bf16", json.dumps(report["kimi-bf16"], indent=1), flush=True)
