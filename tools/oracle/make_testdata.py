"""Writes tests/data/<set>/ : tiny checkpoints (HF layout) and the outputs the reference computes from them.

    python tools/oracle/make_testdata.py [--out tests/data] [--sets ling-a-bf16,...] [--dtype float64]

Deterministic: every set draws from torch.Generator seeded with SEEDS[set]. Expected outputs are computed from
the DEQUANTIZED stored weights (what the file holds), in float64 by default, and stored as F32.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ling_ref as R  # noqa: E402

SCRIPT_VERSION = "make_testdata 1.0 / " + R.SCRIPT_VERSION
T_PROMPT = {"ling-a": 70, "ling-b": 67, "kimi": 66}
N_DECODE = 6
SEEDS = {"ling-a": 1234, "ling-b": 4321, "kimi": 777}

# --------------------------------------------------------------------------------------------------------------
# Configurations (spec §1 keys). The keys without effect are present as the real config has them.
# --------------------------------------------------------------------------------------------------------------


def ling_config(**kw) -> dict:
    base = {
        "architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid",
        "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "short_conv_kernel_size": 4,
        "rope_scaling": None, "rope_interleave": True, "partial_rotary_factor": 0.5, "use_bias": False,
        "use_qkv_bias": False, "use_qk_norm": False, "group_norm_size": 1, "linear_silu": False,
        "mtp_use_kda": False, "use_mla_nope": False, "torch_dtype": "bfloat16", "pad_token_id": 0,
        "eos_token_id": 1, "tie_word_embeddings": False, "max_position_embeddings": 4096,
    }
    base.update(kw)
    base["num_key_value_heads"] = base["num_attention_heads"]
    return base


LING_A = ling_config(
    # hidden 64 keeps 16 experts x 6 MoE layers within the size budget; partial multi-block FP8 edges come from
    # the dense MLP (160 x 64, 64 x 160), KDA/MLA widths 80/160/240 and q_b/kv_b rows.
    vocab_size=512, hidden_size=64, num_hidden_layers=6, layer_group_size=3,  # MLA at 2, 5; KDA at 0,1,3,4
    first_k_dense_replace=1, intermediate_size=160,
    num_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
    moe_intermediate_size=32, num_shared_experts=1, moe_shared_expert_intermediate_size=32,
    num_attention_heads=5, head_dim=16, no_kda_lora=True, kda_safe_gate=True, kda_lower_bound=-5.0,
    q_lora_rank=48, kv_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
    rope_theta=6000000.0, gated_attention_proj_granularity_type="head_wise", rms_norm_eps=1e-6,
    expert_swiglu_limit_list=[0.0, 0.75, 0.0, 1.0, 0.5, 0.0],        # MTP layer (6) is past the end: no clamp
    share_expert_swiglu_limit_list=[0.0, 0.0, 1.0, 0.0, 0.6, 0.8],
    num_nextn_predict_layers=1,
)

LING_B = ling_config(
    vocab_size=384, hidden_size=96, num_hidden_layers=4, layer_group_size=2,  # MLA at 1, 3
    first_k_dense_replace=1, intermediate_size=128,
    num_experts=16, num_experts_per_tok=4, n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.5,
    moe_intermediate_size=32, num_shared_experts=2, moe_shared_expert_intermediate_size=16,  # shared width 32
    num_attention_heads=3, head_dim=16, no_kda_lora=False, kda_safe_gate=True, kda_lower_bound=-4.0,
    q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=24, qk_rope_head_dim=8, v_head_dim=16,
    rope_theta=10000.0, gated_attention_proj_granularity_type="element_wise", rms_norm_eps=1e-5,
    expert_swiglu_limit_list=[0.0, 1.5, 0.5],                       # layer 3 past the end: no clamp
    share_expert_swiglu_limit_list=[0.0, 0.0, 0.6, 1.0],
    num_nextn_predict_layers=0,
)

# Ling-a siblings: which tensors stay unconverted (module names, as quantization_config lists them)
def not_converted(cfg: dict) -> list:
    L = cfg["num_hidden_layers"] + cfg.get("num_nextn_predict_layers", 0)
    mods = ["lm_head", "model.word_embeddings"]
    for i in range(L):
        if i >= cfg["first_k_dense_replace"]:
            mods.append(f"model.layers.{i}.mlp.gate")
    return mods


def is_matrix_to_convert(name: str, t: torch.Tensor) -> bool:
    """Every 2-D weight matrix except norms/conv/A_log/dt_bias/router gate/embeddings/lm_head."""
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    if name in ("lm_head.weight", "model.word_embeddings.weight") or name.endswith(".mlp.gate.weight"):
        return False
    if "norm" in name or "conv1d" in name:
        return False
    return True


# --------------------------------------------------------------------------------------------------------------
# Random Ling weights with sensible scales
# --------------------------------------------------------------------------------------------------------------


class Init:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, *shape, std=1.0, mean=0.0):
        return torch.randn(*shape, generator=self.g) * std + mean

    def uniform(self, *shape, lo=0.0, hi=1.0):
        return torch.rand(*shape, generator=self.g) * (hi - lo) + lo

    def lin(self, out, inn, gain=1.0):
        return self.normal(out, inn, std=gain / math.sqrt(inn))

    def norm(self, n):
        return self.normal(n, std=0.1, mean=1.0)


def ling_weights(cfg: dict, seed: int) -> dict:
    """Returns name -> float32 tensor (values later rounded to the storage dtype)."""
    I = Init(seed)
    c = R.RefConfig.from_dict(cfg)
    D, V = c.hidden_size, c.vocab_size
    w = {"model.word_embeddings.weight": I.normal(V, D, std=1.0),
         "model.norm.weight": I.norm(D),
         "lm_head.weight": I.lin(V, D, gain=2.0)}

    def mla(p):
        H, dn, dr, dv, r = c.mla_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        if c.q_lora_rank:
            w[p + "q_a_proj.weight"] = I.lin(c.q_lora_rank, D)
            w[p + "q_a_layernorm.weight"] = I.norm(c.q_lora_rank)
            w[p + "q_b_proj.weight"] = I.lin(H * (dn + dr), c.q_lora_rank, gain=1.5)
        else:
            w[p + "q_proj.weight"] = I.lin(H * (dn + dr), D, gain=1.5)
        w[p + "kv_a_proj_with_mqa.weight"] = I.lin(r + dr, D, gain=1.5)
        w[p + "kv_a_layernorm.weight"] = I.norm(r)
        w[p + "kv_b_proj.weight"] = I.lin(H * (dn + dv), r)
        if c.output_gate == "head_wise":
            w[p + "g_proj.weight"] = I.lin(H, D)
        elif c.output_gate == "element_wise":
            w[p + "g_proj.weight"] = I.lin(H * dv, D)
        w[p + "dense.weight"] = I.lin(D, H * dv, gain=0.7)

    def kda(p):
        H, K = c.kda_heads, c.kda_head_dim
        P = H * K
        for n in "qkv":
            w[p + f"{n}_proj.weight"] = I.lin(P, D)
        for n in "qkv":
            w[p + f"{n}_conv1d.weight"] = I.normal(P, 1, c.conv_kernel, std=0.5)
        if c.kda_lora:
            w[p + "f_a_proj.weight"] = I.lin(K, D)
            w[p + "f_b_proj.weight"] = I.lin(P, K, gain=0.3)
            w[p + "g_a_proj.weight"] = I.lin(K, D)
            w[p + "g_b_proj.weight"] = I.lin(P, K)
        else:
            w[p + "f_proj.weight"] = I.lin(P, D, gain=0.3)  # keeps exp(A)·(f+dt) out of full saturation
            w[p + "g_proj.weight"] = I.lin(P, D)
        w[p + "b_proj.weight"] = I.lin(H, D)
        w[p + "A_log"] = torch.log(I.uniform(H, lo=1.0, hi=16.0))
        w[p + "dt_bias"] = I.normal(P, std=0.1)
        w[p + "o_norm.weight"] = I.norm(K)
        w[p + "o_proj.weight"] = I.lin(D, P, gain=0.7)

    def mlp(p, width):
        w[p + "gate_proj.weight"] = I.lin(width, D, gain=1.5)
        w[p + "up_proj.weight"] = I.lin(width, D, gain=1.5)
        w[p + "down_proj.weight"] = I.lin(D, width, gain=0.7)

    def moe(p):
        w[p + "gate.weight"] = I.lin(c.num_experts, D, gain=1.5)
        w[p + "gate.expert_bias"] = I.normal(c.num_experts, std=0.1)
        for e in range(c.num_experts):
            mlp(p + f"experts.{e}.", c.moe_intermediate_size)
        if c.shared_width:
            mlp(p + "shared_experts.", c.shared_width)

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = I.norm(D)
        w[p + "post_attention_layernorm.weight"] = I.norm(D)
        (mla if c.layer_types[i] == "mla" else kda)(p + "attention.")
        if c.mlp_types[i] == "dense":
            mlp(p + "mlp.", c.intermediate_size)
        else:
            moe(p + "mlp.")
    for m in range(c.num_nextn_predict_layers):
        p = f"model.layers.{c.num_hidden_layers + m}."
        for n in ("input_layernorm", "post_attention_layernorm", "enorm", "hnorm", "final_layernorm"):
            w[p + n + ".weight"] = I.norm(D)
        w[p + "eh_proj.weight"] = I.lin(D, 2 * D)
        mla(p + "attention.")
        moe(p + "mlp.")
    return w


def to_storage_bf16(w: dict, fp32_names=(".mlp.gate.weight",)) -> dict:
    """BF16 storage; A_log, dt_bias, expert_bias (and the names in fp32_names) stay F32."""
    out = {}
    for k, v in w.items():
        keep32 = k.endswith(("A_log", "dt_bias", "expert_bias")) or any(k.endswith(s) for s in fp32_names)
        out[k] = v.float().contiguous() if keep32 else v.to(torch.bfloat16).contiguous()
    return out


def to_storage_fp8(bf16: dict, ue8m0: bool, mxfp4_experts: bool) -> dict:
    out = {}
    for k, v in bf16.items():
        if not is_matrix_to_convert(k, v):
            out[k] = v
            continue
        if mxfp4_experts and ".mlp.experts." in k:
            q, s = R.quant_mxfp4(v.float())
        else:
            q, s = R.quant_fp8_block(v.float(), ue8m0=ue8m0)
        out[k] = q.contiguous()
        out[k + "_scale_inv"] = s.contiguous()
    return out


# --------------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------------


def save_checkpoint(d: str, tensors: dict, cfg: dict, shards: int = 1):
    os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k] for k in names}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups, cur, acc = [], [], 0
    for k in names:  # a weight and its _scale_inv sort together, so they land in the same shard here
        cur.append(k)
        acc += tensors[k].numel() * tensors[k].element_size()
        if acc >= total * (len(groups) + 1) / shards and len(groups) < shards - 1 and not k.endswith("_proj.weight"):
            groups.append(cur)
            cur = []
    groups.append(cur)
    wm = {}
    for n, g in enumerate(groups):
        fn = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k] for k in g}, os.path.join(d, fn), metadata={"format": "pt"})
        wm.update({k: fn for k in g})
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)


def save_expected(d: str, out: dict, meta: dict):
    t = {"tokens": torch.tensor(out["tokens"], dtype=torch.int32),
         "prefill_logits": out["prefill_logits"].float().contiguous(),
         "decode_tokens": torch.tensor(out["decode_tokens"], dtype=torch.int32),
         "decode_logits": out["decode_logits"].float().contiguous()}
    if "mtp_logits" in out:
        t["mtp_logits"] = out["mtp_logits"].float().contiguous()
    save_file(t, os.path.join(d, "expected.safetensors"), metadata={k: str(v) for k, v in meta.items()})
    R.canonicalize_safetensors_header(os.path.join(d, "expected.safetensors"))


def dir_size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def run_ling_set(name, cfg, stored, tokens, seed, out_root, dtype, report):
    d = os.path.join(out_root, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    shards = 2 if name.endswith("-fp8") else 1
    save_checkpoint(d, stored, cfg, shards)
    model = R.load_model(d, dtype=dtype)  # reads back what was written: expected = f(stored weights)
    out, stats = R.reference_outputs(model, tokens, N_DECODE, cfg.get("num_nextn_predict_layers", 0) > 0)
    m32 = R.load_model(d, dtype=torch.float32)
    out32, stats32 = R.reference_outputs(m32, tokens, N_DECODE, cfg.get("num_nextn_predict_layers", 0) > 0)
    stats = {**{k + "_" + str(dtype).split(".")[-1]: v for k, v in stats.items()},
             **{k + "_float32": v for k, v in stats32.items()},
             "float32_vs_oracle_prefill": R.rel_l2(out32["prefill_logits"], out["prefill_logits"]),
             "float32_same_decode_tokens": out32["decode_tokens"] == out["decode_tokens"]}
    if "mtp_logits" in out:
        stats["float32_vs_oracle_mtp"] = R.rel_l2(out32["mtp_logits"], out["mtp_logits"])
    save_expected(d, out, {"seed": seed, "script_version": SCRIPT_VERSION, "set": name,
                           "oracle_dtype": str(dtype), "stats": json.dumps(stats)})
    report[name] = {"bytes": dir_size(d), "stats": stats, "decode_tokens": out["decode_tokens"]}
    print(name, json.dumps(report[name], indent=1), flush=True)


def make_ling(prefix, cfg, sets, out_root, dtype, report):
    seed = SEEDS[prefix]
    w = ling_weights(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg["vocab_size"], (T_PROMPT[prefix],), generator=g).tolist()
    gate32 = (".mlp.gate.weight",) if prefix == "ling-a" else ()
    bf16 = to_storage_bf16(w, gate32)
    if prefix + "-bf16" in sets:
        run_ling_set(prefix + "-bf16", cfg, bf16, tokens, seed, out_root, dtype, report)
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
          "modules_to_not_convert": not_converted(cfg)}
    if prefix + "-fp8" in sets:
        c8 = dict(cfg, quantization_config=qc)
        run_ling_set(prefix + "-fp8", c8, to_storage_fp8(bf16, False, False), tokens, seed, out_root, dtype, report)
    if prefix + "-fp4" in sets:
        q4 = dict(qc, scale_fmt="ue8m0", routed_experts_quant_method="mxfp4", routed_experts_group_size=32)
        c4 = dict(cfg, quantization_config=q4)
        run_ling_set(prefix + "-fp4", c4, to_storage_fp8(bf16, True, True), tokens, seed, out_root, dtype, report)


ALL_SETS = ["ling-a-bf16", "ling-a-fp8", "ling-a-fp4", "ling-b-bf16", "kimi-bf16"]


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "data"))
    ap.add_argument("--sets", default=",".join(ALL_SETS))
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    a = ap.parse_args()
    sets = a.sets.split(",")
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    report = {}
    if any(s.startswith("ling-a") for s in sets):
        make_ling("ling-a", LING_A, sets, a.out, dtype, report)
    if "ling-b-bf16" in sets:
        make_ling("ling-b", LING_B, sets, a.out, dtype, report)
    if "kimi-bf16" in sets:
        import make_kimi
        make_kimi.make(os.path.join(a.out, "kimi-bf16"), SEEDS["kimi"], T_PROMPT["kimi"], N_DECODE, dtype, report,
                       SCRIPT_VERSION)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
