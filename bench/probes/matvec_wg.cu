// Probe: the KDA projections' matvec (six block-FP8 matrices of 2560 columns, 20 512 rows, 52.5 MB, the RMSNorm
// prologue) as a chain of 35 launches over fresh weights (one copy per layer, PDL between them), on the CUDA-core
// kernel the model runs (launch_matvec_args) and on the wgmma kernel with tensor-map copies (matvec_wg.cuh), each
// alone and in turns, µs per launch (best of 7 × 10 graph replays). Also o_proj's shape (2560 × 4096, 10.5 MB).
// Built as the target matvec_wg (CUDA builds).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ling/cuda/matvec_wg.cuh"
#include "probe_util.cuh"

namespace {

namespace k = ling::cuda::kernels;
using P = ling::quant::Fp8Block;
using ling::cuda::DeviceMatrix;

struct Layer {
  std::vector<DeviceMatrix<P>> m;
  k::MultiArgs a{};
};

}  // namespace

int main() {
  constexpr int kLayers = 35;
  struct Shape {
    char const* name;
    std::int64_t cols;
    std::vector<std::int64_t> rows;
  };
  float* x;
  float* y;
  float* nw;
  CK(cudaMalloc(&x, 8192 * sizeof(float)));
  CK(cudaMalloc(&y, 32768 * sizeof(float)));
  CK(cudaMalloc(&nw, 8192 * sizeof(float)));
  std::vector<float> hx(8192);
  for (std::size_t i = 0; i < hx.size(); ++i) hx[i] = float(int(i * 2654435761u >> 20) % 200 - 100) / 50.f;
  CK(cudaMemcpy(x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(nw, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (Shape const& sh :
       {Shape{"KDA projections", 2560, {4096, 4096, 4096, 4096, 4096, 32}}, Shape{"o_proj", 4096, {2560}}}) {
    std::vector<Layer> layers(kLayers);
    double bytes = 0;
    for (Layer& l : layers) {
      for (std::int64_t r : sh.rows) {
        l.m.push_back(DeviceMatrix<P>::allocate(r, sh.cols));
        DeviceMatrix<P> const& d = l.m.back();
        CK(cudaMemset(d.data(), 0x31, std::size_t(d.rows() * d.ld())));
        CK(cudaMemset(d.scales(), 0x3c, std::size_t(P::scale_count(r, sh.cols)) * sizeof(float)));
      }
      std::vector<DeviceMatrix<P> const*> ptrs;
      for (auto const& d : l.m) ptrs.push_back(&d);
      bool ok = false;
      l.a = k::multi_args<P>(ptrs.data(), int(ptrs.size()), y, nullptr, ok);
      if (!ok) {
        std::printf("multi_args refused\n");
        return 1;
      }
    }
    for (auto const& d : layers[0].m) bytes += double(d.bytes_per_matrix());
    ling::cuda::InputPrologue pro;
    pro.kind = ling::cuda::PrologueKind::kRmsNorm;
    pro.norm_w = nw;
    std::printf("%s: %.1f MB per launch, %d launches\n", sh.name, bytes / 1e6, kLayers);
    auto chain = [&](int which, int R) {  // which: 0 CUDA cores, 1 wgmma, 2 in turns
      return probe::time_graph(st, kLayers, [&] {
        for (int i = 0; i < kLayers; ++i) {
          bool const wg = which == 1 || (which == 2 && i % 2 == 1);
          cudaError_t const e = wg ? k::launch_matvec_wg_args<P>(layers[std::size_t(i)].a, x, pro, st, R)
                                   : k::launch_matvec_args<P>(layers[std::size_t(i)].a, x, pro, {}, st);
          CK(e);
        }
      });
    };
    auto report = [&](char const* name, float us) {
      std::printf("  %-34s %8.2f us %8.0f GB/s\n", name, us, bytes / (us * 1e-6) / 1e9);
    };
    report("CUDA cores (the model's kernel)", chain(0, 0));
    report("wgmma, R chosen", chain(1, 0));
    report("wgmma, R 32", chain(1, 32));
    report("wgmma, R 64", chain(1, 64));
    report("in turns (chosen R)", chain(2, 0));
    // one wgmma launch after a CUDA-core one, its blocks' measurement points (medians over blocks, µs after the
    // first block's entry; waits in µs of SM cycles at 1.98 GHz)
    {
      unsigned long long* dbg;
      std::size_t const n = std::size_t(k::kWgvDbg) * 132;
      CK(cudaMalloc(&dbg, n * sizeof(unsigned long long)));
      CK(cudaMemset(dbg, 0, n * sizeof(unsigned long long)));
      for (int rep = 0; rep < 3; ++rep) {
        CK(k::launch_matvec_args<P>(layers[0].a, x, pro, {}, st));
        CK(k::launch_matvec_wg_args<P>(layers[1].a, x, pro, st, 0, dbg));
      }
      CK(cudaStreamSynchronize(st));
      std::vector<unsigned long long> h(n);
      CK(cudaMemcpy(h.data(), dbg, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
      int const blocks = int(std::min<std::int64_t>(132, layers[1].a.task_begin[layers[1].a.count]));
      unsigned long long t0 = ~0ull;
      for (int b = 0; b < blocks; ++b) t0 = std::min(t0, h[std::size_t(b) * k::kWgvDbg]);
      char const* names[k::kWgvDbg] = {
          "entry",        "producer started",  "PDL wait passed",     "input staged",
          "input load back", "first slot landed", "consumer waits (us)", "producer waits (us)",
          "end",          "wgmma waits (us)",  "proxy fence passed", "staging barrier"};
      for (int i = 0; i < k::kWgvDbg; ++i) {
        std::vector<double> v;
        for (int b = 0; b < blocks; ++b) {
          double const raw = double(h[std::size_t(b) * k::kWgvDbg + std::size_t(i)]);
          v.push_back(i == 6 || i == 7 || i == 9 ? raw / 1980.0 : (raw - double(t0)) * 1e-3);
        }
        std::printf("    %-22s median %8.2f  max %8.2f\n", names[i], probe::quantile(v, 0.5), probe::quantile(v, 1.0));
      }
      CK(cudaFree(dbg));
    }
  }
  CK(cudaStreamSynchronize(st));
  return 0;
}
