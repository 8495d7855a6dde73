"""Cross-checks ling_ref's pieces against independent implementations in HF transformers, and its quantizers
against their definitions. Prints one line per check with the relative L2 error; exits 1 if any fails.

    python tools/oracle/check_ref.py [--data tests/data]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ling_ref as R  # noqa: E402

FAILS = []


def report(name, err, tol):
    ok = err <= tol
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {err:.3e} (tol {tol:g})")
    if not ok:
        FAILS.append(name)


def check_mla_vs_deepseek(model: R.Model, layer: int):
    """Naive MLA with q LoRA + interleaved RoPE vs transformers' DeepseekV3Attention (no output gate there)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding
    c = model.cfg
    hc = DeepseekV3Config(hidden_size=c.hidden_size, num_attention_heads=c.mla_heads, num_key_value_heads=c.mla_heads,
                          q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim,
                          qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim, rope_interleave=True,
                          rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps, attention_bias=False,
                          max_position_embeddings=4096)
    hc._attn_implementation = "eager"
    att = DeepseekV3Attention(hc, 0).double()
    p = f"model.layers.{layer}.attention."
    sd = {k[len(p):]: v for k, v in model.w.items() if k.startswith(p)}
    sd["o_proj.weight"] = sd.pop("dense.weight")
    sd.pop("g_proj.weight", None)
    att.load_state_dict({k: v.double() for k, v in sd.items()}, strict=True)
    for m in (att.q_a_layernorm, att.kv_a_layernorm):
        if m is not None:
            m.variance_epsilon = c.mla_latent_eps
    rot = DeepseekV3RotaryEmbedding(hc)
    T = 37
    g = torch.Generator().manual_seed(5)
    u = torch.randn(T, c.hidden_size, generator=g, dtype=torch.float64)
    pos = torch.arange(T)[None]
    cos, sin = rot(u[None], pos)
    mask = torch.full((T, T), -math.inf, dtype=torch.float64).triu(1)[None, None]
    ref, _ = att(u[None], (cos.double(), sin.double()), mask)
    saved = c.output_gate
    c.output_gate = None
    try:
        mine = model.mla(layer, u.to(model.dtype), R.Cache(), 0)
    finally:
        c.output_gate = saved
    report(f"MLA (q LoRA, interleaved RoPE) layer {layer} vs DeepseekV3Attention", R.rel_l2(mine, ref[0].detach()), 1e-6)  # HF builds cos/sin in fp32


def check_router_vs_deepseek(model: R.Model, layer: int):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    c = model.cfg
    hc = DeepseekV3Config(hidden_size=c.hidden_size, n_routed_experts=c.num_experts,
                          num_experts_per_tok=c.num_experts_per_tok, n_group=c.n_group, topk_group=c.topk_group,
                          norm_topk_prob=c.norm_topk_prob, routed_scaling_factor=c.routed_scaling_factor)
    r = DeepseekV3TopkRouter(hc).double()
    p = f"model.layers.{layer}.mlp.gate."
    r.weight.data.copy_(model.w[p + "weight"].double())
    r.e_score_correction_bias.copy_(model.w[p + "expert_bias"].double())
    g = torch.Generator().manual_seed(6)
    x = torch.randn(200, c.hidden_size, generator=g, dtype=torch.float64)
    _, wt, idx = r(x)
    mi, mw = model.route(layer, x.to(model.dtype))
    # compare as dense [T, E] weight maps (selection order is irrelevant)
    a = torch.zeros(200, c.num_experts, dtype=torch.float64).scatter_(1, idx, wt.detach().double())
    b = torch.zeros(200, c.num_experts, dtype=torch.float64).scatter_(1, mi, mw.double())
    report(f"grouped router layer {layer} (n_group {c.n_group}) vs DeepseekV3TopkRouter (HF in fp32)", R.rel_l2(b, a), 1e-6)


def check_kda_vs_kimi_functions():
    """Our recurrent and chunked KDA vs transformers' Kimi reference functions, with a safe (bounded) gate."""
    from transformers.models.kimi_linear.modeling_kimi_linear import (chunk_kimi_delta_attention,
                                                                      recurrent_kimi_delta_attention)
    g = torch.Generator().manual_seed(7)
    T, H, K = 150, 3, 16
    q, k, v = (torch.randn(T, H, K, generator=g, dtype=torch.float64) for _ in range(3))
    beta = torch.sigmoid(torch.randn(T, H, generator=g, dtype=torch.float64))
    A = torch.exp(torch.log(torch.rand(H, generator=g, dtype=torch.float64) * 15 + 1))
    gate = -5.0 * torch.sigmoid(A[None, :, None] * 0.5 * torch.randn(T, H, K, generator=g, dtype=torch.float64))
    qn, kn = R.l2norm(q) * K ** -0.5, R.l2norm(k)
    S0 = torch.zeros(H, K, K, dtype=torch.float64)
    o_rec, S_rec = R.kda_recurrent(qn, kn, v, gate, beta, S0)
    o_chk, S_chk = R.kda_chunked(qn, kn, v, gate, beta, S0)
    ho, hS = recurrent_kimi_delta_attention(q[None], k[None], v[None], gate[None], beta[None], None, True,
                                            use_qk_l2norm_in_kernel=True)
    co, cS = chunk_kimi_delta_attention(q[None], k[None], v[None], gate[None], beta[None], initial_state=None,
                                        output_final_state=True, use_qk_l2norm_in_kernel=True)
    report("KDA recurrent (spec pseudo-code) vs HF recurrent_kimi_delta_attention (HF in fp32)", R.rel_l2(o_rec, ho[0]), 1e-5)
    report("KDA chunked (WY/UT) vs HF chunk_kimi_delta_attention (HF in fp32)", R.rel_l2(o_chk, co[0]), 1e-5)
    report("KDA chunked vs recurrent (T=150, 3 chunks), output", R.rel_l2(o_chk, o_rec), 1e-12)
    report("KDA chunked vs recurrent, final state", R.rel_l2(S_chk, S_rec), 1e-12)
    report("KDA final state vs HF (fp32)", R.rel_l2(S_rec, hS[0]), 1e-5)


def check_quantizers(data_dir):
    g = torch.Generator().manual_seed(8)
    # FP8 block: partial edges, scale layout, bounded error, ue8m0 powers of two
    w = torch.randn(200, 300, generator=g) * 0.05
    w[5, 7] = 3.0  # one outlier block
    for ue in (False, True):
        q, s = R.quant_fp8_block(w, ue8m0=ue)
        assert s.shape == (2, 3) and q.dtype == torch.float8_e4m3fn
        d = R.dequant_fp8_block(q, s)
        if ue:
            assert torch.all(torch.log2(s) == torch.round(torch.log2(s))), "ue8m0 scales must be powers of two"
        report(f"FP8 block quant/dequant round trip (ue8m0={ue}) rel err", R.rel_l2(d, w), 0.05)
        blk_amax = (q.float().abs().view(-1)).max().item()
        assert blk_amax <= 448.0
    # MXFP4: exact values survive; ties go to the even code; saturation at 6
    vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0])
    row = torch.cat([vals, torch.zeros(22)])[None]
    pk, sc = R.quant_mxfp4(row)
    report("MXFP4 exact E2M1 values round trip", R.rel_l2(R.dequant_mxfp4(pk, sc), row), 0.0)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -2.5, 6.0] + [0.0] * 23)[None]
    got = R.dequant_mxfp4(*R.quant_mxfp4(ties))[0, :9]
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -2.0, 6.0])
    report("MXFP4 ties to even code", R.rel_l2(got, want), 0.0)
    w = torch.randn(64, 96, generator=g)
    pk, sc = R.quant_mxfp4(w)
    report("MXFP4 quant/dequant round trip rel err", R.rel_l2(R.dequant_mxfp4(pk, sc), w), 0.2)
    # our dequant vs the gpt-oss MXFP4 dequant in transformers (independent nibble-order / E8M0 convention)
    try:
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
        blocks = pk.view(torch.uint8).view(1, 64, 3, 16)
        scales = sc.view(1, 64, 3)
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)[0].T  # returns [E, in, out]
        report("MXFP4 dequant vs transformers gpt-oss convert_moe_packed_tensors", R.rel_l2(R.dequant_mxfp4(pk, sc),
                                                                                           theirs), 0.0)
    except ImportError as e:
        print("skip gpt-oss MXFP4 check:", e)
    # the stored fp4 set: experts decode to the MXFP4 grid, scales are E8M0
    p = os.path.join(data_dir, "ling-a-fp4")
    if os.path.isdir(p):
        raw = R.read_safetensors_dir(p)
        k = "model.layers.1.mlp.experts.0.gate_proj.weight"
        bf = R.read_safetensors_dir(os.path.join(data_dir, "ling-a-bf16"))[k].float()
        pk2, sc2 = R.quant_mxfp4(bf)
        same = torch.equal(pk2, raw[k]) and torch.equal(sc2, raw[k + "_scale_inv"])
        report("ling-a-fp4 expert bytes = quant_mxfp4(ling-a-bf16 weight)", 0.0 if same else 1.0, 0.0)


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", default=os.path.join(here, "..", "..", "tests", "data"))
    a = ap.parse_args()
    m = R.load_model(os.path.join(a.data, "ling-a-bf16"), dtype=torch.float64)
    check_mla_vs_deepseek(m, 2)
    check_mla_vs_deepseek(m, 6)  # the MTP layer's MLA
    check_router_vs_deepseek(m, 1)
    check_kda_vs_kimi_functions()
    check_quantizers(a.data)
    print("FAILED: " + ", ".join(FAILS) if FAILS else "all checks passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
