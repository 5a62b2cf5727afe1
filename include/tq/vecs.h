// Readers and writers for vector files used by nearest-neighbour benchmarks.
//
//   .fvecs  per vector: int32 d, then d float32 (little-endian; TEXMEX / ann-benchmarks)
//   .ivecs  per vector: int32 d, then d int32
//   .bvecs  per vector: int32 d, then d uint8 (read as floats 0..255)
//   .npy    NumPy format 1.0/2.0/3.0, dtype '<f4', C order, shape (n, d) or (d,)
//
// Every reader validates before it returns: the file size must be a whole number of
// records, every record must repeat the first record's d, d must be in [1, kMaxVecsDim],
// and float data must be finite. Anything else throws tq::Error naming the file, the
// record and the byte offset. Writers replace the file atomically (tq/fileio.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tq {

constexpr size_t kMaxVecsDim = 1u << 20;

template <class T>
struct Matrix {
  size_t n = 0;  // rows
  size_t d = 0;  // columns
  std::vector<T> data;  // n * d, row-major
  const T* row(size_t i) const noexcept { return data.data() + i * d; }
  T* row(size_t i) noexcept { return data.data() + i * d; }
};
using FloatMatrix = Matrix<float>;
using IntMatrix = Matrix<int32_t>;

// max_rows: read at most that many leading rows (the rest of the file is still validated
// structurally: size and d of every record).
FloatMatrix read_fvecs(const std::string& path, size_t max_rows = SIZE_MAX);
FloatMatrix read_bvecs(const std::string& path, size_t max_rows = SIZE_MAX);
IntMatrix read_ivecs(const std::string& path, size_t max_rows = SIZE_MAX);
FloatMatrix read_npy(const std::string& path, size_t max_rows = SIZE_MAX);
// Chooses the reader by extension: .fvecs, .bvecs, .npy (anything else: tq::Error).
FloatMatrix read_vectors(const std::string& path, size_t max_rows = SIZE_MAX);

// The same parsers over bytes in memory; `name` is used in error messages.
FloatMatrix parse_fvecs(const uint8_t* data, size_t size, const std::string& name,
                        size_t max_rows = SIZE_MAX);
FloatMatrix parse_bvecs(const uint8_t* data, size_t size, const std::string& name,
                        size_t max_rows = SIZE_MAX);
IntMatrix parse_ivecs(const uint8_t* data, size_t size, const std::string& name,
                      size_t max_rows = SIZE_MAX);
FloatMatrix parse_npy(const uint8_t* data, size_t size, const std::string& name,
                      size_t max_rows = SIZE_MAX);

// Atomic writers. x: n * d values, row-major. d >= 1.
void write_fvecs(const std::string& path, size_t n, size_t d, const float* x);
void write_ivecs(const std::string& path, size_t n, size_t d, const int32_t* x);
void write_bvecs(const std::string& path, size_t n, size_t d, const uint8_t* x);
void write_npy(const std::string& path, size_t n, size_t d, const float* x);

}  // namespace tq
