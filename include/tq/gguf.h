// GGUF model files (versions 2 and 3): a validating, memory-mapped reader and a small writer
// (used by the tests to make their own files, tiny models included).
//
// File layout (all little-endian):
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv * { string key | u32 value_type | value }          string = u64 length + bytes
//   n_tensors * { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
// Every count, length, offset and size is checked against the file before use; sizes are
// overflow-checked. A malformed file is a tq::Error that names the field and the byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tq {

enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);

// Tensor element types we can read (ggml numbering). Other ggml types are rejected with a
// clear error naming the tensor and the type (number and ggml name).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};
// Every type above, in enum order (tests and tables iterate it).
inline constexpr GgmlType kGgmlTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::Q4_0, GgmlType::Q4_1,
                                          GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K,
                                          GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::BF16};
const char* ggml_type_name(GgmlType t);
// The ggml name of any ggml type number ("Q2_K", "IQ4_XS", ...; "?" if ggml has none).
const char* ggml_type_number_name(uint32_t t);
bool ggml_type_known(uint32_t t);
// "F32(0) F16(1) ...": the supported types, for error messages.
const char* ggml_supported_types();
int ggml_block_size(GgmlType t);    // values per block (1 for float types, 32, or 256 for K-quants)
int ggml_block_bytes(GgmlType t);   // bytes per block

// Block layouts (ggml's, little-endian, fp16 scales). 32 values per block:
//   Q4_0: f16 d; u8 qs[16]                  x[j] = (nib(j) - 8) * d          4.5 bits/value
//   Q4_1: f16 d; f16 m; u8 qs[16]           x[j] = nib(j) * d + m            5.0 bits/value
//   Q5_0: f16 d; u8 qh[4]; u8 qs[16]        x[j] = (q5(j) - 16) * d          5.5 bits/value
//   Q5_1: f16 d; f16 m; u8 qh[4]; u8 qs[16] x[j] = q5(j) * d + m             6.0 bits/value
//   Q8_0: f16 d; i8 qs[32]                  x[j] = qs[j] * d                 8.5 bits/value
// where nib(j) is the low nibble of qs[j] for j < 16 and the high nibble of qs[j-16] above,
// and q5(j) = nib(j) | (bit j of the little-endian u32 qh) << 4.
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block is 24 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");

// K-quants: super-blocks of 256 values (kQK). Q4_K / Q5_K: 8 sub-blocks of 32 values, each
// with a 6-bit scale sc[s] and a 6-bit min mn[s] packed in scales[12]:
//   s < 4:  sc = scales[s] & 63,                           mn = scales[s + 4] & 63
//   s >= 4: sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4,
//           mn = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4
//   x[32 s + l] = (d * sc) * q - (dmin * mn), with, for s = 2c + h (c = 0..3, h = 0/1),
//   Q4_K: q = (qs[32 c + l] >> 4 h) & 15                                    4.5 bits/value
//   Q5_K: q = that | ((qh[l] >> s) & 1) << 4                                 5.5 bits/value
// Q6_K: 16 sub-blocks of 16 values with an int8 scale each; for value i = 128 h + 32 g + l
// (h = 0/1, g = 0..3, l < 32):
//   q = ((ql[64 h + 32 (g & 1) + l] >> 4 (g >> 1)) & 15) | ((qh[32 h + l] >> 2 g) & 3) << 4
//   x[i] = (d * scales[i / 16]) * (q - 32)                                  6.5625 bits/value
// Every product here is exact in float (at most 11 + 7 + 5 significant bits), so the one
// rounding of a value is the final add / subtract of the min (or none).
constexpr int kQK = 256;
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes");
// The 6-bit scale and min of sub-block s (0..7) of a Q4_K / Q5_K super-block.
inline void kquant_scale_min(const uint8_t* scales, int s, int& sc, int& mn) noexcept {
  if (s < 4) {
    sc = scales[s] & 63;
    mn = scales[s + 4] & 63;
  } else {
    sc = (scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4);
    mn = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

// Decode n values (n a multiple of the block size) of type t into floats.
void dequantize_row(GgmlType t, const void* src, float* dst, size_t n);
// The scalar reference of dequantize_row (what `--simd scalar` runs; the SIMD kernels give
// its bits).
void dequantize_row_ref(GgmlType t, const void* src, float* dst, size_t n);
// Encode (reference quantizers, used by tests and the writer): n floats into type t. Only
// F32, F16, BF16, Q4_0, Q4_1 and Q8_0 have one (ggml_has_quantizer); others: tq::Error.
void quantize_row(GgmlType t, const float* src, void* dst, size_t n);
bool ggml_has_quantizer(GgmlType t) noexcept;
// Bytes for n values of type t (n a multiple of the block size, else tq::Error).
size_t ggml_row_bytes(GgmlType t, size_t n);

// One metadata value. Scalars live in the matching field; arrays in arr_* (elements of one
// type: numbers as i64/u64/f64, strings as strings, nested arrays are rejected).
struct GgufValue {
  GgufValueType type = GgufValueType::U32;
  GgufValueType arr_type = GgufValueType::U32;  // for ARRAY
  uint64_t u = 0;       // unsigned ints, bool
  int64_t i = 0;        // signed ints
  double f = 0;         // floats
  std::string s;        // STRING
  std::vector<std::string> arr_str;
  std::vector<int64_t> arr_int;   // signed and unsigned (u64 above 2^63 rejected)
  std::vector<double> arr_float;
  size_t arr_size() const noexcept;
};

struct GgufTensor {
  std::string name;
  std::vector<uint64_t> ne;   // ne[0] is the contiguous dimension (ggml order)
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;        // relative to the data section
  size_t n_elements = 0;
  size_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
  size_t rows() const noexcept { return ne.empty() ? 0 : n_elements / ne[0]; }
};

class GgufFile {
 public:
  // Map and parse a file; throws tq::Error on any problem.
  static GgufFile open(const std::string& path);
  // Parse a buffer held in memory (copied).
  static GgufFile from_bytes(const void* data, size_t size);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  uint32_t version() const noexcept { return version_; }
  size_t alignment() const noexcept { return alignment_; }
  const std::string& path() const noexcept { return path_; }

  const std::map<std::string, GgufValue>& metadata() const noexcept { return kv_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue& get(const std::string& key) const;  // missing: tq::Error
  // Typed getters: missing key or wrong type is a tq::Error naming the key.
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;     // any integer type >= 0
  double get_float(const std::string& key) const;      // any float or integer type
  bool get_bool(const std::string& key) const;
  const std::vector<std::string>& get_str_array(const std::string& key) const;
  const std::vector<int64_t>& get_int_array(const std::string& key) const;
  // With defaults when the key is absent (present with the wrong type is still an error).
  uint64_t get_uint_or(const std::string& key, uint64_t dflt) const;
  double get_float_or(const std::string& key, double dflt) const;
  bool get_bool_or(const std::string& key, bool dflt) const;
  std::string get_string_or(const std::string& key, const std::string& dflt) const;

  const std::vector<GgufTensor>& tensors() const noexcept { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;  // nullptr if absent
  const GgufTensor& tensor(const std::string& name) const;       // absent: tq::Error
  // Dequantize a whole tensor into floats (row-major, ne[0] contiguous).
  std::vector<float> tensor_f32(const GgufTensor& t) const;

 private:
  GgufFile() = default;
  void parse();
  struct Mapping;
  std::unique_ptr<Mapping> map_;
  std::string path_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Writes a GGUF v3 (or v2) file; used by tests to build fixtures and tiny models.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_f64(const std::string& key, double v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_str_array(const std::string& key, const std::vector<std::string>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_alignment(uint32_t a);
  // ne in ggml order (ne[0] contiguous); data: n_elements floats, encoded as `type`.
  void add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                  const float* data);
  // The same with the tensor's bytes given as stored (ggml_row_bytes(type, n_elements) of
  // them), for types without a quantizer here (K-quants, Q5_*) and for exact fixtures.
  void add_tensor_raw(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                      const void* bytes, size_t n_bytes);
  std::vector<uint8_t> bytes() const;
  void write(const std::string& path) const;  // atomic (temp file + rename)

 private:
  struct Kv { std::string key; std::vector<uint8_t> enc; };
  struct T { std::string name; std::vector<uint64_t> ne; GgmlType type; std::vector<uint8_t> data; };
  uint32_t version_;
  uint32_t alignment_ = 32;
  std::vector<Kv> kvs_;
  std::vector<T> tensors_;
};

}  // namespace tq
