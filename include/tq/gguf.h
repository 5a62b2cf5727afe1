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
// clear error naming the tensor and the type number.
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, BF16 = 30 };
const char* ggml_type_name(GgmlType t);
bool ggml_type_known(uint32_t t);
int ggml_block_size(GgmlType t);    // values per block (1 for float types)
int ggml_block_bytes(GgmlType t);   // bytes per block

// Block layouts (ggml): 32 values per block, fp16 scale(s) first.
//   Q4_0: f16 d; u8 qs[16]           x[j] = (nib(j) - 8) * d        4.5 bits/value
//   Q4_1: f16 d; f16 m; u8 qs[16]    x[j] = nib(j) * d + m          5.0 bits/value
//   Q8_0: f16 d; i8 qs[32]           x[j] = qs[j] * d               8.5 bits/value
// where nib(j) is the low nibble of qs[j] for j < 16 and the high nibble of qs[j-16] above.
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");

// Decode n values (n a multiple of the block size) of type t into floats.
void dequantize_row(GgmlType t, const void* src, float* dst, size_t n);
// Encode (reference quantizers, used by tests and the writer): n floats into type t.
void quantize_row(GgmlType t, const float* src, void* dst, size_t n);
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
