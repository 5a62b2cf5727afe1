// Google Benchmark micro-benchmarks of the codec kernels (CPU time per vector).
// Run: build/bench_codec --benchmark_filter=Encode
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_main.h"
#include "tq/distortion.h"
#include "tq/quantizer.h"
#include "tq/simd.h"
#include "tq/trellis.h"

namespace {

const char* kRot[] = {"haar", "hadamard", "block32", "givens", "iso4"};

struct Fixture {
  std::unique_ptr<tq::Quantizer> q;
  std::vector<float> x, y, state, scores;
  std::vector<uint8_t> codes;
  size_t n;
  Fixture(int d, int b, const char* rot, size_t n_) : n(n_) {
    tq::QuantizerConfig cfg;
    cfg.dim = d;
    cfg.bits = b;
    cfg.rotation = tq::parse_rotation(rot);
    q = tq::make_quantizer(tq::QuantizerKind::mse, cfg);
    x.resize(n * d);
    y.resize(n * d);
    tq::random_unit_vectors(n, d, 1, x.data());
    codes.resize(n * q->code_bytes());
    q->encode(n, x.data(), codes.data());
    state.resize(q->query_state_floats());
    q->prepare_query(x.data(), state.data());
    scores.resize(n);
  }
};

void BM_Encode(benchmark::State& st) {
  Fixture f(static_cast<int>(st.range(0)), static_cast<int>(st.range(1)), kRot[st.range(2)], 4096);
  for (auto _ : st) f.q->encode(f.n, f.x.data(), f.codes.data());
  st.SetItemsProcessed(st.iterations() * f.n);
  st.SetLabel(kRot[st.range(2)]);
}
void BM_Decode(benchmark::State& st) {
  Fixture f(static_cast<int>(st.range(0)), static_cast<int>(st.range(1)), kRot[st.range(2)], 4096);
  for (auto _ : st) f.q->decode(f.n, f.codes.data(), f.y.data());
  st.SetItemsProcessed(st.iterations() * f.n);
  st.SetLabel(kRot[st.range(2)]);
}
void BM_Score(benchmark::State& st) {
  Fixture f(static_cast<int>(st.range(0)), static_cast<int>(st.range(1)), kRot[st.range(2)], 4096);
  for (auto _ : st) f.q->score(f.state.data(), f.n, f.codes.data(), f.scores.data());
  st.SetItemsProcessed(st.iterations() * f.n);
  st.SetLabel(kRot[st.range(2)]);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int d : {64, 128, 1536})
    for (int bits : {2, 3, 4})
      for (int r = 0; r < 5; ++r) b->Args({d, bits, r});
}

// The trellis encoder (two Viterbi passes a vector): what a trellis-coded KV cache pays per
// row part on its write path. 256 random unit vectors of dim d, codes of `bits` bits.
void BM_TrellisEncode(benchmark::State& st) {
  const int d = static_cast<int>(st.range(0)), bits = static_cast<int>(st.range(1));
  const tq::TrellisCode& tc = tq::get_trellis(d, bits);
  const size_t n = 256;
  std::vector<float> x(n * d);
  tq::random_unit_vectors(n, d, 1, x.data());
  std::vector<uint8_t> codes(d);
  for (auto _ : st)
    for (size_t i = 0; i < n; ++i) {
      tq::trellis_encode(tc, x.data() + i * d, codes.data());
      benchmark::DoNotOptimize(codes.data());
    }
  st.SetItemsProcessed(st.iterations() * n);
}

BENCHMARK(BM_Encode)->Apply(Args);
BENCHMARK(BM_TrellisEncode)->ArgsProduct({{64, 128, 256}, {2, 3, 4}});
BENCHMARK(BM_Decode)->Apply(Args);
BENCHMARK(BM_Score)->Apply(Args);

}  // namespace

int main(int argc, char** argv) { return run_benchmarks(argc, argv); }
