// .fvecs / .ivecs / .bvecs / .npy readers and writers (see include/tq/vecs.h).
// Little-endian is explicit: values are assembled from bytes, never reinterpreted in place.
#include "tq/vecs.h"

#include <cmath>
#include <cstring>

#include "tq/error.h"
#include "tq/fileio.h"

namespace tq {

namespace {

uint32_t load_le32(const uint8_t* p) noexcept {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
void store_le32(uint8_t* p, uint32_t v) noexcept {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}
float load_lef32(const uint8_t* p) noexcept {
  uint32_t u = load_le32(p);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Validates the record structure of a *vecs file with `elem` bytes per value; returns (n, d).
std::pair<size_t, size_t> scan_vecs(const uint8_t* data, size_t size, size_t elem,
                                    const std::string& name) {
  TQ_CHECK(size > 0, "%s: empty file (0 bytes)", name.c_str());
  TQ_CHECK(size >= 4, "%s: truncated: %zu bytes, less than one 4-byte dimension header",
           name.c_str(), size);
  const int32_t d0 = static_cast<int32_t>(load_le32(data));
  TQ_CHECK(d0 >= 1 && static_cast<size_t>(d0) <= kMaxVecsDim,
           "%s: record 0 has dimension %d, outside [1, %zu] (not a vecs file?)", name.c_str(), d0,
           kMaxVecsDim);
  const size_t d = static_cast<size_t>(d0);
  const size_t rec = 4 + d * elem;
  TQ_CHECK(size % rec == 0,
           "%s: size %zu bytes is not a multiple of the record size %zu (4 + %zu * %zu): "
           "truncated or wrong dimension",
           name.c_str(), size, rec, d, elem);
  const size_t n = size / rec;
  for (size_t i = 1; i < n; ++i) {
    const int32_t di = static_cast<int32_t>(load_le32(data + i * rec));
    TQ_CHECK(di == d0, "%s: record %zu (byte offset %zu) has dimension %d, expected %d",
             name.c_str(), i, i * rec, di, d0);
  }
  return {n, d};
}

template <class T>
void reserve_rows(Matrix<T>& m, size_t n, size_t d, const std::string& name) {
  m.n = n;
  m.d = d;
  m.data.resize(checked_mul(n, d, (name + ": n * d").c_str()));
}

void check_finite_rows(const FloatMatrix& m, const std::string& name) {
  for (size_t i = 0; i < m.n; ++i) {
    const float* r = m.row(i);
    for (size_t j = 0; j < m.d; ++j)
      TQ_CHECK(std::isfinite(r[j]), "%s: vector %zu, component %zu is %s (NaN/Inf not allowed)",
               name.c_str(), i, j, std::isnan(r[j]) ? "NaN" : "Inf");
  }
}

}  // namespace

FloatMatrix parse_fvecs(const uint8_t* data, size_t size, const std::string& name, size_t max_rows) {
  auto [n, d] = scan_vecs(data, size, 4, name);
  const size_t rows = n < max_rows ? n : max_rows;
  FloatMatrix m;
  reserve_rows(m, rows, d, name);
  const size_t rec = 4 + 4 * d;
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* p = data + i * rec + 4;
    float* r = m.row(i);
    for (size_t j = 0; j < d; ++j) r[j] = load_lef32(p + 4 * j);
  }
  check_finite_rows(m, name);
  return m;
}

FloatMatrix parse_bvecs(const uint8_t* data, size_t size, const std::string& name, size_t max_rows) {
  auto [n, d] = scan_vecs(data, size, 1, name);
  const size_t rows = n < max_rows ? n : max_rows;
  FloatMatrix m;
  reserve_rows(m, rows, d, name);
  const size_t rec = 4 + d;
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* p = data + i * rec + 4;
    float* r = m.row(i);
    for (size_t j = 0; j < d; ++j) r[j] = static_cast<float>(p[j]);
  }
  return m;
}

IntMatrix parse_ivecs(const uint8_t* data, size_t size, const std::string& name, size_t max_rows) {
  auto [n, d] = scan_vecs(data, size, 4, name);
  const size_t rows = n < max_rows ? n : max_rows;
  IntMatrix m;
  reserve_rows(m, rows, d, name);
  const size_t rec = 4 + 4 * d;
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* p = data + i * rec + 4;
    int32_t* r = m.row(i);
    for (size_t j = 0; j < d; ++j) r[j] = static_cast<int32_t>(load_le32(p + 4 * j));
  }
  return m;
}

// .npy: "\x93NUMPY", major, minor, header length (u16 for 1.x, u32 for 2.x/3.x), then an
// ASCII Python dict {'descr': '<f4', 'fortran_order': False, 'shape': (n, d), } padded with
// spaces and a newline; then the raw data.
FloatMatrix parse_npy(const uint8_t* data, size_t size, const std::string& name, size_t max_rows) {
  TQ_CHECK(size > 0, "%s: empty file (0 bytes)", name.c_str());
  TQ_CHECK(size >= 10 && std::memcmp(data, "\x93NUMPY", 6) == 0,
           "%s: not a .npy file (bad magic)", name.c_str());
  const int major = data[6];
  TQ_CHECK(major >= 1 && major <= 3, "%s: unsupported .npy version %d.%d", name.c_str(), major,
           data[7]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = static_cast<size_t>(data[8]) | (static_cast<size_t>(data[9]) << 8);
    hstart = 10;
  } else {
    TQ_CHECK(size >= 12, "%s: truncated .npy header", name.c_str());
    hlen = load_le32(data + 8);
    hstart = 12;
  }
  TQ_CHECK(hlen <= size - hstart, "%s: truncated .npy header (%zu header bytes, file %zu)",
           name.c_str(), hlen, size);
  const std::string h(reinterpret_cast<const char*>(data + hstart), hlen);
  auto value_of = [&](const char* key) -> std::string {
    auto k = h.find(key);
    TQ_CHECK(k != std::string::npos, "%s: .npy header lacks %s: %s", name.c_str(), key, h.c_str());
    auto colon = h.find(':', k);
    TQ_CHECK(colon != std::string::npos, "%s: malformed .npy header", name.c_str());
    size_t v = colon + 1;
    while (v < h.size() && h[v] == ' ') ++v;
    return h.substr(v);
  };
  std::string descr = value_of("'descr'");
  TQ_CHECK(descr.rfind("'<f4'", 0) == 0 || descr.rfind("'float32'", 0) == 0,
           "%s: .npy dtype %s is not little-endian float32 ('<f4')", name.c_str(),
           descr.substr(0, descr.find(',')).c_str());
  std::string fortran = value_of("'fortran_order'");
  TQ_CHECK(fortran.rfind("False", 0) == 0, "%s: Fortran-order .npy arrays are not supported",
           name.c_str());
  std::string shape = value_of("'shape'");
  TQ_CHECK(!shape.empty() && shape[0] == '(', "%s: malformed .npy shape", name.c_str());
  auto close = shape.find(')');
  TQ_CHECK(close != std::string::npos, "%s: malformed .npy shape", name.c_str());
  std::vector<size_t> dims;
  {
    size_t i = 1;
    while (i < close) {
      while (i < close && (shape[i] == ' ' || shape[i] == ',')) ++i;
      if (i >= close) break;
      TQ_CHECK(shape[i] >= '0' && shape[i] <= '9', "%s: malformed .npy shape %s", name.c_str(),
               shape.substr(0, close + 1).c_str());
      size_t v = 0;
      while (i < close && shape[i] >= '0' && shape[i] <= '9') {
        TQ_CHECK(v <= (SIZE_MAX - 9) / 10, "%s: .npy shape overflows", name.c_str());
        v = v * 10 + static_cast<size_t>(shape[i] - '0');
        ++i;
      }
      dims.push_back(v);
    }
  }
  TQ_CHECK(dims.size() == 1 || dims.size() == 2, "%s: .npy array has %zu dimensions, need 1 or 2",
           name.c_str(), dims.size());
  const size_t n = dims.size() == 2 ? dims[0] : 1;
  const size_t d = dims.back();
  TQ_CHECK(d >= 1 && d <= kMaxVecsDim, "%s: .npy row length %zu outside [1, %zu]", name.c_str(), d,
           kMaxVecsDim);
  const size_t body = checked_mul(checked_mul(n, d, "npy n * d"), 4, "npy bytes");
  const size_t off = hstart + hlen;
  TQ_CHECK(size - off == body, "%s: .npy data is %zu bytes, shape (%zu, %zu) needs %zu%s",
           name.c_str(), size - off, n, d, body, size - off < body ? " (truncated)" : "");
  const size_t rows = n < max_rows ? n : max_rows;
  FloatMatrix m;
  reserve_rows(m, rows, d, name);
  for (size_t i = 0; i < rows * d; ++i) m.data[i] = load_lef32(data + off + 4 * i);
  check_finite_rows(m, name);
  return m;
}

FloatMatrix read_fvecs(const std::string& path, size_t max_rows) {
  auto b = read_file_bytes(path);
  return parse_fvecs(b.data(), b.size(), path, max_rows);
}
FloatMatrix read_bvecs(const std::string& path, size_t max_rows) {
  auto b = read_file_bytes(path);
  return parse_bvecs(b.data(), b.size(), path, max_rows);
}
IntMatrix read_ivecs(const std::string& path, size_t max_rows) {
  auto b = read_file_bytes(path);
  return parse_ivecs(b.data(), b.size(), path, max_rows);
}
FloatMatrix read_npy(const std::string& path, size_t max_rows) {
  auto b = read_file_bytes(path);
  return parse_npy(b.data(), b.size(), path, max_rows);
}

FloatMatrix read_vectors(const std::string& path, size_t max_rows) {
  auto ends = [&](const char* s) {
    size_t l = std::strlen(s);
    return path.size() >= l && path.compare(path.size() - l, l, s) == 0;
  };
  if (ends(".fvecs")) return read_fvecs(path, max_rows);
  if (ends(".bvecs")) return read_bvecs(path, max_rows);
  if (ends(".npy")) return read_npy(path, max_rows);
  TQ_CHECK(false, "%s: unknown vector file extension (expected .fvecs, .bvecs or .npy)",
           path.c_str());
  return {};
}

namespace {
template <class T, size_t Elem>
void write_vecs(const std::string& path, size_t n, size_t d, const T* x) {
  TQ_CHECK(d >= 1 && d <= kMaxVecsDim, "write %s: dimension %zu outside [1, %zu]", path.c_str(), d,
           kMaxVecsDim);
  const size_t rec = 4 + Elem * d;
  atomic_write_file(path, [&](FileWriter& w) {
    std::vector<uint8_t> buf(rec);
    for (size_t i = 0; i < n; ++i) {
      store_le32(buf.data(), static_cast<uint32_t>(d));
      for (size_t j = 0; j < d; ++j) {
        if constexpr (Elem == 1) {
          buf[4 + j] = static_cast<uint8_t>(x[i * d + j]);
        } else {
          uint32_t u;
          std::memcpy(&u, &x[i * d + j], 4);
          store_le32(buf.data() + 4 + 4 * j, u);
        }
      }
      w.write(buf.data(), rec);
    }
  });
}
}  // namespace

void write_fvecs(const std::string& path, size_t n, size_t d, const float* x) {
  write_vecs<float, 4>(path, n, d, x);
}
void write_ivecs(const std::string& path, size_t n, size_t d, const int32_t* x) {
  write_vecs<int32_t, 4>(path, n, d, x);
}
void write_bvecs(const std::string& path, size_t n, size_t d, const uint8_t* x) {
  write_vecs<uint8_t, 1>(path, n, d, x);
}

void write_npy(const std::string& path, size_t n, size_t d, const float* x) {
  TQ_CHECK(d >= 1 && d <= kMaxVecsDim, "write %s: dimension %zu outside [1, %zu]", path.c_str(), d,
           kMaxVecsDim);
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(n) +
                  ", " + std::to_string(d) + "), }";
  // Total header (10 bytes of preamble + dict + newline) padded to a multiple of 64.
  size_t total = 10 + h.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  h.append(pad, ' ');
  h.push_back('\n');
  TQ_CHECK(h.size() <= 65535, "write %s: .npy header too long", path.c_str());
  atomic_write_file(path, [&](FileWriter& w) {
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(h.size()),
                       static_cast<uint8_t>(h.size() >> 8)};
    w.write(pre, 10);
    w.write(h.data(), h.size());
    std::vector<uint8_t> buf(4 * d);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < d; ++j) {
        uint32_t u;
        std::memcpy(&u, &x[i * d + j], 4);
        store_le32(buf.data() + 4 * j, u);
      }
      w.write(buf.data(), buf.size());
    }
  });
}

}  // namespace tq
