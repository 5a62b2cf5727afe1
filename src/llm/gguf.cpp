// GGUF reader/writer and the ggml weight block codecs: scalar dequantizers for F32, F16, BF16,
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (the reference of the SIMD kernels in
// src/llm/qmatvec_simd.cpp) and quantizers for F32, F16, BF16, Q4_0, Q4_1, Q8_0. Prefill
// dequantizes panels of weight rows; decode reads the blocks with the kernels of
// src/llm/qmatvec_simd.cpp (see docs/design.md).
#include "tq/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "tq/common.h"
#include "tq/error.h"
#include "tq/simd.h"
#include "llm/qmatvec.h"

namespace tq {

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: return "u8";
    case GgufValueType::I8: return "i8";
    case GgufValueType::U16: return "u16";
    case GgufValueType::I16: return "i16";
    case GgufValueType::U32: return "u32";
    case GgufValueType::I32: return "i32";
    case GgufValueType::F32: return "f32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::U64: return "u64";
    case GgufValueType::I64: return "i64";
    case GgufValueType::F64: return "f64";
  }
  return "?";
}

const char* ggml_type_number_name(uint32_t t) {
  // ggml's numbering (ggml.h enum ggml_type); gaps are removed types.
  static const char* const kNames[] = {
      "F32",  "F16",  "Q4_0",  "Q4_1",   "?",     "?",     "Q5_0", "Q5_1",  "Q8_0",  "Q8_1",
      "Q2_K", "Q3_K", "Q4_K",  "Q5_K",   "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
      "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
      "BF16", "?",   "?",     "?",      "TQ1_0", "TQ2_0", "?",    "?",     "?",     "MXFP4"};
  return t < sizeof(kNames) / sizeof(kNames[0]) ? kNames[t] : "?";
}

const char* ggml_type_name(GgmlType t) {
  return ggml_type_known(static_cast<uint32_t>(t)) ? ggml_type_number_name(static_cast<uint32_t>(t)) : "?";
}

bool ggml_type_known(uint32_t t) {
  for (GgmlType k : kGgmlTypes)
    if (static_cast<uint32_t>(k) == t) return true;
  return false;
}

const char* ggml_supported_types() {
  return "F32(0) F16(1) Q4_0(2) Q4_1(3) Q5_0(6) Q5_1(7) Q8_0(8) Q4_K(12) Q5_K(13) Q6_K(14) BF16(30)";
}

int ggml_block_size(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q8_0:
      return 32;
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return kQK;
    default: return 1;
  }
}

int ggml_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16: case GgmlType::BF16: return 2;
    case GgmlType::Q4_0: return sizeof(BlockQ4_0);
    case GgmlType::Q4_1: return sizeof(BlockQ4_1);
    case GgmlType::Q5_0: return sizeof(BlockQ5_0);
    case GgmlType::Q5_1: return sizeof(BlockQ5_1);
    case GgmlType::Q8_0: return sizeof(BlockQ8_0);
    case GgmlType::Q4_K: return sizeof(BlockQ4_K);
    case GgmlType::Q5_K: return sizeof(BlockQ5_K);
    case GgmlType::Q6_K: return sizeof(BlockQ6_K);
  }
  return 0;
}

size_t ggml_row_bytes(GgmlType t, size_t n) {
  const size_t bs = static_cast<size_t>(ggml_block_size(t));
  TQ_CHECK(n % bs == 0, "%zu values of type %s: not a multiple of the block size %zu", n,
           ggml_type_name(t), bs);
  return checked_mul(n / bs, static_cast<size_t>(ggml_block_bytes(t)), "tensor bytes");
}

namespace {

inline uint16_t rd16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

void dequantize_row(GgmlType t, const void* src, float* dst, size_t n) {
  // SIMD kernels for the block types (the same float operations, so the same bits);
  // dequantize_row_ref is their reference (`--simd scalar`).
  if (!simd::use_scalar() && llm::detail::dequantize_row_simd(t, src, dst, n)) return;
  dequantize_row_ref(t, src, dst, n);
}

// The float operations are those of the `gguf` package's numpy dequantizers (the test
// oracle, tests/gguf_dequant_oracle.py): integer code to float, times the (exact) float
// scale, then one add / subtract of the min. Every product is exact (see tq/gguf.h), so a
// compiler's fused multiply-add would round the same.
void dequantize_row_ref(GgmlType t, const void* src, float* dst, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, p, n * 4);
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(rd16(p + 2 * i));
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(rd16(p + 2 * i));
      return;
    case GgmlType::Q4_0:
      for (size_t b = 0; b < n / 32; ++b, p += sizeof(BlockQ4_0)) {
        const float d = fp16_to_fp32(rd16(p));
        const uint8_t* qs = p + 2;
        float* y = dst + b * 32;
        for (int j = 0; j < 16; ++j) {
          y[j] = (static_cast<int>(qs[j] & 0xf) - 8) * d;
          y[j + 16] = (static_cast<int>(qs[j] >> 4) - 8) * d;
        }
      }
      return;
    case GgmlType::Q4_1:
      for (size_t b = 0; b < n / 32; ++b, p += sizeof(BlockQ4_1)) {
        const float d = fp16_to_fp32(rd16(p));
        const float m = fp16_to_fp32(rd16(p + 2));
        const uint8_t* qs = p + 4;
        float* y = dst + b * 32;
        for (int j = 0; j < 16; ++j) {
          y[j] = (qs[j] & 0xf) * d + m;
          y[j + 16] = (qs[j] >> 4) * d + m;
        }
      }
      return;
    case GgmlType::Q8_0:
      for (size_t b = 0; b < n / 32; ++b, p += sizeof(BlockQ8_0)) {
        const float d = fp16_to_fp32(rd16(p));
        const int8_t* qs = reinterpret_cast<const int8_t*>(p + 2);
        float* y = dst + b * 32;
        for (int j = 0; j < 32; ++j) y[j] = qs[j] * d;
      }
      return;
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool q51 = t == GgmlType::Q5_1;
      const size_t bb = q51 ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
      for (size_t b = 0; b < n / 32; ++b, p += bb) {
        const float d = fp16_to_fp32(rd16(p));
        const float m = q51 ? fp16_to_fp32(rd16(p + 2)) : 0.0f;
        uint32_t qh;
        std::memcpy(&qh, p + (q51 ? 4 : 2), 4);
        const uint8_t* qs = p + (q51 ? 8 : 6);
        float* y = dst + b * 32;
        for (int j = 0; j < 16; ++j) {
          const int lo = (qs[j] & 0xf) | static_cast<int>(((qh >> j) & 1) << 4);
          const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
          if (q51) {
            y[j] = d * static_cast<float>(lo) + m;
            y[j + 16] = d * static_cast<float>(hi) + m;
          } else {
            y[j] = d * static_cast<float>(lo - 16);
            y[j + 16] = d * static_cast<float>(hi - 16);
          }
        }
      }
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool q5 = t == GgmlType::Q5_K;
      const size_t bb = q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
      for (size_t b = 0; b < n / kQK; ++b, p += bb) {
        const float d = fp16_to_fp32(rd16(p));
        const float dmin = fp16_to_fp32(rd16(p + 2));
        const uint8_t* scales = p + 4;
        const uint8_t* qh = p + 16;  // Q5_K only
        const uint8_t* qs = p + (q5 ? 48 : 16);
        float* y = dst + b * kQK;
        for (int s = 0; s < 8; ++s) {
          int sc, mn;
          kquant_scale_min(scales, s, sc, mn);
          const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(mn);
          const uint8_t* q = qs + 32 * (s / 2);
          const int shift = 4 * (s % 2);
          for (int l = 0; l < 32; ++l) {
            int v = (q[l] >> shift) & 0xf;
            if (q5) v |= ((qh[l] >> s) & 1) << 4;
            y[32 * s + l] = ds * static_cast<float>(v) - dm;
          }
        }
      }
      return;
    }
    case GgmlType::Q6_K:
      for (size_t b = 0; b < n / kQK; ++b, p += sizeof(BlockQ6_K)) {
        const uint8_t* ql = p;
        const uint8_t* qh = p + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
        const float d = fp16_to_fp32(rd16(p + 208));
        float* y = dst + b * kQK;
        for (int i = 0; i < kQK; ++i) {
          const int h = i / 128, g = (i / 32) % 4, l = i % 32;
          const int q = ((ql[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xf) |
                        (((qh[32 * h + l] >> (2 * g)) & 3) << 4);
          y[i] = (d * static_cast<float>(sc[i / 16])) * static_cast<float>(q - 32);
        }
      }
      return;
  }
  TQ_ASSERT(false);
}

bool ggml_has_quantizer(GgmlType t) noexcept {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q4_0: case GgmlType::Q4_1:
    case GgmlType::Q8_0:
      return true;
    default:
      return false;
  }
}

void quantize_row(GgmlType t, const float* x, void* dst, size_t n) {
  TQ_CHECK(ggml_has_quantizer(t), "quantize_row: no quantizer for %s (F32, F16, BF16, Q4_0, Q4_1, Q8_0 have one)",
           ggml_type_name(t));
  uint8_t* p = static_cast<uint8_t*>(dst);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(p, x, n * 4);
      return;
    case GgmlType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q4_0:
      for (size_t b = 0; b < n / 32; ++b, p += sizeof(BlockQ4_0)) {
        const float* v = x + b * 32;
        float amax = 0, mx = 0;  // signed value with the largest magnitude
        for (int j = 0; j < 32; ++j)
          if (std::fabs(v[j]) > amax) { amax = std::fabs(v[j]); mx = v[j]; }
        const float d = mx / -8.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = fp32_to_fp16(d);
        std::memcpy(p, &dh, 2);
        for (int j = 0; j < 16; ++j) {
          int a = std::min(15, static_cast<int>(v[j] * id + 8.5f));
          int c = std::min(15, static_cast<int>(v[j + 16] * id + 8.5f));
          p[2 + j] = static_cast<uint8_t>(a | (c << 4));
        }
      }
      return;
    case GgmlType::Q4_1:
      for (size_t b = 0; b < n / 32; ++b, p += sizeof(BlockQ4_1)) {
        const float* v = x + b * 32;
        float mn = v[0], mx = v[0];
        for (int j = 1; j < 32; ++j) { mn = std::min(mn, v[j]); mx = std::max(mx, v[j]); }
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = fp32_to_fp16(d), mh = fp32_to_fp16(mn);
        std::memcpy(p, &dh, 2);
        std::memcpy(p + 2, &mh, 2);
        for (int j = 0; j < 16; ++j) {
          int a = std::clamp(static_cast<int>((v[j] - mn) * id + 0.5f), 0, 15);
          int c = std::clamp(static_cast<int>((v[j + 16] - mn) * id + 0.5f), 0, 15);
          p[4 + j] = static_cast<uint8_t>(a | (c << 4));
        }
      }
      return;
    case GgmlType::Q8_0:
      for (size_t b = 0; b < n / 32; ++b, p += sizeof(BlockQ8_0)) {
        const float* v = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = fp32_to_fp16(d);
        std::memcpy(p, &dh, 2);
        for (int j = 0; j < 32; ++j)
          p[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(v[j] * id)));
      }
      return;
    default:
      break;
  }
  TQ_ASSERT(false);
}

size_t GgufValue::arr_size() const noexcept {
  return arr_str.size() + arr_int.size() + arr_float.size();
}

// ---------------------------------------------------------------------------------------
// Reader

struct GgufFile::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* mmap_base = nullptr;
  std::vector<uint8_t> owned;
  ~Mapping() {
    if (mmap_base) munmap(mmap_base, size);
  }
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  GgufFile g;
  g.path_ = path;
  g.map_ = std::make_unique<Mapping>();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TQ_CHECK(fd >= 0, "cannot open GGUF file '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    TQ_CHECK(false, "cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    TQ_CHECK(false, "'%s' is empty, not a GGUF file", path.c_str());
  }
  void* base = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  TQ_CHECK(base != MAP_FAILED, "cannot mmap '%s': %s", path.c_str(), std::strerror(e));
  g.map_->mmap_base = base;
  g.map_->data = static_cast<const uint8_t*>(base);
  g.map_->size = size;
  g.parse();
  return g;
}

GgufFile GgufFile::from_bytes(const void* data, size_t size) {
  GgufFile g;
  g.path_ = "<memory>";
  g.map_ = std::make_unique<Mapping>();
  g.map_->owned.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size);
  g.map_->data = g.map_->owned.data();
  g.map_->size = size;
  g.parse();
  return g;
}

namespace {

// Bounds-checked little-endian cursor over the file.
class Cursor {
 public:
  Cursor(const uint8_t* d, size_t n, const std::string& path) : d_(d), n_(n), path_(path) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }
  void need(size_t k, const char* what) const {
    TQ_CHECK(k <= n_ - pos_, "%s: truncated GGUF file: %s needs %zu bytes at offset %zu, only %zu left",
             path_.c_str(), what, k, pos_, n_ - pos_);
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const size_t at = pos_;
    uint64_t len = get<uint64_t>(what);
    TQ_CHECK(len <= remaining(), "%s: %s at offset %zu has length %llu beyond the end of the file",
             path_.c_str(), what, at, static_cast<unsigned long long>(len));
    std::string s(reinterpret_cast<const char*>(d_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& path_;
};

size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::BOOL: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    default: return 0;
  }
}

bool is_int_type(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::U16:
    case GgufValueType::I16: case GgufValueType::U32: case GgufValueType::I32:
    case GgufValueType::U64: case GgufValueType::I64: return true;
    default: return false;
  }
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::I8 || t == GgufValueType::I16 || t == GgufValueType::I32 ||
         t == GgufValueType::I64;
}

// Read one scalar (not string/array) into v's fields.
void read_scalar(Cursor& c, GgufValueType t, GgufValue& v, const std::string& key) {
  switch (t) {
    case GgufValueType::U8: v.u = c.get<uint8_t>("u8"); v.i = static_cast<int64_t>(v.u); v.f = v.u; break;
    case GgufValueType::I8: v.i = c.get<int8_t>("i8"); v.f = v.i; break;
    case GgufValueType::U16: v.u = c.get<uint16_t>("u16"); v.i = static_cast<int64_t>(v.u); v.f = v.u; break;
    case GgufValueType::I16: v.i = c.get<int16_t>("i16"); v.f = v.i; break;
    case GgufValueType::U32: v.u = c.get<uint32_t>("u32"); v.i = static_cast<int64_t>(v.u); v.f = v.u; break;
    case GgufValueType::I32: v.i = c.get<int32_t>("i32"); v.f = v.i; break;
    case GgufValueType::U64: v.u = c.get<uint64_t>("u64"); v.i = static_cast<int64_t>(v.u); v.f = static_cast<double>(v.u); break;
    case GgufValueType::I64: v.i = c.get<int64_t>("i64"); v.f = static_cast<double>(v.i); break;
    case GgufValueType::F32: v.f = c.get<float>("f32"); break;
    case GgufValueType::F64: v.f = c.get<double>("f64"); break;
    case GgufValueType::BOOL: {
      uint8_t b = c.get<uint8_t>("bool");
      TQ_CHECK(b <= 1, "%s: key '%s': bool value %u is not 0 or 1 (offset %zu)", c.path().c_str(),
               key.c_str(), b, c.pos() - 1);
      v.u = b;
      break;
    }
    default: TQ_ASSERT(false);
  }
  if (is_signed(t)) v.u = v.i >= 0 ? static_cast<uint64_t>(v.i) : 0;
}

}  // namespace

void GgufFile::parse() {
  Cursor c(map_->data, map_->size, path_);
  const uint32_t magic = c.get<uint32_t>("magic");
  TQ_CHECK(magic == 0x46554747u, "%s: not a GGUF file (magic 0x%08x, expected 'GGUF')",
           path_.c_str(), magic);
  version_ = c.get<uint32_t>("version");
  TQ_CHECK(version_ == 2 || version_ == 3,
           "%s: unsupported GGUF version %u (supported: 2 and 3)", path_.c_str(), version_);
  const uint64_t n_tensors = c.get<uint64_t>("tensor count");
  const uint64_t n_kv = c.get<uint64_t>("metadata count");
  // Each kv needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least
  // 8 + 4 + 4 + 8 bytes: reject impossible counts before allocating anything.
  TQ_CHECK(n_kv <= c.remaining() / 13, "%s: metadata count %llu is impossible for a %zu-byte file",
           path_.c_str(), static_cast<unsigned long long>(n_kv), map_->size);
  TQ_CHECK(n_tensors <= c.remaining() / 24, "%s: tensor count %llu is impossible for a %zu-byte file",
           path_.c_str(), static_cast<unsigned long long>(n_tensors), map_->size);

  for (uint64_t k = 0; k < n_kv; ++k) {
    const size_t at = c.pos();
    std::string key = c.str("metadata key");
    TQ_CHECK(!key.empty(), "%s: empty metadata key at offset %zu", path_.c_str(), at);
    TQ_CHECK(!kv_.count(key), "%s: duplicate metadata key '%s'", path_.c_str(), key.c_str());
    const uint32_t traw = c.get<uint32_t>("value type");
    TQ_CHECK(traw <= 12, "%s: key '%s': unknown value type %u at offset %zu", path_.c_str(),
             key.c_str(), traw, c.pos() - 4);
    GgufValue v;
    v.type = static_cast<GgufValueType>(traw);
    if (v.type == GgufValueType::STRING) {
      v.s = c.str("string value");
    } else if (v.type == GgufValueType::ARRAY) {
      const uint32_t araw = c.get<uint32_t>("array element type");
      TQ_CHECK(araw <= 12 && araw != 9, "%s: key '%s': unsupported array element type %u",
               path_.c_str(), key.c_str(), araw);
      v.arr_type = static_cast<GgufValueType>(araw);
      const uint64_t n = c.get<uint64_t>("array length");
      const size_t esz = v.arr_type == GgufValueType::STRING ? 8 : scalar_size(v.arr_type);
      TQ_CHECK(n <= c.remaining() / esz,
               "%s: key '%s': array of %llu %s elements does not fit in the %zu bytes left",
               path_.c_str(), key.c_str(), static_cast<unsigned long long>(n),
               gguf_value_type_name(v.arr_type), c.remaining());
      if (v.arr_type == GgufValueType::STRING) {
        v.arr_str.reserve(n);
        for (uint64_t j = 0; j < n; ++j) v.arr_str.push_back(c.str("array string"));
      } else if (is_int_type(v.arr_type) || v.arr_type == GgufValueType::BOOL) {
        v.arr_int.reserve(n);
        for (uint64_t j = 0; j < n; ++j) {
          GgufValue e;
          read_scalar(c, v.arr_type, e, key);
          if (v.arr_type == GgufValueType::U64)
            TQ_CHECK(e.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                     "%s: key '%s': u64 array element too large", path_.c_str(), key.c_str());
          v.arr_int.push_back(is_signed(v.arr_type) ? e.i : static_cast<int64_t>(e.u));
        }
      } else {
        v.arr_float.reserve(n);
        for (uint64_t j = 0; j < n; ++j) {
          GgufValue e;
          read_scalar(c, v.arr_type, e, key);
          v.arr_float.push_back(e.f);
        }
      }
    } else {
      read_scalar(c, v.type, v, key);
    }
    kv_.emplace(std::move(key), std::move(v));
  }

  if (has("general.alignment")) {
    const GgufValue& a = get("general.alignment");
    TQ_CHECK(is_int_type(a.type) && !(is_signed(a.type) && a.i < 0),
             "%s: general.alignment must be an unsigned integer", path_.c_str());
    TQ_CHECK(a.u > 0 && a.u <= (1u << 20) && (a.u & (a.u - 1)) == 0,
             "%s: general.alignment %llu is not a power of two in [1, 2^20]", path_.c_str(),
             static_cast<unsigned long long>(a.u));
    alignment_ = static_cast<size_t>(a.u);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.name = c.str("tensor name");
    TQ_CHECK(!t.name.empty(), "%s: tensor %llu has an empty name", path_.c_str(),
             static_cast<unsigned long long>(k));
    TQ_CHECK(!tensor_index_.count(t.name), "%s: duplicate tensor '%s'", path_.c_str(), t.name.c_str());
    const uint32_t nd = c.get<uint32_t>("n_dims");
    TQ_CHECK(nd >= 1 && nd <= 4, "%s: tensor '%s' has %u dimensions (1..4 allowed)", path_.c_str(),
             t.name.c_str(), nd);
    size_t n_el = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      uint64_t ne = c.get<uint64_t>("tensor dimension");
      TQ_CHECK(ne >= 1 && ne <= (uint64_t(1) << 40), "%s: tensor '%s' dimension %u is %llu",
               path_.c_str(), t.name.c_str(), d, static_cast<unsigned long long>(ne));
      t.ne.push_back(ne);
      n_el = checked_mul(n_el, static_cast<size_t>(ne), "tensor element count");
    }
    const uint32_t ty = c.get<uint32_t>("tensor type");
    TQ_CHECK(ggml_type_known(ty), "%s: tensor '%s' has ggml type %u (%s), which is not supported; supported: %s",
             path_.c_str(), t.name.c_str(), ty, ggml_type_number_name(ty), ggml_supported_types());
    t.type = static_cast<GgmlType>(ty);
    TQ_CHECK(t.ne[0] % ggml_block_size(t.type) == 0,
             "%s: tensor '%s': row length %llu is not a multiple of the %s block size %d",
             path_.c_str(), t.name.c_str(), static_cast<unsigned long long>(t.ne[0]),
             ggml_type_name(t.type), ggml_block_size(t.type));
    t.offset = c.get<uint64_t>("tensor offset");
    TQ_CHECK(t.offset % alignment_ == 0, "%s: tensor '%s' offset %llu is not a multiple of the alignment %zu",
             path_.c_str(), t.name.c_str(), static_cast<unsigned long long>(t.offset), alignment_);
    t.n_elements = n_el;
    t.n_bytes = ggml_row_bytes(t.type, n_el);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Data section starts at the next multiple of the alignment.
  size_t data_start = c.pos();
  if (data_start % alignment_) data_start = checked_add(data_start, alignment_ - data_start % alignment_, "data offset");
  TQ_CHECK(n_tensors == 0 || data_start <= map_->size,
           "%s: truncated GGUF file: tensor data would start at %zu but the file has %zu bytes",
           path_.c_str(), data_start, map_->size);
  const size_t data_size = data_start <= map_->size ? map_->size - data_start : 0;
  for (auto& t : tensors_) {
    TQ_CHECK(t.offset <= data_size && t.n_bytes <= data_size - t.offset,
             "%s: truncated GGUF file: tensor '%s' (%zu bytes at data offset %llu) ends past the %zu data bytes",
             path_.c_str(), t.name.c_str(), t.n_bytes, static_cast<unsigned long long>(t.offset), data_size);
    t.data = map_->data + data_start + t.offset;
  }
}

const GgufValue& GgufFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  TQ_CHECK(it != kv_.end(), "%s: metadata key '%s' is missing", path_.c_str(), key.c_str());
  return it->second;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  TQ_CHECK(v.type == GgufValueType::STRING, "%s: key '%s' is %s, expected a string", path_.c_str(),
           key.c_str(), gguf_value_type_name(v.type));
  return v.s;
}
uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = get(key);
  TQ_CHECK(is_int_type(v.type), "%s: key '%s' is %s, expected an integer", path_.c_str(), key.c_str(),
           gguf_value_type_name(v.type));
  TQ_CHECK(!is_signed(v.type) || v.i >= 0, "%s: key '%s' is negative (%lld)", path_.c_str(), key.c_str(),
           static_cast<long long>(v.i));
  return v.u;
}
double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  TQ_CHECK(is_int_type(v.type) || v.type == GgufValueType::F32 || v.type == GgufValueType::F64,
           "%s: key '%s' is %s, expected a number", path_.c_str(), key.c_str(), gguf_value_type_name(v.type));
  return v.f;
}
bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = get(key);
  TQ_CHECK(v.type == GgufValueType::BOOL, "%s: key '%s' is %s, expected a bool", path_.c_str(),
           key.c_str(), gguf_value_type_name(v.type));
  return v.u != 0;
}
const std::vector<std::string>& GgufFile::get_str_array(const std::string& key) const {
  const GgufValue& v = get(key);
  TQ_CHECK(v.type == GgufValueType::ARRAY && v.arr_type == GgufValueType::STRING,
           "%s: key '%s' is not an array of strings", path_.c_str(), key.c_str());
  return v.arr_str;
}
const std::vector<int64_t>& GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = get(key);
  TQ_CHECK(v.type == GgufValueType::ARRAY && (is_int_type(v.arr_type) || v.arr_type == GgufValueType::BOOL),
           "%s: key '%s' is not an array of integers", path_.c_str(), key.c_str());
  return v.arr_int;
}
uint64_t GgufFile::get_uint_or(const std::string& key, uint64_t d) const { return has(key) ? get_uint(key) : d; }
double GgufFile::get_float_or(const std::string& key, double d) const { return has(key) ? get_float(key) : d; }
bool GgufFile::get_bool_or(const std::string& key, bool d) const { return has(key) ? get_bool(key) : d; }
std::string GgufFile::get_string_or(const std::string& key, const std::string& d) const {
  return has(key) ? get_string(key) : d;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}
const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  TQ_CHECK(t, "%s: tensor '%s' is missing", path_.c_str(), name.c_str());
  return *t;
}

std::vector<float> GgufFile::tensor_f32(const GgufTensor& t) const {
  std::vector<float> out(t.n_elements);
  const size_t row = t.ne[0];
  const size_t rb = ggml_row_bytes(t.type, row);
  const size_t nrows = t.rows();
#pragma omp parallel for schedule(static) if (nrows > 256)
  for (size_t r = 0; r < nrows; ++r) dequantize_row(t.type, t.data + r * rb, out.data() + r * row, row);
  return out;
}

// ---------------------------------------------------------------------------------------
// Writer

namespace {
template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
}  // namespace

#define TQ_GGUF_SET(fn, ctype, tcode)                              \
  void GgufWriter::fn(const std::string& key, ctype v) {          \
    Kv kv{key, {}};                                                \
    put<uint32_t>(kv.enc, static_cast<uint32_t>(tcode));           \
    put<ctype>(kv.enc, v);                                         \
    kvs_.push_back(std::move(kv));                                 \
  }
TQ_GGUF_SET(set_u32, uint32_t, GgufValueType::U32)
TQ_GGUF_SET(set_i32, int32_t, GgufValueType::I32)
TQ_GGUF_SET(set_u64, uint64_t, GgufValueType::U64)
TQ_GGUF_SET(set_f32, float, GgufValueType::F32)
TQ_GGUF_SET(set_f64, double, GgufValueType::F64)
#undef TQ_GGUF_SET

void GgufWriter::set_bool(const std::string& key, bool v) {
  Kv kv{key, {}};
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::BOOL));
  put<uint8_t>(kv.enc, v ? 1 : 0);
  kvs_.push_back(std::move(kv));
}
void GgufWriter::set_string(const std::string& key, const std::string& v) {
  Kv kv{key, {}};
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::STRING));
  put_str(kv.enc, v);
  kvs_.push_back(std::move(kv));
}
void GgufWriter::set_str_array(const std::string& key, const std::vector<std::string>& v) {
  Kv kv{key, {}};
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::ARRAY));
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::STRING));
  put<uint64_t>(kv.enc, v.size());
  for (auto& s : v) put_str(kv.enc, s);
  kvs_.push_back(std::move(kv));
}
void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  Kv kv{key, {}};
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::ARRAY));
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::I32));
  put<uint64_t>(kv.enc, v.size());
  for (auto x : v) put<int32_t>(kv.enc, x);
  kvs_.push_back(std::move(kv));
}
void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& v) {
  Kv kv{key, {}};
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::ARRAY));
  put<uint32_t>(kv.enc, static_cast<uint32_t>(GgufValueType::F32));
  put<uint64_t>(kv.enc, v.size());
  for (auto x : v) put<float>(kv.enc, x);
  kvs_.push_back(std::move(kv));
}
void GgufWriter::set_alignment(uint32_t a) {
  alignment_ = a;
  set_u32("general.alignment", a);
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                            const float* data) {
  size_t n = 1;
  for (auto d : ne) n = checked_mul(n, d, "tensor size");
  T t{name, ne, type, std::vector<uint8_t>(ggml_row_bytes(type, n))};
  quantize_row(type, data, t.data.data(), n);
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor_raw(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                                const void* bytes, size_t n_bytes) {
  size_t n = 1;
  for (auto d : ne) n = checked_mul(n, d, "tensor size");
  const size_t want = ggml_row_bytes(type, n);
  TQ_CHECK(n_bytes == want, "add_tensor_raw '%s': %zu bytes given, a %s tensor of %zu values has %zu", name.c_str(),
           n_bytes, ggml_type_name(type), n, want);
  const uint8_t* b = static_cast<const uint8_t*>(bytes);
  tensors_.push_back(T{name, ne, type, std::vector<uint8_t>(b, b + n_bytes)});
}

std::vector<uint8_t> GgufWriter::bytes() const {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 0x46554747u);
  put<uint32_t>(b, version_);
  put<uint64_t>(b, tensors_.size());
  put<uint64_t>(b, kvs_.size());
  for (auto& kv : kvs_) {
    put_str(b, kv.key);
    b.insert(b.end(), kv.enc.begin(), kv.enc.end());
  }
  uint64_t off = 0;
  std::vector<uint64_t> offs;
  for (auto& t : tensors_) {
    put_str(b, t.name);
    put<uint32_t>(b, static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) put<uint64_t>(b, d);
    put<uint32_t>(b, static_cast<uint32_t>(t.type));
    put<uint64_t>(b, off);
    offs.push_back(off);
    off += t.data.size();
    off = (off + alignment_ - 1) / alignment_ * alignment_;
  }
  while (b.size() % alignment_) b.push_back(0);
  const size_t base = b.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    b.resize(base + offs[i], 0);
    b.insert(b.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  return b;
}

void GgufWriter::write(const std::string& path) const {
  const std::vector<uint8_t> b = bytes();
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  TQ_CHECK(f, "cannot write '%s': %s", tmp.c_str(), std::strerror(errno));
  const size_t w = std::fwrite(b.data(), 1, b.size(), f);
  const bool ok = w == b.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok) std::remove(tmp.c_str());
  TQ_CHECK(ok, "short write to '%s'", tmp.c_str());
  TQ_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '%s' to '%s': %s", tmp.c_str(),
           path.c_str(), std::strerror(errno));
}

}  // namespace tq
