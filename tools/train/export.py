"""Export LingModel to the -fp4 storage layout of spec §3 (routed experts MXFP4, other projections block FP8
with ue8m0 scales, the rest BF16/F32), and load such a checkpoint back (dequantized) for checking."""
import json
import os

import torch
from safetensors.torch import load_file, save_file

from model import (Cfg, MoE, QLinear, fp8_block_dequantize, fp8_block_quantize, mxfp4_dequantize, mxfp4_pack,
                   mxfp4_quantize, mxfp4_unpack)

F32_SUFFIXES = ("A_log", "dt_bias", "expert_bias")


def _ckpt_name(n):
    n = n.replace("attention.q_conv1d", "attention.q_conv1d.weight").replace(
        "attention.k_conv1d", "attention.k_conv1d.weight").replace("attention.v_conv1d", "attention.v_conv1d.weight")
    return n if n.startswith("lm_head") else "model." + n


def _qlinear_names(model):
    return {n + ".weight" for n, m in model.named_modules() if isinstance(m, QLinear)}


@torch.no_grad()
def round_to_storage(model):
    """Round every tensor stored in BF16 to bf16 in place (quantized ones are fake-quantized in the forward)."""
    ql = _qlinear_names(model)
    for n, p in model.named_parameters():
        if n in ql or "experts_" in n or n.endswith(F32_SUFFIXES):
            continue
        p.copy_(p.to(torch.bfloat16).float())


def config_dict(c: Cfg, modules_to_not_convert):
    L = c.num_hidden_layers
    return {
        "architectures": ["BailingMoeV3ForCausalLM"],
        "model_type": "bailing_hybrid",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": L,
        "layer_group_size": c.layer_group_size,
        "first_k_dense_replace": c.first_k_dense_replace,
        "intermediate_size": c.intermediate_size,
        "moe_intermediate_size": c.moe_intermediate_size,
        "moe_shared_expert_intermediate_size": c.moe_shared_expert_intermediate_size,
        "num_shared_experts": c.num_shared_experts,
        "num_experts": c.num_experts,
        "num_experts_per_tok": c.num_experts_per_tok,
        "n_group": c.n_group,
        "topk_group": c.topk_group,
        "norm_topk_prob": c.norm_topk_prob,
        "routed_scaling_factor": c.routed_scaling_factor,
        "score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_attention_heads,
        "head_dim": c.head_dim,
        "short_conv_kernel_size": c.short_conv_kernel_size,
        "no_kda_lora": True,
        "kda_safe_gate": True,
        "kda_lower_bound": c.kda_lower_bound,
        "q_lora_rank": None,
        "kv_lora_rank": c.kv_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "rope_interleave": True,
        "partial_rotary_factor": c.qk_rope_head_dim / (c.qk_nope_head_dim + c.qk_rope_head_dim),
        "gated_attention_proj_granularity_type": "head_wise",
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": c.num_nextn_predict_layers,
        "max_position_embeddings": c.max_position_embeddings,
        "use_bias": False,
        "use_qkv_bias": False,
        "expert_swiglu_limit_list": [float(x) for x in c.expert_swiglu_limit_list],
        "share_expert_swiglu_limit_list": [float(x) for x in c.share_expert_swiglu_limit_list],
        "pad_token_id": c.pad_token_id,
        "eos_token_id": c.eos_token_id,
        "torch_dtype": "bfloat16",
        "use_qk_norm": False,
        "group_norm_size": 1,
        "mtp_use_kda": False,
        "use_mla_nope": False,
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "scale_fmt": "ue8m0",
            "routed_experts_quant_method": "mxfp4",
            "routed_experts_group_size": 32,
            "modules_to_not_convert": modules_to_not_convert,
        },
    }


@torch.no_grad()
def export(model, c: Cfg, out_dir):
    ql = _qlinear_names(model)
    dense, experts, not_convert = {}, {}, ["lm_head", "model.word_embeddings"]
    for n, p in model.state_dict().items():
        p = p.detach().float().cpu()
        if n.endswith(("experts_gate", "experts_up", "experts_down")):
            kind = {"experts_gate": "gate_proj", "experts_up": "up_proj", "experts_down": "down_proj"}[n.rsplit(".", 1)[1]]
            base = _ckpt_name(n.rsplit(".", 1)[0])
            code, exp = mxfp4_quantize(p)
            packed = mxfp4_pack(code)
            for e in range(p.shape[0]):
                experts[f"{base}.experts.{e}.{kind}.weight"] = packed[e].contiguous()
                experts[f"{base}.experts.{e}.{kind}.weight_scale_inv"] = exp[e].contiguous()
            continue
        name = _ckpt_name(n)
        if n in ql:
            q, s = fp8_block_quantize(p)
            dense[name] = q
            dense[name + "_scale_inv"] = s.float().contiguous()
        elif n.endswith(F32_SUFFIXES):
            dense[name] = p.contiguous()
        else:
            if n.endswith("gate.weight") and ".mlp." in n:
                not_convert.append(name[:-len(".weight")])
            dense[name] = p.to(torch.bfloat16).contiguous()
    shards = [("model-00001-of-00002.safetensors", dense), ("model-00002-of-00002.safetensors", experts)]
    weight_map, total = {}, 0
    for fname, tensors in shards:
        save_file(tensors, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_dict(c, not_convert), f, indent=2)
    return [s[0] for s in shards] + ["model.safetensors.index.json", "config.json"]


def read_checkpoint(ckpt_dir):
    """name -> dequantized fp32 tensor, for a checkpoint in any of the storage formats of spec §3."""
    idx = os.path.join(ckpt_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    raw = {}
    for f in files:
        raw.update(load_file(os.path.join(ckpt_dir, f)))
    out = {}
    for n, t in raw.items():
        if n.endswith("_scale_inv"):
            continue
        s = raw.get(n + "_scale_inv")
        if s is None:
            out[n] = t.float()
        elif t.dtype == torch.float8_e4m3fn:
            out[n] = fp8_block_dequantize(t, s.float())
        else:  # MXFP4: U8 packed codes + U8 E8M0 exponents
            out[n] = mxfp4_dequantize(mxfp4_unpack(t.view(torch.uint8)), s.view(torch.uint8))
    return out


@torch.no_grad()
def load_into(model, ckpt_dir):
    w = read_checkpoint(ckpt_dir)
    used = set()
    sd = model.state_dict()
    for n, p in sd.items():
        if n.endswith(("experts_gate", "experts_up", "experts_down")):
            kind = {"experts_gate": "gate_proj", "experts_up": "up_proj", "experts_down": "down_proj"}[n.rsplit(".", 1)[1]]
            base = _ckpt_name(n.rsplit(".", 1)[0])
            names = [f"{base}.experts.{e}.{kind}.weight" for e in range(p.shape[0])]
            p.copy_(torch.stack([w[x] for x in names]))
            used.update(names)
        else:
            name = _ckpt_name(n)
            p.copy_(w[name].reshape(p.shape))
            used.add(name)
    extra = set(w) - used
    if extra:
        raise ValueError(f"unused tensors in checkpoint: {sorted(extra)[:5]}")
