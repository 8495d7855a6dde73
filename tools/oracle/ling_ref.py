"""PyTorch reference of shared/spec/ling3.md (Ling-3.0 hybrid: KDA + gated MLA + MoE + MTP) and of Kimi-Linear.

Written from the spec, plainly, for correctness rather than speed. Every function names the spec section it
implements. Runs in float32 by default; pass dtype=torch.float64 for a higher-precision oracle.

Two execution modes share the same cache object, so they can be compared:
  * full sequence: Model.forward(tokens, cache) with many tokens (KDA uses the chunked WY/UT form, MLA a causal mask);
  * step by step:  Model.forward([t], cache) one token at a time (KDA uses the recurrent delta rule of §2 verbatim).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from safetensors import safe_open

SCRIPT_VERSION = "ling_ref 1.0"

# ----------------------------------------------------------------------------------------------------------------
# Configuration (spec §1)
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class RefConfig:
    family: str  # "ling" or "kimi"
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: list  # "kda" / "mla" per layer
    mlp_types: list  # "dense" / "moe" per layer
    intermediate_size: int
    # MoE
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_width: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    expert_limits: list
    shared_limits: list
    # KDA
    kda_heads: int
    kda_head_dim: int
    conv_kernel: int
    kda_lora: bool  # low-rank f/g (f_a,f_b,g_a,g_b)
    safe_gate: bool
    lower_bound: float
    # MLA
    mla_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    use_rope: bool
    rope_theta: float
    output_gate: str | None  # "head_wise" / "element_wise" / None
    rms_norm_eps: float
    mla_latent_eps: float  # eps of q_a_layernorm / kv_a_layernorm (Kimi in HF: fixed 1e-6)
    num_nextn_predict_layers: int
    tie_word_embeddings: bool
    raw: dict = field(default_factory=dict)

    def expert_limit(self, layer: int) -> float:
        # clamp lists: index past the end means no clamp (spec §2 MTP note)
        return float(self.expert_limits[layer]) if layer < len(self.expert_limits) else 0.0

    def shared_limit(self, layer: int) -> float:
        return float(self.shared_limits[layer]) if layer < len(self.shared_limits) else 0.0

    @staticmethod
    def from_dict(j: dict) -> "RefConfig":
        mt = j.get("model_type", "bailing_hybrid")
        if mt == "kimi_linear":
            return RefConfig._from_kimi(j)
        L = j["num_hidden_layers"]
        g = j["layer_group_size"]
        fk = j.get("first_k_dense_replace", 0)
        ns = j.get("num_shared_experts", 0) or 0
        gate = j.get("gated_attention_proj_granularity_type", "head_wise")
        eps = j.get("rms_norm_eps", 1e-6)
        return RefConfig(
            family="ling",
            vocab_size=j["vocab_size"], hidden_size=j["hidden_size"], num_hidden_layers=L,
            layer_types=["mla" if (i + 1) % g == 0 else "kda" for i in range(L)],
            mlp_types=["dense" if i < fk else "moe" for i in range(L)],
            intermediate_size=j.get("intermediate_size", 0),
            num_experts=j["num_experts"], num_experts_per_tok=j["num_experts_per_tok"],
            moe_intermediate_size=j["moe_intermediate_size"],
            shared_width=ns * j.get("moe_shared_expert_intermediate_size", j["moe_intermediate_size"]),
            n_group=j.get("n_group", 1) or 1, topk_group=j.get("topk_group", 1) or 1,
            norm_topk_prob=j.get("norm_topk_prob", True),
            routed_scaling_factor=j.get("routed_scaling_factor", 1.0),
            expert_limits=list(j.get("expert_swiglu_limit_list") or []),
            shared_limits=list(j.get("share_expert_swiglu_limit_list") or []),
            kda_heads=j["num_attention_heads"], kda_head_dim=j["head_dim"],
            conv_kernel=j.get("short_conv_kernel_size", 4),
            kda_lora=not j.get("no_kda_lora", True), safe_gate=j.get("kda_safe_gate", True),
            lower_bound=j.get("kda_lower_bound", -5.0),
            mla_heads=j["num_attention_heads"], q_lora_rank=j.get("q_lora_rank"),
            kv_lora_rank=j["kv_lora_rank"], qk_nope_head_dim=j["qk_nope_head_dim"],
            qk_rope_head_dim=j["qk_rope_head_dim"], v_head_dim=j["v_head_dim"],
            use_rope=True, rope_theta=j.get("rope_theta", 10000.0),
            output_gate=gate if gate in ("head_wise", "element_wise") else None,
            rms_norm_eps=eps, mla_latent_eps=eps,
            num_nextn_predict_layers=j.get("num_nextn_predict_layers", 0) or 0,
            tie_word_embeddings=j.get("tie_word_embeddings", False), raw=j)

    @staticmethod
    def _from_kimi(j: dict) -> "RefConfig":
        # Kimi-Linear as HF transformers saves it (spec §1 "Relatives"); linear_attn_config is the original layout.
        # transformers writes attribute_map names: num_experts, num_experts_per_token, num_expert_group,
        # num_shared_experts, moe_renormalize, model_max_length; "head_dim" there is qk_rope_head_dim (unused).
        L = j["num_hidden_layers"]
        lac = j.get("linear_attn_config") or {}
        if j.get("layer_types"):
            lt = ["mla" if t == "full_attention" else "kda" for t in j["layer_types"]]
        elif "full_attn_layers" in lac:
            full = set(x - 1 for x in lac["full_attn_layers"])  # 1-indexed in the original config
            lt = ["mla" if i in full else "kda" for i in range(L)]
        else:
            lt = ["mla" if i and i % 4 == 0 else "kda" for i in range(L)]
        if j.get("mlp_layer_types"):
            mt = ["dense" if t == "dense" else "moe" for t in j["mlp_layer_types"]]
        else:
            fk = j.get("first_k_dense_replace", 1)
            mt = ["dense" if i < fk else "moe" for i in range(L)]
        E = j.get("num_local_experts", j.get("num_experts"))
        return RefConfig(
            family="kimi",
            vocab_size=j["vocab_size"], hidden_size=j["hidden_size"], num_hidden_layers=L,
            layer_types=lt, mlp_types=mt, intermediate_size=j["intermediate_size"],
            num_experts=E, num_experts_per_tok=j.get("num_experts_per_tok", j.get("num_experts_per_token")),
            moe_intermediate_size=j["moe_intermediate_size"],
            shared_width=(j.get("n_shared_experts", j.get("num_shared_experts", 1)) or 0) * j["moe_intermediate_size"],
            n_group=j.get("n_group", j.get("num_expert_group", 1)) or 1, topk_group=j.get("topk_group", 1) or 1,
            norm_topk_prob=j.get("norm_topk_prob", j.get("moe_renormalize", True)),
            routed_scaling_factor=j.get("routed_scaling_factor", 1.0),
            expert_limits=[], shared_limits=[],
            kda_heads=lac.get("num_heads", j.get("linear_num_heads", 32)),
            kda_head_dim=lac.get("head_dim", j.get("linear_head_dim", 128)),
            conv_kernel=lac.get("short_conv_kernel_size", j.get("linear_conv_kernel_dim", 4)),
            kda_lora=True, safe_gate=False, lower_bound=0.0,
            mla_heads=j["num_attention_heads"], q_lora_rank=j.get("q_lora_rank"),
            kv_lora_rank=j["kv_lora_rank"], qk_nope_head_dim=j["qk_nope_head_dim"],
            qk_rope_head_dim=j["qk_rope_head_dim"], v_head_dim=j["v_head_dim"],
            use_rope=False, rope_theta=j.get("rope_theta", 10000.0), output_gate=None,
            rms_norm_eps=j.get("rms_norm_eps", 1e-5), mla_latent_eps=1e-6,
            num_nextn_predict_layers=0, tie_word_embeddings=j.get("tie_word_embeddings", False), raw=j)


# ----------------------------------------------------------------------------------------------------------------
# Storage formats (spec §3): dequantization and quantization
# ----------------------------------------------------------------------------------------------------------------

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def dequant_fp8_block(q: torch.Tensor, scale_inv: torch.Tensor, block=(128, 128)) -> torch.Tensor:
    """§3 Block FP8: w[i,j] = fp8(q[i,j]) * scale_inv[i/128, j/128]; edge blocks partial."""
    out, inn = q.shape
    s = scale_inv.float().repeat_interleave(block[0], 0)[:out].repeat_interleave(block[1], 1)[:, :inn]
    return q.float() * s


def e8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    """UE8M0: 2^(s-127); 0xFF = NaN."""
    s = s.view(torch.uint8).to(torch.int32) if s.dtype in (torch.int8, torch.uint8) else s.to(torch.int32)
    v = torch.pow(torch.tensor(2.0, dtype=torch.float64), (s - 127).double()).float()
    return torch.where(s == 255, torch.full_like(v, float("nan")), v)


def dequant_mxfp4(w: torch.Tensor, scale_inv: torch.Tensor, group=32) -> torch.Tensor:
    """§3 MXFP4: [out, in/2] bytes, low nibble = even element; [out, in/32] E8M0 scales."""
    b = w.view(torch.uint8).to(torch.int64)
    lo, hi = b & 0xF, b >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(b.shape[0], b.shape[1] * 2)
    mag = E2M1_VALUES[codes & 7]
    val = torch.where((codes & 8) != 0, -mag, mag)
    sc = e8m0_to_float(scale_inv).repeat_interleave(group, 1)
    return val * sc


def quant_fp8_block(w: torch.Tensor, ue8m0: bool = False, block=(128, 128)):
    """Block FP8 quantizer: per 128x128 block scale = amax/448 (ue8m0: rounded up to a power of two)."""
    w = w.float()
    out, inn = w.shape
    nb_r, nb_c = -(-out // block[0]), -(-inn // block[1])
    scale = torch.ones(nb_r, nb_c, dtype=torch.float32)
    for i in range(nb_r):
        for j in range(nb_c):
            blk = w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            amax = blk.abs().max().item()
            if amax > 0:
                s = amax / 448.0
                if ue8m0:
                    s = 2.0 ** math.ceil(math.log2(s))
                scale[i, j] = s
    sfull = scale.repeat_interleave(block[0], 0)[:out].repeat_interleave(block[1], 1)[:, :inn]
    q = (w / sfull).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale


def _e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Round |x| to the nearest E2M1 code (ties to the even code), saturating at 6; returns codes 0..15."""
    a = x.abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - E2M1_VALUES).abs()  # [..., 8]
    cand = d == d.min(dim=-1, keepdim=True).values
    idx = torch.arange(8)
    # a tie is between two adjacent codes, one even and one odd: prefer the even one
    code = (cand.to(torch.int64) * (2 - idx % 2)).argmax(dim=-1)
    sign = ((x < 0) & (code > 0)).to(torch.int64) << 3
    return code | sign


def quant_mxfp4(w: torch.Tensor, group=32):
    """MXFP4 quantizer: scale = 2^ceil(log2(amax/6)) per 32 inputs, codes round-to-nearest-even, saturate at 6."""
    w = w.float()
    out, inn = w.shape
    assert inn % group == 0, "MXFP4 needs in % 32 == 0"
    blocks = w.view(out, inn // group, group)
    amax = blocks.abs().amax(-1)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.zeros_like(amax)).to(torch.int64)
    # exact power of two check: log2 of a float may be off by an ulp; fix so that amax/2^e <= 6 and amax/2^(e-1) > 6
    e = torch.where((amax > 0) & (amax / torch.pow(2.0, e.double()).float() > 6.0), e + 1, e)
    e = torch.where((amax > 0) & (amax / torch.pow(2.0, (e - 1).double()).float() <= 6.0), e - 1, e)
    scale = torch.pow(2.0, e.double()).float()
    codes = _e2m1_round(blocks / scale.unsqueeze(-1)).view(out, inn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    sbytes = (e + 127).clamp(0, 254).to(torch.uint8)
    return packed.view(torch.int8), sbytes


# ----------------------------------------------------------------------------------------------------------------
# Checkpoint loading (spec §3)
# ----------------------------------------------------------------------------------------------------------------


def read_safetensors_dir(model_dir: str) -> dict:
    """All tensors of model.safetensors or of the shards named by model.safetensors.index.json."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(model_dir, fn), framework="pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def dequantize_all(raw: dict, group=32) -> dict:
    """Turns every stored tensor into float32, applying <name>_scale_inv siblings (FP8 block or MXFP4)."""
    out = {}
    for k, v in raw.items():
        if k.endswith("_scale_inv"):
            continue
        s = raw.get(k + "_scale_inv")
        if s is None:
            out[k] = v.float()
        elif v.dtype == torch.float8_e4m3fn:
            out[k] = dequant_fp8_block(v, s)
        elif v.dtype in (torch.int8, torch.uint8):
            out[k] = dequant_mxfp4(v, s, group)
        else:
            raise ValueError(f"{k}: unknown quantized dtype {v.dtype}")
    return out


def canonical_names(cfg: RefConfig, w: dict) -> dict:
    """Maps Kimi-Linear names (spec §3) onto the Ling names this reference uses."""
    if cfg.family != "kimi":
        out = dict(w)
    else:
        out = {}
        for k, v in w.items():
            n = k.replace("model.embed_tokens.", "model.word_embeddings.")
            n = n.replace(".self_attn.", ".attention.").replace(".block_sparse_moe.", ".mlp.")
            n = n.replace(".gate.e_score_correction_bias", ".gate.expert_bias")
            n = n.replace(".w1.weight", ".gate_proj.weight").replace(".w3.weight", ".up_proj.weight")
            n = n.replace(".w2.weight", ".down_proj.weight")
            n = n.replace(".attention.forget_gate.", ".attention.")
            out[n] = v
        for i, t in enumerate(cfg.layer_types):
            p = f"model.layers.{i}.attention."
            if t == "mla" and p + "o_proj.weight" in out:
                out[p + "dense.weight"] = out.pop(p + "o_proj.weight")
            if t == "kda" and p + "conv1d.weight" in out:  # fused conv over [q;k;v]
                q, k, v = out.pop(p + "conv1d.weight").chunk(3, dim=0)
                out[p + "q_conv1d.weight"], out[p + "k_conv1d.weight"], out[p + "v_conv1d.weight"] = q, k, v
    for k in list(out):
        if k.endswith(".gate.e_score_correction_bias"):
            out[k.replace("e_score_correction_bias", "expert_bias")] = out.pop(k)
        if k.endswith("A_log"):
            out[k] = out[k].reshape(-1)
    return out


def canonicalize_safetensors_header(path: str):
    """Rewrites a safetensors header with sorted keys (same length, space padded): safetensors writes its
    __metadata__ map in hash order, so without this, regenerated files differ in bytes though not in content."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
        text = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
        if len(text) > n:
            return
        f.seek(8)
        f.write(text + b" " * (n - len(text)))


def load_model(model_dir: str, dtype=torch.float32) -> "Model":
    cfg = RefConfig.from_dict(json.load(open(os.path.join(model_dir, "config.json"))))
    w = canonical_names(cfg, dequantize_all(read_safetensors_dir(model_dir)))
    return Model(cfg, w, dtype)


# ----------------------------------------------------------------------------------------------------------------
# Building blocks (spec §2)
# ----------------------------------------------------------------------------------------------------------------


def rms_norm(x, w, eps):
    """§2 RMSNorm: w ⊙ x / sqrt(mean(x²) + eps)."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def l2norm(x, eps=1e-6):
    """§2 KDA l2norm: x / sqrt(Σx² + 1e-6) (eps inside the sqrt)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def swiglu(a, b, limit: float):
    """§2 φ(a,b) = silu(a)⊙b, or with L>0: min(silu(a), L) ⊙ clamp(b, −L, L)."""
    if limit > 0:
        return torch.clamp(F.silu(a), max=limit) * torch.clamp(b, -limit, limit)
    return F.silu(a) * b


def mlp(x, w, prefix, limit=0.0):
    """SwiGLU MLP (dense layers, each routed expert, the shared expert)."""
    a = x @ w[prefix + "gate_proj.weight"].T
    b = x @ w[prefix + "up_proj.weight"].T
    return swiglu(a, b, limit) @ w[prefix + "down_proj.weight"].T


def short_conv(a, window, weight):
    """§2 causal depthwise conv, kernel K: c(t) = Σ_j w[:, j] a(t-K+1+j); current token multiplies w[:, K-1].
    a: [T, P], window: [K-1, P] previous inputs (zeros at start). Returns (silu(conv), new window)."""
    K = weight.shape[-1]
    wt = weight.reshape(weight.shape[0], K)  # [P, K]
    full = torch.cat([window, a], 0)  # [K-1+T, P]
    T = a.shape[0]
    out = torch.zeros_like(a)
    for j in range(K):
        out = out + full[j:j + T] * wt[:, j]
    return F.silu(out), full[-(K - 1):].clone()


def rope_interleaved(x, pos, theta):
    """§2 interleaved RoPE: pairs (x0,x1),(x2,x3)..., pair j rotated by angle p·θ^(−2j/dr). x: [T, ..., dr]."""
    dr = x.shape[-1]
    j = torch.arange(dr // 2, dtype=torch.float64)
    inv = theta ** (-2.0 * j / dr)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]  # [T, dr/2]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(1)
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack([y0, y1], -1).flatten(-2)


def kda_recurrent(q, k, v, g, beta, S):
    """§2 KDA per-head delta rule, exactly the pseudo-code: S ← Diag(e^g) S ; S ← S + β k (v − Sᵀk)ᵀ ; o = Sᵀ q.
    q,k,g: [T,H,K], v: [T,H,V], beta: [T,H], S: [H,K,V] (modified copy returned)."""
    T = q.shape[0]
    o = torch.zeros(T, v.shape[1], v.shape[2], dtype=v.dtype)
    S = S.clone()
    for t in range(T):
        S = S * torch.exp(g[t])[:, :, None]
        kv = torch.einsum("hkv,hk->hv", S, k[t])
        S = S + beta[t][:, None, None] * k[t][:, :, None] * (v[t] - kv)[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return o, S


def kda_chunked(q, k, v, g, beta, S, C=64):
    """§2 chunked (WY/UT) KDA prefill, per chunk of C tokens. Same result as kda_recurrent up to rounding."""
    T, H, K = q.shape
    o = torch.zeros(T, H, v.shape[2], dtype=v.dtype)
    S = S.clone()
    for c0 in range(0, T, C):
        sl = slice(c0, min(c0 + C, T))
        qc, kc, vc, gc, bc = (x[sl].transpose(0, 1) for x in (q, k, v, g, beta))  # [H, n, ...]
        n = qc.shape[1]
        G = gc.cumsum(1)  # [H, n, K]
        diff = G[:, :, None, :] - G[:, None, :, :]  # [H, r, c, K] = G_r - G_c
        lower = torch.tril(torch.ones(n, n, dtype=torch.bool), -1)
        incl = torch.tril(torch.ones(n, n, dtype=torch.bool), 0)
        dec_strict = torch.where(lower[None, :, :, None], diff, torch.full_like(diff, -math.inf)).exp()
        dec_incl = torch.where(incl[None, :, :, None], diff, torch.full_like(diff, -math.inf)).exp()
        Lm = bc[:, :, None] * torch.einsum("hrd,hcd,hrcd->hrc", kc, kc, dec_strict)
        I = torch.eye(n, dtype=q.dtype).expand(H, n, n)
        Tm = torch.linalg.solve_triangular(I + Lm, torch.diag_embed(bc), upper=False, unitriangular=True)
        W = Tm @ (torch.exp(G) * kc)
        U = Tm @ vc
        Vp = U - W @ S
        Aqk = torch.einsum("hrd,hcd,hrcd->hrc", qc, kc, dec_incl)
        oc = (qc * torch.exp(G)) @ S + Aqk @ Vp
        GC = G[:, -1:, :]  # [H,1,K]
        S = torch.exp(GC[:, 0, :])[:, :, None] * S + (kc * torch.exp(GC - G)).transpose(1, 2) @ Vp
        o[sl] = oc.transpose(0, 1)
    return o, S


# ----------------------------------------------------------------------------------------------------------------
# Caches
# ----------------------------------------------------------------------------------------------------------------


class Cache:
    """Per layer: KDA {'S': [H,K,V], 'conv': {q,k,v: [K-1, P]}} or MLA {'c': [n, r], 'kr': [n, dr]}; pos = tokens seen."""

    def __init__(self):
        self.layers = {}
        self.pos = 0


# ----------------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------------


class Model:
    def __init__(self, cfg: RefConfig, weights: dict, dtype=torch.float32, kda_mode: str = "auto"):
        self.cfg = cfg
        self.dtype = dtype
        self.w = {k: v.to(dtype) for k, v in weights.items()}
        self.kda_mode = kda_mode  # auto: chunked for T>1, recurrent for T==1; or "recurrent" / "chunked"
        self.trace = None  # set to a dict to record per-layer intermediates of forward() (name -> tensor)
        if "lm_head.weight" not in self.w:
            if cfg.tie_word_embeddings:
                self.w["lm_head.weight"] = self.w["model.word_embeddings.weight"]
            else:
                raise KeyError("lm_head.weight missing")

    # -- §2 KDA mixer ---------------------------------------------------------------------------------------------
    def kda(self, i, u, cache: Cache):
        c, w = self.cfg, self.w
        p = f"model.layers.{i}.attention."
        H, K = c.kda_heads, c.kda_head_dim
        P = H * K
        T = u.shape[0]
        st = cache.layers.get(i)
        if st is None:
            st = {"S": torch.zeros(H, K, K, dtype=self.dtype),
                  "conv": {n: torch.zeros(c.conv_kernel - 1, P, dtype=self.dtype) for n in "qkv"}}
            cache.layers[i] = st
        outs = {}
        for n in "qkv":
            a = u @ w[p + f"{n}_proj.weight"].T
            outs[n], st["conv"][n] = short_conv(a, st["conv"][n], w[p + f"{n}_conv1d.weight"])
        q = l2norm(outs["q"].view(T, H, K)) * K ** -0.5
        k = l2norm(outs["k"].view(T, H, K))
        v = outs["v"].view(T, H, K)
        beta = torch.sigmoid(u @ w[p + "b_proj.weight"].T)  # [T,H]
        if c.kda_lora:
            f = (u @ w[p + "f_a_proj.weight"].T) @ w[p + "f_b_proj.weight"].T
            gg = (u @ w[p + "g_a_proj.weight"].T) @ w[p + "g_b_proj.weight"].T
        else:
            f = u @ w[p + "f_proj.weight"].T
            gg = u @ w[p + "g_proj.weight"].T
        A = torch.exp(w[p + "A_log"]).view(1, H, 1)
        x = (f + w[p + "dt_bias"]).view(T, H, K)
        if c.safe_gate:
            g = c.lower_bound * torch.sigmoid(A * x)  # safe gate, log-decay in (lower_bound, 0)
        else:
            g = -A * F.softplus(x)  # Kimi's gate
        use_chunk = self.kda_mode == "chunked" or (self.kda_mode == "auto" and T > 1)
        fn = kda_chunked if use_chunk else kda_recurrent
        o, st["S"] = fn(q, k, v, g, beta, st["S"])
        o = rms_norm(o, w[p + "o_norm.weight"], c.rms_norm_eps) * torch.sigmoid(gg.view(T, H, K))
        return o.reshape(T, P) @ w[p + "o_proj.weight"].T

    # -- §2 gated MLA mixer (naive form) ------------------------------------------------------------------------------
    def mla(self, i, u, cache: Cache, pos0: int):
        c, w = self.cfg, self.w
        p = f"model.layers.{i}.attention."
        H, dn, dr, dv, r = c.mla_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        T = u.shape[0]
        if c.q_lora_rank:
            qa = rms_norm(u @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], c.mla_latent_eps)
            q = qa @ w[p + "q_b_proj.weight"].T
        else:
            q = u @ w[p + "q_proj.weight"].T
        q = q.view(T, H, dn + dr)
        q_nope, q_rope = q[..., :dn], q[..., dn:]
        kva = u @ w[p + "kv_a_proj_with_mqa.weight"].T
        cl = rms_norm(kva[:, :r], w[p + "kv_a_layernorm.weight"], c.mla_latent_eps)
        k_rope = kva[:, r:]
        pos = torch.arange(pos0, pos0 + T)
        if c.use_rope:
            q_rope = rope_interleaved(q_rope, pos, c.rope_theta)
            k_rope = rope_interleaved(k_rope, pos, c.rope_theta)
        st = cache.layers.setdefault(i, {"c": torch.zeros(0, r, dtype=self.dtype),
                                         "kr": torch.zeros(0, dr, dtype=self.dtype)})
        st["c"] = torch.cat([st["c"], cl], 0)
        st["kr"] = torch.cat([st["kr"], k_rope], 0)
        n = st["c"].shape[0]
        kv = (st["c"] @ w[p + "kv_b_proj.weight"].T).view(n, H, dn + dv)
        k_nope, vv = kv[..., :dn], kv[..., dn:]
        scores = (torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_rope, st["kr"]))
        scores = scores / math.sqrt(dn + dr)
        kpos = torch.arange(n)
        mask = kpos[None, :] > (n - T + torch.arange(T))[:, None]  # causal: key index > query index
        scores = scores.masked_fill(mask[None], -math.inf)
        o = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), vv)  # [T,H,dv]
        if c.output_gate == "head_wise":
            o = o * torch.sigmoid(u @ w[p + "g_proj.weight"].T)[:, :, None]
        elif c.output_gate == "element_wise":
            o = o * torch.sigmoid(u @ w[p + "g_proj.weight"].T).view(T, H, dv)
        return o.reshape(T, H * dv) @ w[p + "dense.weight"].T

    # -- §2 router + MoE FFN --------------------------------------------------------------------------------------
    def route(self, i, x):
        """Returns (idx [T,k], weights [T,k]). Router logits in fp32 (or the oracle dtype if wider)."""
        c, w = self.cfg, self.w
        p = f"model.layers.{i}.mlp.gate."
        rdt = torch.float64 if self.dtype == torch.float64 else torch.float32
        s = torch.sigmoid(x.to(rdt) @ w[p + "weight"].to(rdt).T)  # [T,E]
        bias = w.get(p + "expert_bias")
        sb = s + (bias.to(rdt) if bias is not None else 0.0)
        T, E = s.shape
        G = c.n_group
        if G > 1:
            gs = sb.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)  # group score: sum of top-2 biased scores
            keep = gs.topk(c.topk_group, dim=-1).indices
            gmask = torch.zeros(T, G, dtype=torch.bool).scatter_(1, keep, True)
            emask = gmask[:, :, None].expand(T, G, E // G).reshape(T, E)
            sb = sb.masked_fill(~emask, -math.inf)
        idx = sb.topk(c.num_experts_per_tok, dim=-1).indices
        wt = s.gather(1, idx)
        if c.norm_topk_prob:
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        wt = wt * c.routed_scaling_factor
        return idx, wt.to(self.dtype)

    def moe(self, i, x):
        c = self.cfg
        p = f"model.layers.{i}.mlp."
        idx, wt = self.route(i, x)
        lim = c.expert_limit(i)
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for e, we in zip(idx[t].tolist(), wt[t]):
                y[t] = y[t] + we * mlp(x[t:t + 1], self.w, p + f"experts.{e}.", lim)[0]
        if c.shared_width > 0:
            y = y + mlp(x, self.w, p + "shared_experts.", c.shared_limit(i))
        return y

    def ffn(self, i, x):
        if i < self.cfg.num_hidden_layers and self.cfg.mlp_types[i] == "dense":
            return mlp(x, self.w, f"model.layers.{i}.mlp.")  # dense MLP: no clamp
        return self.moe(i, x)

    # -- §2 decoder stack -----------------------------------------------------------------------------------------
    def forward(self, tokens, cache: Cache | None = None):
        """Runs tokens (list/1-D tensor) after what the cache has seen. Returns (logits [T,V], h_norm [T,hidden])."""
        c, w = self.cfg, self.w
        cache = cache if cache is not None else Cache()
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        pos0 = cache.pos
        x = w["model.word_embeddings.weight"][tokens]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            u = rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            mix = self.mla(i, u, cache, pos0) if c.layer_types[i] == "mla" else self.kda(i, u, cache)
            h = x + mix
            ffn = self.ffn(i, rms_norm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
            x = h + ffn
            if self.trace is not None:
                self.trace[f"layer{i}.mixer_out"] = mix.clone()
                self.trace[f"layer{i}.ffn_out"] = ffn.clone()
                self.trace[f"layer{i}.hidden_out"] = x.clone()
        cache.pos += len(tokens)
        hn = rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
        return hn @ w["lm_head.weight"].T, hn

    # -- §2 MTP (NEXTN) layer -----------------------------------------------------------------------------------------
    def mtp(self, h_norm, next_tokens, cache: Cache | None = None):
        """h_norm: main model's final hidden (after model.norm) at positions j; next_tokens: t_{j+1}.
        Positions continue from cache.pos (the MTP stream's own cache). Returns logits [n, V]."""
        c, w = self.cfg, self.w
        i = c.num_hidden_layers
        p = f"model.layers.{i}."
        cache = cache if cache is not None else Cache()
        pos0 = cache.pos
        e = w["model.word_embeddings.weight"][torch.as_tensor(next_tokens, dtype=torch.long)]
        x = torch.cat([rms_norm(e, w[p + "enorm.weight"], c.rms_norm_eps),
                       rms_norm(h_norm, w[p + "hnorm.weight"], c.rms_norm_eps)], -1) @ w[p + "eh_proj.weight"].T
        x = x + self.mla(i, rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps), cache, pos0)
        x = x + self.moe(i, rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps))
        cache.pos += len(next_tokens)
        return rms_norm(x, w[p + "final_layernorm.weight"], c.rms_norm_eps) @ w["lm_head.weight"].T


# ----------------------------------------------------------------------------------------------------------------
# Convenience: the outputs tests/data holds
# ----------------------------------------------------------------------------------------------------------------


def rel_l2(a, b) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def reference_outputs(model: Model, tokens, n_decode: int, with_mtp: bool, check: bool = True):
    """Prefill (full sequence), greedy decode (step by step with caches), MTP logits (teacher forcing).
    With check: also re-runs the prompt step by step (recurrent KDA) and returns the consistency numbers."""
    tokens = list(tokens)
    cache = Cache()
    logits, hn = model.forward(tokens, cache)
    dec_tokens, dec_logits = [], []
    nxt = int(logits[-1].argmax())
    for _ in range(n_decode):
        dec_tokens.append(nxt)
        lg, _ = model.forward([nxt], cache)
        dec_logits.append(lg[0])
        nxt = int(lg[0].argmax())
    out = {"tokens": tokens, "prefill_logits": logits, "decode_tokens": dec_tokens,
           "decode_logits": torch.stack(dec_logits) if dec_logits else torch.zeros(0, logits.shape[1])}
    stats = {}
    if with_mtp:
        out["mtp_logits"] = model.mtp(hn[:-1], tokens[1:])
    if check:
        c2 = Cache()
        step = torch.cat([model.forward([t], c2)[0] for t in tokens + dec_tokens])
        full_all = torch.cat([logits, out["decode_logits"]])
        stats["prefill_full_vs_step"] = rel_l2(step[:len(tokens)], logits)
        stats["decode_vs_full_sequence"] = rel_l2(model.forward(tokens + dec_tokens)[0], torch.cat([logits, out["decode_logits"]]))
        stats["all_step_vs_cached"] = rel_l2(step, full_all)
        if with_mtp:
            mc = Cache()
            m_step = torch.cat([model.mtp(hn[j:j + 1], [tokens[j + 1]], mc) for j in range(len(tokens) - 1)])
            stats["mtp_full_vs_step"] = rel_l2(m_step, out["mtp_logits"])
    return out, stats
