// One 32-token block of online softmax for one head, shared by the Highway decode kernels
// (attention_simd.cpp, attention_tq_simd.cpp). Include inside HWY_NAMESPACE after
// hwy/highway.h and hwy/contrib/math/math-inl.h; the usual per-target include guard.
#if defined(TQ_KV_BLOCK_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TQ_KV_BLOCK_SOFTMAX_INL_H_
#undef TQ_KV_BLOCK_SOFTMAX_INL_H_
#else
#define TQ_KV_BLOCK_SOFTMAX_INL_H_
#endif

// s: NV vectors of raw scores (tokens v N .. v N + N - 1); tokens >= nt are masked out.
// Scales by `scale`, updates the running (m, l) of row g of st, writes the weights
// p_t = exp(s_t - m) (0 past nt) to p[0 .. NV N) and returns alpha = exp(m_old - m_new), the
// factor the row's accumulator must be multiplied by.
template <class D, class V>
HWY_INLINE float BlockSoftmax(D df, V* s, size_t NV, int nt, float scale, const States& st, int g, float* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const size_t N = hn::Lanes(df);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const V vninf = hn::Set(df, neg_inf), vscale = hn::Set(df, scale);
  V mx = vninf;
  for (size_t j = 0; j < NV; ++j) {
    const auto valid = hn::FirstN(df, (size_t)std::max(0, nt - (int)(j * N)));
    s[j] = hn::IfThenElse(valid, hn::Mul(s[j], vscale), vninf);
    mx = hn::Max(mx, s[j]);
  }
  const float mb = hn::GetLane(hn::MaxOfLanes(df, mx));
  float& m = st.m(g);
  const float m_new = std::max(m, mb);
  const float alpha = m == neg_inf ? 0.f : std::exp(m - m_new);
  m = m_new;
  const V vm = hn::Set(df, m_new);
  V sum = hn::Zero(df);
  for (size_t j = 0; j < NV; ++j) {
    const auto valid = hn::FirstN(df, (size_t)std::max(0, nt - (int)(j * N)));
    const V pj = hn::IfThenElseZero(valid, hn::Exp(df, hn::Sub(s[j], vm)));
    sum = hn::Add(sum, pj);
    hn::Store(pj, df, p + j * N);
  }
  st.l(g) = st.l(g) * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
  return alpha;
}

#endif  // TQ_KV_BLOCK_SOFTMAX_INL_H_
