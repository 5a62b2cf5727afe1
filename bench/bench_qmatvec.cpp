// Google Benchmark: the GGUF block matvec kernels (llm/qmatvec.h) against OpenBLAS on the
// f32 copy, one thread, at SmolLM2-135M shapes, for n = 1..16 rows of x. Used to choose how
// many rows still go to the block kernels in LlamaModel (kBlockKernelMaxRows in model.cpp).
//   ./build/bench_qmatvec --benchmark_filter='576x1536' --benchmark_min_time=0.5
// Name: <kernel>/<type>/<in>x<out>/<n rows>; rows/s = rows of x per second. These matrices
// stay in cache between iterations, which flatters the f32 path: Stack/<kernel>/<n> runs every
// projection of one SmolLM2-135M forward (30 layers of Q4_1 q, k, v, o, gate, up, down and the
// 49152-row Q8_0 head, random weights: 538 MB as f32) for n rows, streaming from memory as a
// real decode step does (the threshold in model.cpp comes from this one).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "bench_main.h"
#include "llm/qmatvec.h"
#include "tq/common.h"
#include "tq/gguf.h"
#include "tq/model.h"
#include "tq/simd.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace {

struct Mat {
  std::vector<uint8_t> blocks;
  std::vector<float> f;
};

Mat make(tq::GgmlType t, int in, int out) {
  tq::Rng r(3);
  std::vector<float> w(static_cast<size_t>(in) * out);
  for (auto& v : w) v = static_cast<float>(r.normal() * 0.05);
  Mat m;
  m.blocks.resize(tq::ggml_row_bytes(t, w.size()));
  tq::quantize_row(t, w.data(), m.blocks.data(), w.size());
  m.f.resize(w.size());
  tq::dequantize_row(t, m.blocks.data(), m.f.data(), w.size());
  return m;
}

void run(benchmark::State& st, tq::GgmlType t, int in, int out, bool blas) {
  openblas_set_num_threads(1);
  const int n = static_cast<int>(st.range(0));
  static std::vector<std::pair<std::string, Mat>> cache;
  const std::string key = std::string(tq::ggml_type_name(t)) + std::to_string(in) + "x" + std::to_string(out);
  Mat* m = nullptr;
  for (auto& p : cache)
    if (p.first == key) m = &p.second;
  if (!m) {
    cache.emplace_back(key, make(t, in, out));
    m = &cache.back().second;
  }
  tq::Rng r(5);
  std::vector<float> x(static_cast<size_t>(n) * in), y(static_cast<size_t>(n) * out);
  for (auto& v : x) v = static_cast<float>(r.normal());
  for (auto _ : st) {
    if (blas) {
      if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, m->f.data(), in, x.data(), 1, 0.0f, y.data(), 1);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x.data(), in, m->f.data(), in, 0.0f,
                    y.data(), out);
    } else {
      tq::llm::qmatvec(t, m->blocks.data(), in, out, x.data(), n, y.data(), out, 1);
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["rows/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * n, benchmark::Counter::kIsRate);
}

// The projections of one forward of the default model, each matrix its own allocation.
struct StackMat {
  tq::GgmlType t;
  int in, out;
  Mat m;
};
std::vector<StackMat>& stack() {
  static std::vector<StackMat> s = [] {
    std::vector<StackMat> v;
    const int E = 576, KV = 192, F = 1536;
    for (int l = 0; l < 30; ++l)
      for (auto [in, out] : {std::pair{E, E}, {E, KV}, {E, KV}, {E, E}, {E, F}, {E, F}, {F, E}})
        v.push_back({tq::GgmlType::Q4_1, in, out, make(tq::GgmlType::Q4_1, in, out)});
    v.push_back({tq::GgmlType::Q8_0, E, 49152, make(tq::GgmlType::Q8_0, E, 49152)});
    return v;
  }();
  return s;
}

void run_stack(benchmark::State& st, bool blas) {
  openblas_set_num_threads(1);
  const int n = static_cast<int>(st.range(0));
  auto& s = stack();
  tq::Rng r(5);
  std::vector<float> x(static_cast<size_t>(n) * 1536), y(static_cast<size_t>(n) * 49152);
  for (auto& v : x) v = static_cast<float>(r.normal());
  for (auto _ : st) {
    for (auto& sm : s) {
      if (blas) {
        if (n == 1)
          cblas_sgemv(CblasRowMajor, CblasNoTrans, sm.out, sm.in, 1.0f, sm.m.f.data(), sm.in, x.data(), 1, 0.0f,
                      y.data(), 1);
        else
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, sm.out, sm.in, 1.0f, x.data(), sm.in,
                      sm.m.f.data(), sm.in, 0.0f, y.data(), sm.out);
      } else {
        tq::llm::qmatvec(sm.t, sm.m.blocks.data(), sm.in, sm.out, x.data(), n, y.data(), sm.out, 1);
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["rows/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * n, benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(run_stack, block, false)->DenseRange(1, 8)->Arg(12)->Arg(16)->Arg(24)->Arg(32)->Arg(48)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run_stack, blas, true)->DenseRange(1, 8)->Arg(12)->Arg(16)->Arg(24)->Arg(32)->Arg(48)->Unit(benchmark::kMillisecond);

void args(benchmark::internal::Benchmark* b) {
  for (int n : {1, 2, 3, 4, 5, 6, 8, 12, 16}) b->Arg(n);
}

#define TQ_QMV_BENCH(T, IN, OUT)                                                                          \
  BENCHMARK_CAPTURE(run, block/T/IN##x##OUT, tq::GgmlType::T, IN, OUT, false)->Apply(args);              \
  BENCHMARK_CAPTURE(run, blas/T/IN##x##OUT, tq::GgmlType::T, IN, OUT, true)->Apply(args);

TQ_QMV_BENCH(Q4_1, 576, 576)
TQ_QMV_BENCH(Q4_1, 576, 1536)
TQ_QMV_BENCH(Q4_1, 1536, 576)
TQ_QMV_BENCH(Q8_0, 576, 49152)

// Every weight type, one row of x (decode), 1 thread: the SIMD kernels (qmatvec at the best
// level of the host) against the scalar reference (qmatvec_ref), at Gemma 3 270M shapes.
// Name: fmt/<simd|ref>/<type>/<in>x<out>. Random blocks (random codes, fp16 scales about
// 1e-3) for every block type; random floats for F32 / F16 / BF16. K-quants need in % 256 == 0,
// so only 2048x640 for them.
std::vector<uint8_t> random_matrix(tq::GgmlType t, int in, int out) {
  tq::Rng r(11);
  const size_t n = static_cast<size_t>(in) * out;
  std::vector<uint8_t> b(tq::ggml_row_bytes(t, n));
  if (tq::ggml_block_size(t) == 1) {
    std::vector<float> w(n);
    for (auto& v : w) v = static_cast<float>(r.normal() * 0.05);
    tq::quantize_row(t, w.data(), b.data(), n);
    return b;
  }
  for (auto& v : b) v = static_cast<uint8_t>(r.next_u64());
  const size_t bs = tq::ggml_block_size(t), bb = tq::ggml_block_bytes(t);
  std::vector<size_t> at = {0};  // byte offsets of the fp16 scales in a block
  if (t == tq::GgmlType::Q4_1 || t == tq::GgmlType::Q5_1 || t == tq::GgmlType::Q4_K || t == tq::GgmlType::Q5_K)
    at.push_back(2);
  if (t == tq::GgmlType::Q6_K) at = {208};
  for (size_t k = 0; k < n / bs; ++k)
    for (size_t a : at) {
      const uint16_t h = tq::fp32_to_fp16(static_cast<float>(1e-3 * (0.5 + r.uniform())));
      std::memcpy(b.data() + k * bb + a, &h, 2);
    }
  return b;
}

void run_fmt(benchmark::State& st, tq::GgmlType t, int in, int out, bool simd) {
  const std::vector<uint8_t> w = random_matrix(t, in, out);
  tq::Rng r(5);
  std::vector<float> x(in), y(out);
  for (auto& v : x) v = static_cast<float>(r.normal());
  for (auto _ : st) {
    if (simd) tq::llm::qmatvec(t, w.data(), in, out, x.data(), 1, y.data(), out, 1);
    else tq::llm::qmatvec_ref(t, w.data(), in, out, x.data(), 1, y.data(), out);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["weights/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * in * out,
                                                benchmark::Counter::kIsRate);
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * w.size() / 1e9,
                                           benchmark::Counter::kIsRate);
}

#define TQ_FMT_BENCH(T, IN, OUT)                                                                  \
  BENCHMARK_CAPTURE(run_fmt, simd/T/IN##x##OUT, tq::GgmlType::T, IN, OUT, true)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(run_fmt, ref/T/IN##x##OUT, tq::GgmlType::T, IN, OUT, false)->Unit(benchmark::kMicrosecond);
#define TQ_FMT_BOTH(T) TQ_FMT_BENCH(T, 640, 2048) TQ_FMT_BENCH(T, 2048, 640)
TQ_FMT_BOTH(F32)
TQ_FMT_BOTH(F16)
TQ_FMT_BOTH(BF16)
TQ_FMT_BOTH(Q4_0)
TQ_FMT_BOTH(Q4_1)
TQ_FMT_BOTH(Q5_0)
TQ_FMT_BOTH(Q5_1)
TQ_FMT_BOTH(Q8_0)
TQ_FMT_BENCH(Q4_K, 2048, 640)
TQ_FMT_BENCH(Q5_K, 2048, 640)
TQ_FMT_BENCH(Q6_K, 2048, 640)

// Gemma 3 270M decode at its real weight types (tq bench model's model file): every projection
// of one decode step (18 layers of Q5_0 q / k / gate / up, Q8_0 v, Q4_K o, Q6_K down, and the
// tied 262144 x 640 Q8_0 output matrix: 247 MB of random blocks, streamed from memory) for one
// row of x, at 1 and 2 threads (the OpenMP split of qmatvec). GemmaHead: the output matrix
// alone. Read: a plain 2-thread sum over the same bytes (the memory roofline of this host).
struct GemmaMat {
  tq::GgmlType t;
  int in, out;
  std::vector<uint8_t> w;
};
std::vector<uint8_t> random_matrix(tq::GgmlType t, int in, int out);
std::vector<GemmaMat>& gemma() {
  static std::vector<GemmaMat> s = [] {
    std::vector<GemmaMat> v;
    using T = tq::GgmlType;
    for (int l = 0; l < 18; ++l)
      for (auto [t, in, out] : {std::tuple{T::Q5_0, 640, 1024}, {T::Q5_0, 640, 256}, {T::Q8_0, 640, 256},
                                {T::Q4_K, 1024, 640}, {T::Q5_0, 640, 2048}, {T::Q5_0, 640, 2048},
                                {T::Q6_K, 2048, 640}})
        v.push_back({t, in, out, random_matrix(t, in, out)});
    v.push_back({T::Q8_0, 640, 262144, random_matrix(T::Q8_0, 640, 262144)});
    return v;
  }();
  return s;
}

void run_gemma(benchmark::State& st, bool head_only) {
  const int threads = static_cast<int>(st.range(0));
  auto& s = gemma();
  tq::Rng r(5);
  std::vector<float> x(2048), y(262144);
  for (auto& v : x) v = static_cast<float>(r.normal());
  double bytes = 0;
  for (auto _ : st) {
    for (size_t i = head_only ? s.size() - 1 : 0; i < s.size(); ++i) {
      tq::llm::qmatvec(s[i].t, s[i].w.data(), s[i].in, s[i].out, x.data(), 1, y.data(), s[i].out, threads);
      bytes += static_cast<double>(s[i].w.size());
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(run_gemma, GemmaStack, false)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(run_gemma, GemmaHead, true)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// Gemma 3 270M prefill: one layer's projections (the shapes and types above) for 512 rows of
// x through qgemm, 1 thread. Arg 0: the best level (the integer-activation GEMM on AVX-512
// hosts, vpdpwssd with VNNI); arg 1: the float path (OpenBLAS sgemm on dequantized panels; run
// at the avx2 level, where qgemm takes it); arg 2: the avx3 level (the GEMM without VNNI);
// arg 3: the decode kernels (qmatvec: passes of 8 rows of x over the weights) for all 512. Rows/s = rows of x through the whole layer per second.
void run_gemma_prefill(benchmark::State& st) {
  openblas_set_num_threads(1);
  const int mode = static_cast<int>(st.range(0));
  auto& s = gemma();
  constexpr int n = 512;
  tq::Rng r(5);
  std::vector<float> x(static_cast<size_t>(n) * 2048), y(static_cast<size_t>(n) * 2048);
  for (auto& v : x) v = static_cast<float>(r.normal());
  tq::simd::ScopedLevel sl(mode == 1 ? "avx2" : mode == 2 ? "avx3" : "auto");
  for (auto _ : st) {
    for (size_t i = 0; i < 7; ++i) {
      if (mode == 3) tq::llm::qmatvec(s[i].t, s[i].w.data(), s[i].in, s[i].out, x.data(), n, y.data(), s[i].out, 1);
      else tq::llm::qgemm(s[i].t, s[i].w.data(), s[i].in, s[i].out, x.data(), n, y.data(), s[i].out, 1);
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["rows/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * n, benchmark::Counter::kIsRate);
}
BENCHMARK(run_gemma_prefill)->Name("GemmaPrefillLayer")->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

void run_read(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const auto& w = gemma().back().w;
  const auto* p = reinterpret_cast<const uint64_t*>(w.data());
  const int64_t n = static_cast<int64_t>(w.size() / 8);
  for (auto _ : st) {
    uint64_t acc = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; ++i) acc += p[i];
    benchmark::DoNotOptimize(acc);
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * w.size() / 1e9,
                                           benchmark::Counter::kIsRate);
}
BENCHMARK(run_read)->Name("GemmaHeadRead")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The serial pieces of a Gemma 3 decode step around the matvecs: greedy argmax over the
// 262,144 logits (tq::argmax; arg 1: the plain loop it replaced) and the 16-bit rounding of
// one 2048-value activation row (arg 0: quantize_x16_avx512, which qmatvec uses on AVX-512
// hosts; arg 1: the scalar reference quantize_x16).
void run_argmax(benchmark::State& st) {
  std::vector<float> x(262144);
  tq::Rng r(3);
  for (auto& v : x) v = static_cast<float>(r.normal());
  const bool loop = st.range(0) == 1;
  int i = 0;
  for (auto _ : st) {
    x[i++ & 1023] += 1e-3f;  // a new input each time
    int32_t best = 0;
    if (loop) {
      for (int k = 1; k < static_cast<int>(x.size()); ++k)
        if (x[k] > x[best]) best = k;
    } else {
      best = tq::argmax(x.data(), static_cast<int>(x.size()));
    }
    benchmark::DoNotOptimize(best);
  }
}
BENCHMARK(run_argmax)->Name("Argmax262144")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void run_quantize_x16(benchmark::State& st) {
  constexpr int in = 2048;
  std::vector<float> x(in), d(in / 32), s(in / 32);
  std::vector<int16_t> q(in);
  tq::Rng r(4);
  for (auto& v : x) v = static_cast<float>(r.normal());
  const bool avx512 = st.range(0) == 0;
  if (avx512 && !tq::llm::detail::qmv16_avx512_host_ok()) {
    st.SkipWithError("no AVX-512");
    return;
  }
  for (auto _ : st) {
    if (avx512) tq::llm::detail::quantize_x16_avx512(x.data(), 1, in, q.data(), d.data(), s.data());
    else tq::llm::detail::quantize_x16(x.data(), 1, in, q.data(), d.data(), s.data());
    benchmark::DoNotOptimize(q.data());
  }
}
BENCHMARK(run_quantize_x16)->Name("QuantizeX16_2048")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) { return run_benchmarks(argc, argv); }
