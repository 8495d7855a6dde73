"""PyTorch model of spec/ling3.md (KDA + gated MLA hybrid, sigmoid-routed MoE, one MTP layer) for training the
embedded default model, with fake quantization (FP8 block / MXFP4) matching the -fp4 storage layout (spec §3)."""
import math
from dataclasses import dataclass, field, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Cfg:
    vocab_size: int = 4096
    hidden_size: int = 384
    num_hidden_layers: int = 8
    layer_group_size: int = 4
    first_k_dense_replace: int = 1
    intermediate_size: int = 768
    num_experts: int = 16
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 96
    num_shared_experts: int = 1
    moe_shared_expert_intermediate_size: int = 96
    n_group: int = 4
    topk_group: int = 2
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    num_attention_heads: int = 6
    head_dim: int = 64
    short_conv_kernel_size: int = 4
    kda_lower_bound: float = -5.0
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32
    v_head_dim: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    expert_swiglu_limit_list: list = field(default_factory=lambda: [0.0] * 6 + [6.0, 6.0])
    share_expert_swiglu_limit_list: list = field(default_factory=lambda: [0.0] * 6 + [8.0, 8.0])
    num_nextn_predict_layers: int = 1
    max_position_embeddings: int = 4096
    pad_token_id: int = 0
    eos_token_id: int = 3

    def is_mla(self, i):
        return (i + 1) % self.layer_group_size == 0

    def limit(self, lst, i):
        return lst[i] if i < len(lst) else 0.0


# ----------------------------------------------------------------------------------------------- quantization
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# decision thresholds between neighbouring codes; ties go to the even code (round half to even)
_E2M1_THRESH = [(0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False)]


def pow2_scale(amax, qmax):
    """Smallest power of two s with amax / s <= qmax (ue8m0 scales); 1 for all-zero blocks."""
    amax = amax.float()
    e = torch.ceil(torch.log2(torch.where(amax > 0, amax / qmax, torch.ones_like(amax))))
    s = torch.exp2(e)
    # guard against log2 rounding: make sure amax / s <= qmax
    s = torch.where(amax / s > qmax, s * 2, s)
    return s


def mxfp4_quantize(w):
    """w [..., out, in] (in % 32 == 0) -> (codes uint8 [..., out, in] in 0..15, exponent uint8 [..., out, in/32])."""
    *lead, o, i = w.shape
    g = w.float().reshape(*lead, o, i // 32, 32)
    s = pow2_scale(g.abs().amax(-1), 6.0)  # [..., o, i/32]
    x = g / s[..., None]
    a = x.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for t, inclusive in _E2M1_THRESH:
        code += (a >= t if inclusive else a > t).to(torch.uint8)
    code = code | ((x < 0) & (code > 0)).to(torch.uint8) << 3
    exp = (torch.log2(s).round() + 127).clamp(0, 254).to(torch.uint8)
    return code.reshape(*lead, o, i), exp


def mxfp4_dequantize(code, exp):
    *lead, o, i = code.shape
    vals = E2M1_VALUES.to(code.device)[(code & 7).long()]
    vals = torch.where((code & 8) > 0, -vals, vals)
    s = torch.exp2(exp.float() - 127)
    return (vals.reshape(*lead, o, i // 32, 32) * s[..., None]).reshape(*lead, o, i)


def mxfp4_pack(code):
    """Two codes per byte, low nibble = even element (spec §3)."""
    return (code[..., 0::2] | (code[..., 1::2] << 4)).contiguous()


def mxfp4_unpack(packed):
    lo, hi = packed & 15, packed >> 4
    return torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def fp8_block_quantize(w, block=128):
    """w [out, in] -> (float8_e4m3fn [out, in], scale_inv f32 [ceil(out/128), ceil(in/128)], powers of two)."""
    o, i = w.shape
    bo, bi = -(-o // block), -(-i // block)
    wp = F.pad(w.float(), (0, bi * block - i, 0, bo * block - o))
    blocks = wp.reshape(bo, block, bi, block)
    s = pow2_scale(blocks.abs().amax(dim=(1, 3)), 448.0)  # [bo, bi]
    q = (blocks / s[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(bo * block, bi * block)[:o, :i].contiguous(), s


def fp8_block_dequantize(q, s, block=128):
    o, i = q.shape
    se = s.repeat_interleave(block, 0)[:o].repeat_interleave(block, 1)[:, :i]
    return q.float() * se


def fake_fp8(w):
    q, s = fp8_block_quantize(w.detach())
    return w + (fp8_block_dequantize(q, s).to(w.dtype) - w).detach()


def fake_mxfp4(w):
    c, e = mxfp4_quantize(w.detach())
    return w + (mxfp4_dequantize(c, e).to(w.dtype) - w).detach()


class QLinear(nn.Module):
    """Bias-free linear whose weight is stored as block FP8 in the export; fake-quantized when qat is on."""

    def __init__(self, i, o, std=0.02):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i) * std)
        self.qat = False

    def forward(self, x):
        w = fake_fp8(self.weight) if self.qat else self.weight
        return F.linear(x, w.to(x.dtype) if not torch.is_autocast_enabled() else w)


def rms_norm(x, w, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w.float() * y).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


# ----------------------------------------------------------------------------------------------- KDA
def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kda_naive(q, k, v, g, beta):
    """Per-token recurrence of spec §2. q,k,g [B,H,T,K], v [B,H,T,V], beta [B,H,T]; fp32."""
    B, H, T, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        S = S * torch.exp(g[:, :, t])[..., None]
        kt = k[:, :, t]
        pred = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + beta[:, :, t, None, None] * kt[..., None] * (v[:, :, t] - pred)[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(out, 2)


def kda_chunked(q, k, v, g, beta, C=16):
    """Chunked (WY/UT) form of the same recurrence; gate differences exponentiated directly (never e^{-G})."""
    B, H, T, K = q.shape
    Vd = v.shape[-1]
    N = -(-T // C)
    pad = N * C - T
    if pad:
        q, k, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, g))
        v = F.pad(v, (0, 0, 0, pad))
        beta = F.pad(beta, (0, pad))
    q, k, g = (x.reshape(B, H, N, C, K).contiguous() for x in (q, k, g))
    v = v.reshape(B, H, N, C, Vd)
    beta = beta.reshape(B, H, N, C)
    G = g.cumsum(-2)
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = incl.clone().fill_diagonal_(False)
    diff = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~incl[:, :, None], float("-inf"))
    E = torch.exp(diff)  # [B,H,N,C(t),C(s),K], 0 where t < s
    Akk = ((k[..., :, None, :] * E) * k[..., None, :, :]).sum(-1)
    Aqk = ((q[..., :, None, :] * E) * k[..., None, :, :]).sum(-1)
    L = (beta[..., None] * Akk) * strict
    # (I+L)^{-1} for strictly lower triangular L (nilpotent, L^C = 0): (I-L)(I+L^2)(I+L^4)...; batched matmuls
    eye = torch.eye(C, device=q.device, dtype=q.dtype)
    Tinv = eye - L
    P = L @ L
    span = 2
    while span < C:
        Tinv = Tinv + Tinv @ P
        span *= 2
        if span < C:
            P = P @ P
    W = Tinv @ (beta[..., None] * (torch.exp(G) * k))
    U = Tinv @ (beta[..., None] * v)
    qd = q * torch.exp(G)
    kd = k * torch.exp(G[..., -1:, :] - G)
    gC = torch.exp(G[..., -1, :])  # [B,H,N,K]
    S = q.new_zeros(B, H, K, Vd)
    outs = []
    for n in range(N):
        Vp = U[:, :, n] - W[:, :, n] @ S
        outs.append(qd[:, :, n] @ S + Aqk[:, :, n] @ Vp)
        S = gC[:, :, n, :, None] * S + kd[:, :, n].transpose(-1, -2) @ Vp
    o = torch.stack(outs, 2).reshape(B, H, N * C, Vd)
    return o[:, :, :T]


class KDA(nn.Module):
    def __init__(self, c: Cfg, out_std):
        super().__init__()
        d, H, K = c.hidden_size, c.num_attention_heads, c.head_dim
        P = H * K
        self.H, self.K, self.lb, self.eps = H, K, c.kda_lower_bound, c.rms_norm_eps
        self.q_proj, self.k_proj, self.v_proj = QLinear(d, P), QLinear(d, P), QLinear(d, P)
        self.f_proj, self.g_proj = QLinear(d, P), QLinear(d, P)
        self.b_proj = QLinear(d, H)
        ks = c.short_conv_kernel_size
        self.q_conv1d = nn.Parameter(torch.randn(P, 1, ks) * (1 / math.sqrt(ks)))
        self.k_conv1d = nn.Parameter(torch.randn(P, 1, ks) * (1 / math.sqrt(ks)))
        self.v_conv1d = nn.Parameter(torch.randn(P, 1, ks) * (1 / math.sqrt(ks)))
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.empty(P).uniform_(-5.0, -1.0))
        self.o_norm = RMSNorm(K, c.rms_norm_eps)
        self.o_proj = QLinear(P, d, out_std)
        self.naive = False

    def conv(self, a, w):
        # causal depthwise: out(t) = sum_j w[:, j] a(t-3+j); the current token multiplies w[:, 3]
        x = F.pad(a.transpose(1, 2), (w.shape[-1] - 1, 0))
        return F.silu(F.conv1d(x, w.to(x.dtype), groups=w.shape[0])).transpose(1, 2)

    def forward(self, u, pos=None):
        B, T, _ = u.shape
        H, K = self.H, self.K
        cq = self.conv(self.q_proj(u), self.q_conv1d).float().view(B, T, H, K)
        ck = self.conv(self.k_proj(u), self.k_conv1d).float().view(B, T, H, K)
        cv = self.conv(self.v_proj(u), self.v_conv1d).float().view(B, T, H, K)
        q = l2norm(cq) * K ** -0.5
        k = l2norm(ck)
        beta = torch.sigmoid(self.b_proj(u).float())  # [B,T,H]
        f = self.f_proj(u).float().view(B, T, H, K) + self.dt_bias.float().view(H, K)
        g = self.lb * torch.sigmoid(torch.exp(self.A_log.float()).view(H, 1) * f)
        tr = lambda x: x.transpose(1, 2)
        with torch.autocast(device_type=u.device.type, enabled=False):
            fn = kda_naive if self.naive else kda_chunked
            o = tr(fn(tr(q), tr(k), tr(cv), tr(g), beta.transpose(1, 2)))  # [B,T,H,V]
        o = rms_norm(o, self.o_norm.weight, self.eps)
        o = o * torch.sigmoid(self.g_proj(u).float().view(B, T, H, K))
        return self.o_proj(o.reshape(B, T, H * K).to(u.dtype))


# ----------------------------------------------------------------------------------------------- MLA
def rope_interleaved(x, pos, theta):
    """x [..., T, (heads), dr] with positions pos [T]; pairs (x0,x1),(x2,x3)...; pair j angle p*theta^(-2j/dr)."""
    dr = x.shape[-1]
    inv = theta ** (-torch.arange(0, dr, 2, device=x.device, dtype=torch.float32) / dr)
    ang = pos.float()[:, None] * inv[None, :]  # [T, dr/2]
    xf = x.float()
    x0, x1 = xf[..., 0::2], xf[..., 1::2]
    if x.dim() == 4:  # [B,T,H,dr]
        cos, sin = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
    else:  # [B,T,dr]
        cos, sin = torch.cos(ang)[None], torch.sin(ang)[None]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack([y0, y1], -1).flatten(-2).to(x.dtype)


class MLA(nn.Module):
    def __init__(self, c: Cfg, out_std):
        super().__init__()
        d, H = c.hidden_size, c.num_attention_heads
        self.H, self.dn, self.dr, self.dv, self.r = H, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        self.theta, self.eps = c.rope_theta, c.rms_norm_eps
        self.q_proj = QLinear(d, H * (self.dn + self.dr))
        self.kv_a_proj_with_mqa = QLinear(d, self.r + self.dr)
        self.kv_a_layernorm = RMSNorm(self.r, c.rms_norm_eps)
        self.kv_b_proj = QLinear(self.r, H * (self.dn + self.dv))
        self.g_proj = QLinear(d, H)
        self.dense = QLinear(H * self.dv, d, out_std)

    def forward(self, u, pos):
        B, T, _ = u.shape
        H, dn, dr, dv = self.H, self.dn, self.dr, self.dv
        q = self.q_proj(u).view(B, T, H, dn + dr)
        q_nope, q_rope = q[..., :dn], q[..., dn:]
        kv = self.kv_a_proj_with_mqa(u)
        c, k_rope = kv[..., :self.r], kv[..., self.r:]
        c = self.kv_a_layernorm(c)
        kvb = self.kv_b_proj(c).view(B, T, H, dn + dv)
        k_nope, v = kvb[..., :dn], kvb[..., dn:]
        q_rope = rope_interleaved(q_rope, pos, self.theta)
        k_rope = rope_interleaved(k_rope, pos, self.theta)  # [B,T,dr], shared by all heads
        qf = torch.cat([q_nope, q_rope], -1).transpose(1, 2)
        kf = torch.cat([k_nope, k_rope[:, :, None, :].expand(B, T, H, dr).to(k_nope.dtype)], -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(qf, kf.to(qf.dtype), v.transpose(1, 2).to(qf.dtype), is_causal=True,
                                           scale=1.0 / math.sqrt(dn + dr))  # [B,H,T,dv]
        o = o * torch.sigmoid(self.g_proj(u).float()).transpose(1, 2)[..., None].to(o.dtype)
        return self.dense(o.transpose(1, 2).reshape(B, T, H * dv))


# ----------------------------------------------------------------------------------------------- FFN
def swiglu(a, b, limit):
    if limit > 0:
        return torch.clamp(F.silu(a), max=limit) * b.clamp(-limit, limit)
    return F.silu(a) * b


class MLP(nn.Module):
    def __init__(self, d, f, out_std, limit=0.0):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = QLinear(d, f), QLinear(d, f), QLinear(f, d, out_std)
        self.limit = limit

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


class Gate(nn.Module):
    def __init__(self, d, E):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(E, d) * 0.02)
        self.register_buffer("expert_bias", torch.zeros(E))


class MoE(nn.Module):
    def __init__(self, c: Cfg, layer, out_std):
        super().__init__()
        d, E, Fi = c.hidden_size, c.num_experts, c.moe_intermediate_size
        self.E, self.k, self.ng, self.tg = E, c.num_experts_per_tok, c.n_group, c.topk_group
        self.rsf, self.norm = c.routed_scaling_factor, c.norm_topk_prob
        self.gate = Gate(d, E)
        # experts stacked [E, out, in]; exported as mlp.experts.E.{gate,up,down}_proj.weight
        self.experts_gate = nn.Parameter(torch.randn(E, Fi, d) * 0.02)
        self.experts_up = nn.Parameter(torch.randn(E, Fi, d) * 0.02)
        self.experts_down = nn.Parameter(torch.randn(E, d, Fi) * out_std)
        self.limit = c.limit(c.expert_swiglu_limit_list, layer)
        self.shared_experts = MLP(d, c.num_shared_experts * c.moe_shared_expert_intermediate_size, out_std,
                                  c.limit(c.share_expert_swiglu_limit_list, layer))
        self.qat = False
        self.last_load = None

    def route(self, x):
        s = torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))  # [N,E]
        s2 = s + self.gate.expert_bias.float()
        N = s.shape[0]
        if self.ng > 1:
            gs = s2.view(N, self.ng, -1).topk(2, -1).values.sum(-1)  # [N, ng]
            keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(self.tg, -1).indices, True)
            s2 = s2.masked_fill(~keep.repeat_interleave(self.E // self.ng, 1), float("-inf"))
        idx = s2.topk(self.k, -1).indices
        w = s.gather(1, idx)
        if self.norm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.rsf

    def forward(self, x):
        B, T, d = x.shape
        xf = x.reshape(-1, d)
        idx, w = self.route(xf)
        comb = torch.zeros(xf.shape[0], self.E, device=x.device, dtype=torch.float32).scatter(1, idx, w)
        self.last_load = torch.zeros(self.E, device=x.device).scatter_add_(
            0, idx.reshape(-1), torch.ones(idx.numel(), device=x.device)).detach()
        wg, wu, wd = self.experts_gate, self.experts_up, self.experts_down
        if self.qat:
            wg, wu, wd = fake_mxfp4(wg), fake_mxfp4(wu), fake_mxfp4(wd)
        dt = torch.bfloat16 if torch.is_autocast_enabled() else xf.dtype
        xe = xf.to(dt)
        a = torch.einsum("nd,efd->enf", xe, wg.to(dt))
        b = torch.einsum("nd,efd->enf", xe, wu.to(dt))
        h = swiglu(a, b, self.limit) * comb.t()[..., None].to(dt)
        y = torch.einsum("enf,edf->nd", h, wd.to(dt))
        return (y + self.shared_experts(xf)).view(B, T, d)


# ----------------------------------------------------------------------------------------------- model
class DecoderLayer(nn.Module):
    def __init__(self, c: Cfg, i, mla):
        super().__init__()
        out_std = 0.02 / math.sqrt(2 * c.num_hidden_layers)
        self.dropout = 0.0
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attention = MLA(c, out_std) if mla else KDA(c, out_std)
        if i < c.first_k_dense_replace:
            self.mlp = MLP(c.hidden_size, c.intermediate_size, out_std)
        else:
            self.mlp = MoE(c, i, out_std)

    def forward(self, x, pos):
        # dropout (training only; not part of the inference architecture) against many-epoch overfitting
        h = x + F.dropout(self.attention(self.input_layernorm(x), pos), self.dropout, self.training)
        return h + F.dropout(self.mlp(self.post_attention_layernorm(h)), self.dropout, self.training)


class MTPLayer(DecoderLayer):
    def __init__(self, c: Cfg):
        super().__init__(c, c.num_hidden_layers, True)
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = QLinear(2 * c.hidden_size, c.hidden_size)
        self.final_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LingModel(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.c = c
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        nn.init.normal_(self.word_embeddings.weight, std=0.02)
        self.layers = nn.ModuleList([DecoderLayer(c, i, c.is_mla(i)) for i in range(c.num_hidden_layers)])
        self.layers.extend([MTPLayer(c) for _ in range(c.num_nextn_predict_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)

    def set_qat(self, on):
        for m in self.modules():
            if isinstance(m, (QLinear, MoE)):
                m.qat = on

    def set_dropout(self, p):
        for l in self.layers:
            l.dropout = p

    def set_naive(self, on):
        for m in self.modules():
            if isinstance(m, KDA):
                m.naive = on

    def moe_layers(self):
        return [l.mlp for l in self.layers if isinstance(l.mlp, MoE)]

    def forward(self, ids, mtp=True):
        """ids [B,T] -> logits [B,T,V] and (MTP logits [B,T-1,V] predicting t_{j+2} from position j, or None)."""
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)
        x = self.word_embeddings(ids)
        L = self.c.num_hidden_layers
        for l in self.layers[:L]:
            x = l(x, pos)
        h = self.norm(x)
        logits = self.lm_head(h)
        if not mtp or self.c.num_nextn_predict_layers == 0 or T < 2:
            return logits, None
        m = self.layers[L]
        e = m.enorm(self.word_embeddings(ids[:, 1:]))
        y = m.eh_proj(torch.cat([e, m.hnorm(h[:, :-1])], -1))  # order [emb ; h]
        y = m(y, pos[:-1])
        return logits, self.lm_head(m.final_layernorm(y))


def count_params(model):
    return sum(p.numel() for p in model.parameters())
