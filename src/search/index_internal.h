// Internals of tq::Index shared by index.cpp (build, search) and io.cpp (persistence).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tq/codebook.h"
#include "tq/index.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"

namespace tq {

// A run of rotated channels [begin, begin + len) quantized with `bits` bits each.
struct Segment {
  int begin = 0, len = 0, bits = 0;
  const Codebook* cb = nullptr;
};

// Channels [dim0, dim0 + ndims) of one segment, bpd bits each, read as one group code
// code = sum_t idx[dim0 + t] << (t * bpd); one lookup table per group.
struct Group {
  int dim0 = 0, ndims = 0, bpd = 0;
  int gbits() const noexcept { return ndims * bpd; }
};

constexpr size_t kBlock = 32;         // vectors per fast-scan block
constexpr uint32_t kFileVersion = 1;  // io.cpp

struct Index::Impl {
  IndexConfig cfg;
  int d = 0;
  int bits_x2 = 0;
  std::unique_ptr<Rotation> rot;
  std::vector<Segment> segs;
  std::vector<Group> groups;
  size_t m = 0;        // groups
  size_t mp = 0;       // groups padded to a multiple of 4 (fast layout)
  bool fast_ok = false;  // every group has <= 4 bits
  size_t lut_stride = 16;  // float LUT entries per group
  size_t norm_bytes = 2;   // 2 (f16) or 4 (f32)
  bool has_norm = false;   // l2: ||x|| kept per vector
  size_t seg_bytes = 0;    // packed code bytes of all segments
  size_t code_bytes = 0;   // persisted bytes per vector

  size_t n = 0;
  std::vector<uint8_t> blocks;  // fast layout: ceil(n / 32) * mp * 16 bytes
  std::vector<uint8_t> gcodes;  // other widths: n * m bytes
  std::vector<float> scale;     // n (padded with zeros to whole blocks): multiplies <Pi q, c>
  std::vector<float> norm;      // n (padded likewise): ||x|| (l2 only)
  std::vector<int64_t> ids;     // n
  std::vector<float> vectors;   // n * d when keep_vectors (normalised for cosine)
  std::vector<float> center;    // d floats once the first batch is added (cfg.center), else empty
  // codec prod
  std::unique_ptr<Quantizer> quant;
  std::vector<uint8_t> pcodes;  // n * quant->code_bytes()

  explicit Impl(const IndexConfig& c);

  uint8_t group_code(size_t i, size_t g) const noexcept {
    if (fast_ok) {
      const uint8_t b = blocks[(i / kBlock) * mp * 16 + g * 16 + (i % 16)];
      return (i % kBlock) < 16 ? (b & 15) : (b >> 4);
    }
    return gcodes[i * m + g];
  }
  void set_group_code(size_t i, size_t g, uint8_t c) noexcept {
    if (fast_ok) {
      uint8_t& b = blocks[(i / kBlock) * mp * 16 + g * 16 + (i % 16)];
      if ((i % kBlock) < 16) b = static_cast<uint8_t>((b & 0xF0) | (c & 15));
      else b = static_cast<uint8_t>((b & 0x0F) | (c << 4));
    } else {
      gcodes[i * m + g] = c;
    }
  }
  // Per-channel indices of vector i (d bytes) <-> group codes.
  void get_indices(size_t i, uint8_t* idx) const noexcept;
  void set_indices(size_t i, const uint8_t* idx) noexcept;
  // Grow storage to n_new vectors (zero-filled).
  void resize(size_t n_new);
  // Rounds through the persisted norm format (so a loaded index scores identically).
  float round_norm(float v) const noexcept;
};

}  // namespace tq
