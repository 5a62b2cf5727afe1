// Trellis-coded scalar quantization of the rotated coordinates (a "bit-shift" trellis, as in
// QTIP, Tseng et al. 2024): a vector of D coordinates is stored as D codes of B bits, the same
// bytes as the scalar Lloyd-Max code, but coordinate i is reconstructed from a window of the
// concatenated code bits, lut[w_i] with w_i = the last S + B bits of the stream up to and
// including code i (circular: the first coordinates' windows wrap around to the last codes,
// "tail-biting"). The encoder picks the whole code sequence at once with the Viterbi
// algorithm over the 2^S trellis states (the S bits before each code). For an i.i.d. source
// this is trellis-coded quantization: with a 256-entry table, 0.71 / 0.67 of the Lloyd-Max
// scalar code's MSE at 2 / 3 bits and D = 64 (docs/design.md, "Trellis codes").
//
// The table is trained for the coordinate law of a random point on S^{D-1} (the same law as
// the codebooks in codebook.h) by alternating Viterbi encoding of sample vectors and centroid
// updates from a fixed seed: deterministic, cached per (D, B) for the life of the process.
#pragma once

#include <cstdint>
#include <vector>

namespace tq {

struct TrellisCode {
  int dim = 0;         // coordinates per vector (the circular window wraps at dim)
  int bits = 0;        // B: bits per coordinate (per code)
  int state_bits = 0;  // S: trellis state bits; the table has 2^(B + S) entries
  std::vector<float> lut;  // reconstruction values in units of t (coordinates of a unit vector)
  double mse_per_coord = 0;  // E[(t - t_hat)^2] per coordinate on held-out samples
  int window_bits() const noexcept { return bits + state_bits; }
  // Table index of coordinate i from the codes of one vector (codes[j] < 2^bits).
  unsigned window(const uint8_t* codes, int i) const noexcept {
    unsigned w = 0;
    for (int sh = 0, j = i; sh < window_bits(); sh += bits, j = j == 0 ? dim - 1 : j - 1)
      w |= (unsigned)codes[j] << sh;
    return w & ((1u << window_bits()) - 1);
  }
};

// The cached trellis code for (dim, bits): S = 8 - bits (a 256-entry table) for 1 <= bits <= 4
// (at 5+ bits a table of this size trains to codes no better than Lloyd-Max).
// Needs dim * bits >= 8 and dim >= 2; else tq::Error. Thread-safe.
const TrellisCode& get_trellis(int dim, int bits);
// Train without the cache (tests): n_train sample vectors, `iters` alternations.
TrellisCode train_trellis(int dim, int bits, int state_bits, uint64_t seed, int n_train, int iters);

// Codes of one vector u (dim values, units of t: any norm, the table is not rescaled) by
// tail-biting Viterbi: the path of least squared error whose last S bits are the bits before
// its first code. NaN coordinates count as 0.
void trellis_encode(const TrellisCode& tc, const float* u, uint8_t* codes);
// The same search in plain loops (the scalar level's path): the reference trellis_encode is
// tested against at every SIMD level (identical codes).
void trellis_encode_ref(const TrellisCode& tc, const float* u, uint8_t* codes);
// out[i] = lut[window(codes, i)] (the reference).
void trellis_decode(const TrellisCode& tc, const uint8_t* codes, float* out) noexcept;
// out[i] = lut[window(codes, i)] * s: SIMD (one gather per vector of lanes), identical values.
void trellis_decode_scaled(const TrellisCode& tc, const uint8_t* codes, float s, float* out) noexcept;

namespace detail {
// One SIMD Viterbi pass over D coordinates (trellis_simd.cpp): cost / next hold 2^S + 64 floats,
// back D x 2^S bytes. Returns the final state, or -1 where there is no SIMD pass (scalar
// level; state count not a multiple of the vector length): then use the reference.
int viterbi_pass_simd(const TrellisCode& tc, int D, const float* u, int start, int end, uint8_t* codes, float* cost,
                      float* next, uint8_t* back);
}  // namespace detail

}  // namespace tq
