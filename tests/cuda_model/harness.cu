// Host wrappers of tests/cuda_model (see harness.hpp). nvcc side: includes the kernels.
#include "harness.hpp"

#include <cmath>
#include <cstring>
#include <memory>

#include "ling/cuda/embedding.cuh"
#include "ling/cuda/kda.cuh"
#include "ling/cuda/mla.cuh"
#include "ling/cuda/model_ops.cuh"
#include "ling/cuda/norm.cuh"

namespace ling::test_gpu {
using cuda::DeviceBuffer;
using cuda::check;

bool device_ok() { return cuda::device_available(); }

namespace {
template <class T>
DeviceBuffer up(std::vector<T> const& v) {
  DeviceBuffer b(std::max<std::size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}
DeviceBuffer poisoned(std::size_t floats) {
  DeviceBuffer b(std::max<std::size_t>(floats * 4, 16));
  check(cudaMemset(b.data(), 0xFF, floats * 4), "poison");  // 0xFFFFFFFF is a NaN
  return b;
}
template <class T>
std::vector<T> down(DeviceBuffer const& b, std::size_t n) {
  check(cudaDeviceSynchronize(), "sync");
  std::vector<T> v(n);
  if (n) b.download(v.data(), n * sizeof(T));
  return v;
}
struct DevMatrix {
  DeviceBuffer data, scales;
  cuda::ModelMatrix m;
  explicit DevMatrix(HostMatrix const& h) : data(up(h.data)), scales(up(h.scales)) {
    m = cuda::ModelMatrix{h.format, data.data(), h.scales.empty() ? nullptr : scales.data(), h.rows, h.cols};
  }
};
}  // namespace

std::vector<float> rms_norm(std::vector<float> const& x, std::vector<float> const& w, std::int64_t rows, float eps) {
  auto dx = up(x), dw = up(w);
  auto dy = poisoned(x.size());
  cuda::rms_norm({dx.data<float>(), dw.data<float>(), dy.data<float>(), rows, std::int64_t(w.size()), eps});
  return down<float>(dy, x.size());
}

std::vector<float> embedding(HostMatrix const& table, std::vector<std::int32_t> const& tokens) {
  DevMatrix t(table);
  auto dt = up(tokens);
  auto out = poisoned(tokens.size() * table.cols);
  cuda::embedding({t.m, dt.data<std::int32_t>(), out.data<float>(), std::int64_t(tokens.size())});
  return down<float>(out, tokens.size() * table.cols);
}

std::vector<float> matvec(HostMatrix const& m, std::vector<float> const& x, int prologue, std::vector<float> const& norm_w,
                          std::vector<float> const& gate, int head, float eps, std::vector<float> const* residual,
                          std::vector<float> const* head_ss, int ss_parts) {
  DevMatrix dm(m);
  auto dx = up(x), dn = up(norm_w), dg = up(gate);
  auto out = poisoned(m.rows);
  DeviceBuffer dr, dss;
  if (residual) dr = up(*residual);
  if (head_ss) dss = up(*head_ss);
  cuda::ops::PrologueArgs pa{cuda::ops::Prologue(prologue), dn.data<float>(), dg.data<float>(), head, eps};
  if (head_ss) pa.head_ss = dss.data<float>(), pa.ss_parts = ss_parts;
  cuda::ops::matvec(nullptr, dx.data<float>(), pa, {{&dm.m, out.data<float>(), residual ? dr.data<float>() : nullptr}});
  return down<float>(out, m.rows);
}

std::vector<float> kda_steps(KdaHost& k, std::int64_t start_pos, std::int64_t T, std::vector<float> const& xq,
                             std::vector<float> const& xk, std::vector<float> const& xv, std::vector<float> const& f,
                             std::vector<float> const& b, std::vector<float>* o_ss, std::vector<float> const* out_gate,
                             std::vector<float> const* out_norm_w) {
  std::int64_t const nss = std::int64_t(k.heads) * cuda::kda_ss_parts(k.head_dim);
  if (o_ss) o_ss->clear();
  std::int64_t const P = std::int64_t(k.heads) * k.head_dim;
  auto dw = up(k.conv_w), da = up(k.a_log), ddt = up(k.dt_bias), ds = up(k.state), dring = up(k.ring);
  auto dq = up(xq), dk = up(xk), dv = up(xv), df = up(f), db = up(b);
  auto dpos = up(std::vector<std::int32_t>{0});
  auto out = poisoned(std::size_t(T * P));
  DeviceBuffer dog, dow;
  if (out_gate && out_norm_w) dog = up(*out_gate), dow = up(*out_norm_w);
  for (std::int64_t t = 0; t < T; ++t) {
    std::int32_t pos = std::int32_t(start_pos + t);
    dpos.upload(&pos, 4);
    cuda::KdaStepArgs a;
    a.heads = k.heads;
    a.head_dim = k.head_dim;
    a.conv_kernel = k.conv_kernel;
    a.safe_gate = k.safe_gate;
    a.lower_bound = k.lower_bound;
    a.x_q = dq.data<float>() + t * P;
    a.x_k = dk.data<float>() + t * P;
    a.x_v = dv.data<float>() + t * P;
    a.f = df.data<float>() + t * P;
    a.b = db.data<float>() + t * k.heads;
    a.conv_w = dw.data<float>();
    a.a_log = da.data<float>();
    a.dt_bias = ddt.data<float>();
    a.ring = dring.data<float>();
    a.state = ds.data<float>();
    a.o = out.data<float>() + t * P;
    if (out_gate && out_norm_w) a.out_gate = dog.data<float>() + t * P, a.out_norm_w = dow.data<float>();
    a.position = dpos.data<std::int32_t>();
    a.state_before_wait = t % 2 == 1;  // both orders (the steps are synchronized, so either is safe here)
    DeviceBuffer dss;
    if (o_ss) {
      dss = poisoned(std::size_t(nss));
      a.o_ss = dss.data<float>();
    }
    cuda::kda_step(a);
    check(cudaDeviceSynchronize(), "kda step");
    if (o_ss) {
      auto part = down<float>(dss, std::size_t(nss));
      o_ss->insert(o_ss->end(), part.begin(), part.end());
    }
  }
  k.state = down<float>(ds, k.state.size());
  k.ring = down<float>(dring, k.ring.size());
  return down<float>(out, std::size_t(T * P));
}

MlaOut mla_decode(cuda::MlaDims const& d, HostMatrix const& kv_b, std::vector<float> const& q,
                  std::vector<float> const& kv_a, std::vector<float> const& kv_norm,
                  std::vector<std::uint16_t> const& cache, std::int64_t pos, int splits, std::vector<float> const& gate,
                  int gate_mode, int kernel, int min_chunk, int combine, bool model_args) {
  DevMatrix w(kv_b);
  std::int64_t const L = d.latent();
  std::int64_t const max_ctx = pos + 1;
  std::vector<std::uint16_t> c(std::size_t(max_ctx * L), 0xFFFF);  // row pos poisoned
  std::memcpy(c.data(), cache.data(), std::size_t(pos * L) * 2);
  auto dc = up(c), dq = up(q), dkv = up(kv_a), dn = up(kv_norm), dg = up(gate);
  auto dpos = up(std::vector<std::int32_t>{std::int32_t(pos)});
  auto qhat = poisoned(std::size_t(d.heads) * L);
  auto po = poisoned(std::size_t(splits) * d.heads * d.rank);
  auto pml = poisoned(std::size_t(splits) * d.heads * 2);
  auto olat = poisoned(std::size_t(d.heads) * d.rank);
  auto out = poisoned(std::size_t(d.heads) * d.v);
  cuda::MlaDecodeArgs a;
  a.d = d;
  a.q = dq.data<float>();
  a.kv_a = dkv.data<float>();
  a.kv_norm = dn.data<float>();
  a.kv_b = w.m;
  a.cache = dc.data<std::uint16_t>();
  a.max_ctx = max_ctx;
  a.position = dpos.data<std::int32_t>();
  a.q_hat = qhat.data<float>();
  a.splits = splits;
  a.part_o = po.data<float>();
  a.part_ml = pml.data<float>();
  a.o_lat = olat.data<float>();
  a.kernel = kernel;
  a.min_chunk = min_chunk;
  a.combine = combine;
  DeviceBuffer rope_cs;
  if (model_args) {
    rope_cs = poisoned(std::size_t(cuda::kMlaShortMaxLen) * std::max(d.rope, 1));
    cuda::mla_rope_table(rope_cs.data<float>(), d, nullptr);
    a.rope_cs = rope_cs.data<float>();
    a.early = true;  // nothing runs before it here
  }
  cuda::mla_decode(a, dg.data<float>(), gate_mode, out.data<float>());
  MlaOut r;
  r.cluster = kernel == cuda::kMlaShortClusterKernel && cuda::mla_short_cluster_fits(a);
  r.out = down<float>(out, std::size_t(d.heads) * d.v);
  r.q_hat = down<float>(qhat, std::size_t(d.heads) * L);
  auto all = down<std::uint16_t>(dc, c.size());
  for (std::int64_t i = 0; i < L; ++i) r.new_row.push_back(to_float(Bfloat16{all[std::size_t(pos * L + i)]}));
  return r;
}

RouterOut router(HostMatrix const& w, std::vector<float> const& x, std::vector<float> const& norm_w, std::vector<float> const& bias,
                 int n_group, int topk_group, int top_k, bool norm_topk, float scaling, int prologue) {
  DevMatrix dm(w);
  auto dx = up(x), dn = up(norm_w), db = up(bias);
  auto logits = poisoned(w.rows);
  auto idx = poisoned(top_k), wts = poisoned(top_k);
  auto counter = up(std::vector<unsigned>{0});
  cuda::ops::PrologueArgs pa{cuda::ops::Prologue(prologue), dn.data<float>(), nullptr, 0, 1e-6f};
  cuda::ops::RouterArgs ra{logits.data<float>(), bias.empty() ? nullptr : db.data<float>(), int(w.rows), n_group, topk_group, top_k,
                           norm_topk, scaling, idx.data<int>(), wts.data<float>(), counter.data<unsigned>()};
  cuda::ops::router(nullptr, dx.data<float>(), pa, dm.m, ra);
  RouterOut r;
  r.idx = down<int>(idx, top_k);
  r.w = down<float>(wts, top_k);
  r.logits = down<float>(logits, w.rows);
  auto cnt = down<unsigned>(counter, 1);
  if (cnt[0] != 0) r.idx.assign(top_k, -1);  // the counter must be back at rest
  return r;
}

std::vector<float> moe(std::vector<HostMatrix> const& gate, std::vector<HostMatrix> const& upm, std::vector<HostMatrix> const& dn,
                       std::vector<HostMatrix> const& shared, std::vector<float> const& x, std::vector<float> const& norm_w,
                       std::vector<int> const& idx, std::vector<float> const& wts, float limit, float shared_limit,
                       std::vector<float> const& residual, int prologue) {
  auto stack = [](std::vector<HostMatrix> const& ms, bool scales) {
    std::vector<unsigned char> v;
    for (auto const& m : ms) {
      auto const& src = scales ? m.scales : m.data;
      v.insert(v.end(), src.begin(), src.end());
    }
    return v;
  };
  std::int64_t hidden = std::int64_t(x.size());
  auto g_w = up(stack(gate, false)), g_s = up(stack(gate, true)), u_w = up(stack(upm, false)), u_s = up(stack(upm, true));
  auto dn_w = up(stack(dn, false)), dn_s = up(stack(dn, true));
  std::vector<std::unique_ptr<DevMatrix>> sh;
  for (auto const& m : shared) sh.push_back(std::make_unique<DevMatrix>(m));
  auto dx = up(x), dnw = up(norm_w), didx = up(idx), dwts = up(wts), dres = up(residual);
  int top_k = int(idx.size());
  int inter = gate.empty() ? 0 : int(gate[0].rows);
  int sinter = shared.empty() ? 0 : int(shared[0].rows);
  auto act = poisoned(std::size_t(top_k * inter + sinter));
  auto out = poisoned(std::size_t(hidden));
  cuda::ops::MoeArgs a;
  if (!gate.empty()) {
    a.g_w = g_w.data();
    a.g_s = g_s.data();
    a.u_w = u_w.data();
    a.u_s = u_s.data();
    a.dn_w = dn_w.data();
    a.dn_s = dn_s.data();
    a.gu_stride_w = std::int64_t(gate[0].data.size());
    a.gu_stride_s = std::int64_t(gate[0].scales.size());
    a.dn_stride_w = std::int64_t(dn[0].data.size());
    a.dn_stride_s = std::int64_t(dn[0].scales.size());
  }
  a.top_k = top_k;
  a.experts = int(gate.size());
  a.inter = inter;
  a.sel_idx = didx.data<int>();
  a.sel_w = dwts.data<float>();
  a.limit = limit;
  if (!shared.empty()) {
    a.sg_w = sh[0]->m.data;
    a.sg_s = sh[0]->m.scales;
    a.su_w = sh[1]->m.data;
    a.su_s = sh[1]->m.scales;
    a.sdn_w = sh[2]->m.data;
    a.sdn_s = sh[2]->m.scales;
  }
  a.shared_inter = sinter;
  a.shared_limit = shared_limit;
  a.hidden = int(hidden);
  a.act = act.data<float>();
  cuda::ops::PrologueArgs pa{cuda::ops::Prologue(prologue), dnw.data<float>(), nullptr, 0, 1e-6f};
  cuda::ops::moe(nullptr, dx.data<float>(), pa, a, gate.empty() ? cuda::MatFormat::kF32 : gate[0].format,
                 shared.empty() ? cuda::MatFormat::kF32 : shared[0].format, dres.data<float>(), out.data<float>());
  return down<float>(out, std::size_t(hidden));
}

HeadOut head(HostMatrix const& w, std::vector<float> const& x, std::vector<float> const& norm_w) {
  DevMatrix dm(w);
  auto dx = up(x), dn = up(norm_w);
  auto logits = poisoned(w.rows);
  auto tok = poisoned(1);
  auto key = up(std::vector<unsigned long long>{0});
  auto counter = up(std::vector<unsigned>{0});
  cuda::ops::PrologueArgs pa{cuda::ops::Prologue::kRmsNorm, dn.data<float>(), nullptr, 0, 1e-6f};
  cuda::ops::head(nullptr, dx.data<float>(), pa, dm.m, logits.data<float>(),
                  {key.data<unsigned long long>(), counter.data<unsigned>(), tok.data<int>()});
  HeadOut r;
  r.logits = down<float>(logits, w.rows);
  r.argmax = down<int>(tok, 1)[0];
  return r;
}

}  // namespace ling::test_gpu
