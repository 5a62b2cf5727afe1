// turboquant._turboquant: the nanobind module behind `import turboquant`. Thin: every
// class holds a C++ object of include/tq/ and every method calls it; the only logic here is
// checking the NumPy arrays handed in (dtype, shape, C order: wrong ones raise, nothing is
// converted or copied) and allocating the arrays handed out. Long calls release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "capi/kv_config.h"
#include "tq/codebook.h"
#include "tq/error.h"
#include "tq/eval.h"
#include "tq/fileio.h"
#include "tq/gguf.h"
#include "tq/index.h"
#include "tq/kv_cache.h"
#include "tq/model.h"
#include "tq/quantizer.h"
#include "tq/rotation.h"
#include "tq/simd.h"
#include "tq/tokenizer.h"
#include "tq/vecs.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using InArray = nb::ndarray<nb::ro, nb::device::cpu>;

std::string dtype_name(nb::dlpack::dtype d) {
  const char* base = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: break;
  }
  return std::string(base) + std::to_string(d.bits);
}

template <class T> const char* type_label();
template <> const char* type_label<float>() { return "float32"; }
template <> const char* type_label<uint8_t>() { return "uint8"; }
template <> const char* type_label<int64_t>() { return "int64"; }

std::string shape_str(const InArray& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// A checked view of an input array: dtype T, C-contiguous, ndim in [min_ndim, max_ndim],
// last dimension `cols` when cols >= 0. Returns its data; rows = product of the leading dims.
template <class T>
const T* view(const InArray& a, const char* name, size_t min_ndim, size_t max_ndim, long cols, size_t* rows) {
  if (a.dtype() != nb::dtype<T>())
    throw nb::type_error(tq::strprintf("turboquant: %s must be a %s array, got %s (convert with "
                                       "np.ascontiguousarray(%s, dtype=np.%s))",
                                       name, type_label<T>(), dtype_name(a.dtype()).c_str(), name,
                                       type_label<T>())
                             .c_str());
  TQ_CHECK(a.ndim() >= min_ndim && a.ndim() <= max_ndim, "%s must have %s dimensions, got shape %s", name,
           min_ndim == max_ndim ? std::to_string(min_ndim).c_str()
                                : (std::to_string(min_ndim) + " or " + std::to_string(max_ndim)).c_str(),
           shape_str(a).c_str());
  // Strides only matter when there is data: an empty array may carry any (NumPy >= 2.4 exports
  // some that are not the C ones).
  const bool empty = a.size() == 0;
  int64_t expect = 1;
  for (size_t i = a.ndim(); !empty && i-- > 0;) {
    TQ_CHECK(a.shape(i) <= 1 || a.stride(i) == expect,
             "%s must be C-contiguous (row-major, no strides), got strides that are not: use "
             "np.ascontiguousarray(%s)",
             name, name);
    expect *= static_cast<int64_t>(a.shape(i));
  }
  if (cols >= 0)
    TQ_CHECK(a.ndim() >= 1 && static_cast<long>(a.shape(a.ndim() - 1)) == cols,
             "%s must have %ld columns (the dimension), got shape %s", name, cols, shape_str(a).c_str());
  size_t r = 1;
  for (size_t i = 0; i + 1 < a.ndim(); ++i) r *= a.shape(i);
  if (a.ndim() == 1 && cols >= 0) r = 1;
  if (rows) *rows = r;
  return static_cast<const T*>(a.data());
}

void check_finite(size_t n, const float* x, const char* name) {
  for (size_t i = 0; i < n; ++i)
    TQ_CHECK(std::isfinite(x[i]), "%s[%zu] (flat) is not finite (%g)", name, i, x[i]);
}

// A new NumPy array of `shape` owning a fresh buffer (no copy on the way out).
template <class T>
nb::ndarray<nb::numpy, T> new_array(const std::vector<size_t>& shape, T** data) {
  size_t n = 1;
  for (size_t s : shape) n = tq::checked_mul(n, s, "array size");
  T* p = new T[n > 0 ? n : 1];
  nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
  *data = p;
  return nb::ndarray<nb::numpy, T>(p, shape.size(), shape.data(), owner);
}
template <class T>
nb::ndarray<nb::numpy, T> new_array(std::initializer_list<size_t> shape, T** data) {
  return new_array<T>(std::vector<size_t>(shape), data);
}
// A matrix read by the library as an (n, d) array that owns its buffer (moved, not copied).
template <class T>
nb::ndarray<nb::numpy, T> matrix_array(tq::Matrix<T>&& m) {
  auto* v = new std::vector<T>(std::move(m.data));
  nb::capsule owner(v, [](void* q) noexcept { delete static_cast<std::vector<T>*>(q); });
  const size_t shape[2] = {m.n, m.d};
  return nb::ndarray<nb::numpy, T>(v->data(), 2, shape, owner);
}

// Index.search / search_candidates arguments as the library's SearchParams.
tq::SearchParams search_params(int k, int threads, int rerank, int rerank_full, bool fast_scan, int nprobe = 1) {
  TQ_CHECK(k >= 1 && k <= (1 << 20), "index search: k = %d outside [1, 2^20]", k);
  tq::SearchParams p;
  p.nprobe = nprobe;
  p.k = k;
  p.n_threads = threads;
  p.rerank = rerank;
  p.rerank_full = rerank_full;
  p.fast_scan = fast_scan;
  return p;
}

// ---------------------------------------------------------------- codec

struct PyCodebook {
  const tq::Codebook* cb;
};

struct PyRotation {
  std::unique_ptr<tq::Rotation> r;
};

nb::ndarray<nb::numpy, float> rotate(const tq::Rotation& r, const InArray& x, bool inverse) {
  size_t n = 0;
  const float* xp = view<float>(x, "x", 1, 2, r.dim(), &n);
  check_finite(n * r.dim(), xp, "x");
  float* out = nullptr;
  auto res = x.ndim() == 1 ? new_array<float>({static_cast<size_t>(r.dim())}, &out)
                           : new_array<float>({n, static_cast<size_t>(r.dim())}, &out);
  nb::gil_scoped_release nogil;
  if (inverse) r.inverse(n, xp, out); else r.forward(n, xp, out);
  return res;
}

struct PyQuantizer {
  std::unique_ptr<tq::Quantizer> q;
};

// ---------------------------------------------------------------- index

std::string index_repr(const tq::Index& idx) {
  return tq::strprintf("turboquant.Index(dim=%d, bits=%g, metric='%s', ntotal=%zu, '%s')", idx.dim(),
                       idx.config().bits, tq::metric_name(idx.config().metric), idx.size(),
                       idx.describe().c_str());
}

// The index file's bytes (pickling): saved to a private temporary directory and read back.
nb::bytes index_bytes(const tq::Index& idx) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "turboquant-pickle-XXXXXX").string();
  TQ_CHECK(mkdtemp(tmpl.data()) != nullptr, "pickling an index: cannot create a temporary directory in %s",
           std::filesystem::temp_directory_path().c_str());
  const std::string path = tmpl + "/index.tqi";
  std::vector<uint8_t> bytes;
  try {
    nb::gil_scoped_release nogil;
    idx.save(path);
    bytes = tq::read_file_bytes(path);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(tmpl, ec);
    throw;
  }
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// ---------------------------------------------------------------- kv cache

struct PyKVCache {
  std::string label;
  tq::KvCache cache;
  PyKVCache(std::string l, const tq::KvCacheConfig& c) : label(std::move(l)), cache(c) {}
};

// ---------------------------------------------------------------- model

struct PyModel {
  tq::GgufFile gguf;
  tq::Tokenizer tok;
  tq::LlamaModel model;
  std::string path;
};

std::vector<int32_t> tokens_of(const PyModel& m, const nb::handle& text_or_ids, const char* what) {
  if (nb::isinstance<nb::str>(text_or_ids)) return m.tok.encode_with_bos(nb::cast<std::string>(text_or_ids));
  std::vector<int32_t> ids;
  try {
    ids = nb::cast<std::vector<int32_t>>(text_or_ids);
  } catch (const nb::cast_error&) {
    throw nb::type_error(tq::strprintf("turboquant: %s must be a str or a sequence of token ids", what).c_str());
  }
  const int nv = m.model.config().n_vocab;
  for (size_t i = 0; i < ids.size(); ++i)
    TQ_CHECK(ids[i] >= 0 && ids[i] < nv, "%s: token id %d at %zu outside the vocabulary [0, %d)", what, ids[i], i,
             nv);
  return ids;
}

}  // namespace

NB_MODULE(_turboquant, m) {
  m.doc() = "TurboQuant: random rotation + Lloyd-Max codebook vector quantization, a quantized KV cache "
            "with fused attention, a GGUF Llama runner and a compressed vector-search index.";
  nb::exception<tq::Error>(m, "Error", PyExc_ValueError);
  m.attr("__version__") = TQ_VERSION_STRING;
  m.def("simd_level", &tq::simd::current_level, "The SIMD level the kernels dispatch to (e.g. 'AVX3_DL').");
  m.def("blas_core", []() { return std::string(tq::simd::blas_core()); },
        "The kernel set OpenBLAS picked when it was loaded (e.g. 'SkylakeX'); float GEMMs (k-means, IVF, "
        "prefill) run on it. 'Prescott' on a CPU with AVX2 means OpenBLAS did not know the CPU and the "
        "package could not set OPENBLAS_CORETYPE before it loaded (see the package docstring).");
  m.def("kv_types", &tq::kv_type_names, "Names of the KV cache element formats (f16, q8_0, tq1..tq8, ...).");

  // ---- Codebook
  nb::class_<PyCodebook>(m, "Codebook",
                         "Lloyd-Max scalar codebook for one coordinate of a random unit vector in R^dim "
                         "after a random rotation (cached per (dim, bits, law)).")
      .def("__init__",
           [](PyCodebook* self, int dim, int bits, const std::string& law) {
             new (self) PyCodebook{&tq::get_codebook(dim, bits, tq::parse_law(law))};
           },
           "dim"_a, "bits"_a, "law"_a = "beta",
           "dim >= 2, bits 1..8, law 'beta' (exact) or 'gauss' (its large-d limit).")
      .def_prop_ro("dim", [](const PyCodebook& c) { return c.cb->dim; })
      .def_prop_ro("bits", [](const PyCodebook& c) { return c.cb->bits; })
      .def_prop_ro("law", [](const PyCodebook& c) { return std::string(tq::law_name(c.cb->law)); })
      .def_prop_ro("centroids",
                   [](const PyCodebook& c) {
                     float* p = nullptr;
                     auto a = new_array<float>({c.cb->centroids.size()}, &p);
                     std::copy(c.cb->centroids.begin(), c.cb->centroids.end(), p);
                     return a;
                   },
                   nb::rv_policy::move, "The 2^bits centroids, ascending (units of a unit vector's coordinate), a new array.")
      .def_prop_ro("boundaries",
                   [](const PyCodebook& c) {
                     float* p = nullptr;
                     auto a = new_array<float>({c.cb->boundaries.size()}, &p);
                     std::copy(c.cb->boundaries.begin(), c.cb->boundaries.end(), p);
                     return a;
                   },
                   nb::rv_policy::move, "The 2^bits - 1 decision thresholds, ascending, a new array.")
      .def_prop_ro("mse_per_coord", [](const PyCodebook& c) { return c.cb->mse_per_coord; })
      .def_prop_ro("mse_per_vector", [](const PyCodebook& c) { return c.cb->mse_per_vector; })
      .def("quantize",
           [](const PyCodebook& c, const InArray& y) {
             size_t n = 1;
             const float* yp = view<float>(y, "y", 1, 1, -1, nullptr);
             n = y.shape(0);
             check_finite(n, yp, "y");
             uint8_t* out = nullptr;
             auto res = new_array<uint8_t>({n}, &out);
             nb::gil_scoped_release nogil;
             tq::quantize_rotated(*c.cb, n, yp, out);
             return res;
           },
           "y"_a, "Indices (uint8) of the nearest centroid of each value of the 1-D float32 array y.")
      .def("__repr__", [](const PyCodebook& c) {
        return tq::strprintf("turboquant.Codebook(dim=%d, bits=%d, law='%s')", c.cb->dim, c.cb->bits,
                             tq::law_name(c.cb->law));
      });

  // ---- Rotation
  nb::class_<PyRotation>(m, "Rotation", "A seeded random orthogonal transform of R^dim applied to row vectors.")
      .def("__init__",
           [](PyRotation* self, int dim, const std::string& kind, uint64_t seed) {
             new (self) PyRotation{tq::make_rotation(tq::parse_rotation(kind), dim, seed)};
           },
           "dim"_a, "kind"_a = "hadamard", "seed"_a = 0x5eed,
           "kind: 'hadamard' (default), 'haar', 'block32', 'block64', 'block128', 'givens', 'iso4', 'identity'.")
      .def_prop_ro("dim", [](const PyRotation& r) { return r.r->dim(); })
      .def_prop_ro("kind", [](const PyRotation& r) { return tq::rotation_name(r.r->spec()); })
      .def_prop_ro("seed", [](const PyRotation& r) { return r.r->seed(); })
      .def("forward", [](const PyRotation& r, const InArray& x) { return rotate(*r.r, x, false); }, "x"_a,
           "Pi x for each row of x ((n, dim) or (dim,) float32); a new array.")
      .def("inverse", [](const PyRotation& r, const InArray& x) { return rotate(*r.r, x, true); }, "x"_a,
           "Pi^T x for each row of x; undoes forward().")
      .def("__repr__", [](const PyRotation& r) {
        return tq::strprintf("turboquant.Rotation(dim=%d, kind='%s', seed=%llu)", r.r->dim(),
                             tq::rotation_name(r.r->spec()).c_str(), static_cast<unsigned long long>(r.r->seed()));
      });

  // ---- Quantizer
  nb::class_<PyQuantizer>(m, "Quantizer",
                          "TurboQuant quantizer: 'mse' (rotation + Lloyd-Max codes + norm), 'prod' (unbiased "
                          "inner products: (bits-1)-bit mse + 1-bit QJL of the residual) or 'qjl'.")
      .def("__init__",
           [](PyQuantizer* self, int dim, int bits, const std::string& kind, const std::string& rotation,
              uint64_t seed, const std::string& law, const std::string& norm, bool norm_correction) {
             tq::QuantizerConfig c;
             c.dim = dim;
             c.bits = bits;
             c.rotation = tq::parse_rotation(rotation);
             c.seed = seed;
             c.law = tq::parse_law(law);
             c.norm = tq::parse_norm_format(norm);
             c.norm_correction = norm_correction;
             new (self) PyQuantizer{tq::make_quantizer(tq::parse_quantizer_kind(kind), c)};
           },
           "dim"_a, "bits"_a = 4, "kind"_a = "mse", "rotation"_a = "hadamard", "seed"_a = 0x5eed,
           "law"_a = "beta", "norm"_a = "f16", "norm_correction"_a = true)
      .def_prop_ro("dim", [](const PyQuantizer& q) { return q.q->dim(); })
      .def_prop_ro("bits", [](const PyQuantizer& q) { return q.q->config().bits; })
      .def_prop_ro("kind", [](const PyQuantizer& q) { return std::string(tq::quantizer_kind_name(q.q->kind())); })
      .def_prop_ro("code_bytes", [](const PyQuantizer& q) { return q.q->code_bytes(); },
                   "Bytes per encoded vector (norms included).")
      .def_prop_ro("bits_per_value", [](const PyQuantizer& q) { return q.q->bits_per_value(); })
      .def_prop_ro("rotation",
                   [](const PyQuantizer& q) {
                     const auto& r = q.q->rotation();
                     return PyRotation{tq::make_rotation(r.spec(), r.dim(), r.seed())};
                   },
                   "The quantizer's rotation (an equal copy: same kind, dim and seed).")
      .def_prop_ro("codebook",
                   [](const PyQuantizer& q) -> std::optional<PyCodebook> {
                     const auto& c = q.q->config();
                     const int b = q.q->kind() == tq::QuantizerKind::mse ? c.bits
                                   : q.q->kind() == tq::QuantizerKind::prod ? c.bits - 1 : 0;
                     if (b == 0) return std::nullopt;
                     return PyCodebook{&tq::get_codebook(c.dim, b, c.law)};
                   },
                   "The Lloyd-Max codebook of the mse stage (None for qjl).")
      .def("encode",
           [](const PyQuantizer& q, const InArray& x) {
             size_t n = 0;
             const float* xp = view<float>(x, "x", 2, 2, q.q->dim(), &n);
             uint8_t* out = nullptr;
             auto res = new_array<uint8_t>({n, q.q->code_bytes()}, &out);
             nb::gil_scoped_release nogil;
             q.q->encode(n, xp, out);
             return res;
           },
           "x"_a, "Codes (n, code_bytes) uint8 of the rows of x ((n, dim) float32, finite).")
      .def("decode",
           [](const PyQuantizer& q, const InArray& codes) {
             size_t n = 0;
             const uint8_t* cp = view<uint8_t>(codes, "codes", 2, 2, static_cast<long>(q.q->code_bytes()), &n);
             float* out = nullptr;
             auto res = new_array<float>({n, static_cast<size_t>(q.q->dim())}, &out);
             nb::gil_scoped_release nogil;
             q.q->decode(n, cp, out);
             return res;
           },
           "codes"_a, "Reconstructions (n, dim) float32 of codes ((n, code_bytes) uint8).")
      .def("score",
           [](const PyQuantizer& q, const InArray& queries, const InArray& codes) {
             size_t nq = 0, n = 0;
             const float* qp = view<float>(queries, "q", 1, 2, q.q->dim(), &nq);
             const uint8_t* cp = view<uint8_t>(codes, "codes", 2, 2, static_cast<long>(q.q->code_bytes()), &n);
             float* out = nullptr;
             auto res = queries.ndim() == 1 ? new_array<float>({n}, &out) : new_array<float>({nq, n}, &out);
             nb::gil_scoped_release nogil;
             std::vector<float> st(q.q->query_state_floats());
             for (size_t i = 0; i < nq; ++i) {
               q.q->prepare_query(qp + i * q.q->dim(), st.data());
               q.q->score(st.data(), n, cp, out + i * n);
             }
             return res;
           },
           "q"_a, "codes"_a,
           "Estimates of <q_i, x_j> from the codes without decoding: q (dim,) -> (n,), q (nq, dim) -> (nq, n).")
      .def("__repr__", [](const PyQuantizer& q) {
        return tq::strprintf("turboquant.Quantizer(dim=%d, bits=%d, kind='%s', rotation='%s', code_bytes=%zu)",
                             q.q->dim(), q.q->config().bits, tq::quantizer_kind_name(q.q->kind()),
                             tq::rotation_name(q.q->config().rotation).c_str(), q.q->code_bytes());
      });

  // ---- Index
  nb::class_<tq::Index>(m, "Index",
                        "Nearest-neighbour index of TurboQuant codes, flat or IVF, scored on the codes (SIMD fast scan). "
                        "Scores: similarity for 'ip' / 'cosine' (higher is nearer), squared distance for 'l2'.")
      .def("__init__",
           [](tq::Index* self, int dim, double bits, const std::string& metric, const std::string& codec,
              const std::string& scale, const std::string& norm, const std::string& rotation, const std::string& law,
              uint64_t seed, bool keep_vectors, std::optional<bool> fit_scale, std::optional<bool> center,
              bool trellis, int nlist, int kmeans_iters, int rerank_bits) {
             tq::IndexConfig c;
             c.dim = dim;
             c.bits = bits;
             c.metric = tq::parse_metric(metric);
             c.codec = tq::parse_quantizer_kind(codec);
             TQ_CHECK(c.codec != tq::QuantizerKind::qjl, "index: codec must be mse or prod");
             c.scale = tq::parse_scale_mode(scale);
             c.norm = tq::parse_norm_format(norm);
             c.rotation = tq::parse_rotation(rotation);
             c.law = tq::parse_law(law);
             c.seed = seed;
             c.keep_vectors = keep_vectors;
             // None: the CLI's default (`tq index build`): a flat mse index fits scales and is centred.
             const bool flat_mse = c.codec == tq::QuantizerKind::mse && nlist == 0;
             c.fit_scale = fit_scale.value_or(flat_mse);
             c.center = center.value_or(flat_mse);
             c.trellis = trellis;
             c.nlist = nlist;
             c.kmeans_iters = kmeans_iters;
             c.rerank_bits = rerank_bits;
             new (self) tq::Index(c);
           },
           "dim"_a, "bits"_a = 4.0, "metric"_a = "cosine", nb::kw_only(), "codec"_a = "mse", "scale"_a = "corrected",
           "norm"_a = "f16", "rotation"_a = "hadamard", "law"_a = "beta", "seed"_a = 0x5eed,
           "keep_vectors"_a = false, "fit_scale"_a = nb::none(), "center"_a = nb::none(), "trellis"_a = false,
           "nlist"_a = 0, "kmeans_iters"_a = 10, "rerank_bits"_a = 0,
           "The options of `tq index build` (same names and defaults): bits 1..8 or a half-integer 1.5..7.5; "
           "metric 'cosine' | 'ip' | 'l2'; fit_scale / center None: on for a flat mse index (the CLI's "
           "--fit-scale --center defaults), off for prod and IVF; trellis: trellis-coded channels (1-4 bits, "
           "flat, higher recall at the same bytes, slower build and search; the CLI's --trellis); nlist > 0: "
           "IVF with nlist lists (the CLI's --ivf; the k-means runs on the first add(), so add the whole "
           "set at once), kmeans_iters its Lloyd iterations, rerank_bits > 0 a second-stage re-rank code "
           "(the CLI's --rerank-bits).")
      .def_prop_ro("nlist", &tq::Index::nlist, "IVF lists (0 for a flat index).")
      .def_prop_ro("dim", &tq::Index::dim)
      .def_prop_ro("d", &tq::Index::dim, "FAISS's name for dim.")
      .def_prop_ro("ntotal", &tq::Index::size, "Number of vectors (FAISS's name; also len()).")
      .def_prop_ro("bits", [](const tq::Index& i) { return i.config().bits; })
      .def_prop_ro("metric", [](const tq::Index& i) { return std::string(tq::metric_name(i.config().metric)); })
      .def_prop_ro("code_bytes", &tq::Index::code_bytes, "Bytes per vector in the file (codes + scale (+ norm)).")
      .def_prop_ro("memory_bytes_per_vector", &tq::Index::memory_bytes_per_vector)
      .def("describe", &tq::Index::describe)
      .def(
          "describe_search",
          [](const tq::Index& i, bool fast_scan, int nprobe) {
            tq::SearchParams p;
            p.fast_scan = fast_scan;
            p.nprobe = nprobe;
            return i.describe_search(p);
          },
          "fast_scan"_a = true, "nprobe"_a = 1,
          "describe() with the scoring a search would use (what `tq index search --json` reports as 'index').")
      .def("__len__", &tq::Index::size)
      .def("add",
           [](tq::Index& idx, const InArray& x, std::optional<InArray> ids, std::optional<nb::callable> progress) {
             size_t n = 0;
             const float* xp = view<float>(x, "x", 2, 2, idx.dim(), &n);
             const int64_t* ip = nullptr;
             if (ids) {
               size_t one = 0;
               ip = view<int64_t>(*ids, "ids", 1, 1, -1, &one);
               TQ_CHECK(ids->shape(0) == n, "ids has %zu entries for %zu vectors", ids->shape(0), n);
             }
             // Called on this thread as the add goes (per chunk of 256 vectors or tile of rows),
             // passed on at the start and end of each stage and otherwise at most every 100 ms,
             // so the add does not wait on the GIL more often: with the GIL it lets a signal
             // handler run (Ctrl-C) and calls progress; an exception from either cancels the
             // add, which leaves the index as it was.
             auto last = std::chrono::steady_clock::now();
             const tq::Index::AddProgress cb = [&progress, &last](const char* stage, size_t done, size_t total) {
               const auto now = std::chrono::steady_clock::now();
               if (done != 0 && done != total && now - last < std::chrono::milliseconds(100)) return;
               last = now;
               nb::gil_scoped_acquire gil;
               if (PyErr_CheckSignals() != 0) throw nb::python_error();
               if (progress) (*progress)(stage, done, total);
             };
             nb::gil_scoped_release nogil;
             idx.add(n, xp, ip, cb);
           },
           "x"_a, "ids"_a = nb::none(), nb::kw_only(), "progress"_a = nb::none(),
           "Add the rows of x ((n, dim) float32, C-contiguous, finite); ids: (n,) int64 or None (next_id, "
           "next_id + 1, ...). progress: None or a callable(stage, done, total), called at the start and end of "
           "each stage ('k-means' and 'assign' for an IVF index, then 'encode') and at most every 100 ms "
           "between. An exception it raises, or Ctrl-C, stops the add and leaves the index as it was.")
      .def(
          "remove_ids",
          [](tq::Index& idx, const InArray& ids) {
            const int64_t* ip = view<int64_t>(ids, "ids", 1, 1, -1, nullptr);
            const size_t n = ids.shape(0);
            nb::gil_scoped_release nogil;
            return idx.remove_ids(n, ip);
          },
          "ids"_a,
          "Remove every vector whose id is in ids ((n,) int64; ids not held are skipped) and return how "
          "many went. The others keep their codes and order: the index searches and saves as one given "
          "only them. O(ntotal) per call, so pass the ids in one array.")
      .def(
          "release_sign_plane",
          [](tq::Index& idx) {
            nb::gil_scoped_release nogil;
            idx.release_sign_plane();
          },
          "Free the two-level scan's sign plane (indexes of dim >= 320, IVF >= 192, at 3 to 4 bits keep one) "
          "and return the codes to the fast-scan layout: the index then searches in one level only (two_level=True is "
          "an error), in less memory. For indexes that never search in two levels, as ShardedIndex shards. "
          "Adds, removes and saves work as before; a loaded index holds a plane again.")
      .def_prop_ro("has_sign_plane", &tq::Index::has_sign_plane,
                   "Whether the index holds the two-level scan's sign plane.")
      .def_prop_ro(
          "ids",
          [](const tq::Index& idx) {
            const std::vector<int64_t> held = idx.ids();
            int64_t* p = nullptr;
            auto a = new_array<int64_t>({held.size()}, &p);
            std::copy(held.begin(), held.end(), p);
            return a;
          },
          nb::rv_policy::move,
          "The ids held ((ntotal,) int64, a new array) in slot order: a flat index's insertion order (the "
          "slots search_candidates returns index it), an IVF index's list by list.")
      .def_prop_ro("next_id", &tq::Index::next_id,
                   "The first id add() gives without ids: one past the largest id held (0 when empty).")
      .def("search",
           [](const tq::Index& idx, const InArray& q, int k, int threads, int rerank, int rerank_full,
              bool fast_scan, int nprobe, std::optional<bool> two_level) {
             size_t nq = 0;
             const float* qp = view<float>(q, "q", 2, 2, idx.dim(), &nq);
             tq::SearchParams p = search_params(k, threads, rerank, rerank_full, fast_scan, nprobe);
             p.two_level = two_level ? (*two_level ? 1 : 0) : -1;
             float* sp = nullptr;
             int64_t* ip = nullptr;
             auto scores = new_array<float>({nq, static_cast<size_t>(k)}, &sp);
             auto ids = new_array<int64_t>({nq, static_cast<size_t>(k)}, &ip);
             {
               nb::gil_scoped_release nogil;
               idx.search(nq, qp, p, sp, ip);
             }
             return nb::make_tuple(scores, ids);
           },
           "q"_a, "k"_a = 10, nb::kw_only(), "threads"_a = 0, "rerank"_a = -1, "rerank_full"_a = 0,
           "fast_scan"_a = true, "nprobe"_a = 1, "two_level"_a = nb::none(),
           "Top-k of each row of q ((nq, dim) float32): (scores (nq, k) float32, ids (nq, k) int64), best first; "
           "missing results get id -1. threads 0: OpenMP default. nprobe: IVF lists scanned per query "
           "(1..nlist; 1 for a flat index). two_level: None (auto: on for fast-scan indexes of dim >= 320, "
           "IVF >= 192, with 3 to 4 bits per channel), True (an error on other indexes) or False: a first pass "
           "over 1 bit per dimension, full codes only for the vectors that can still rank (docs/design.md). An "
           "index searched only with False is faster and smaller after release_sign_plane().")
      .def("train",
           [](tq::Index& idx, const InArray& x) {
             size_t n = 0;
             const float* xp = view<float>(x, "x", 2, 2, idx.dim(), &n);
             nb::gil_scoped_release nogil;
             idx.train(n, xp);
           },
           "x"_a,
           "Fit what the first add() would fit from its batch (center: the mean of the rows of x, normalised "
           "for cosine) without adding them; a no-op without the center option. For sharing one fit between "
           "indexes (set_center).")
      .def_prop_ro(
          "center",
          [](const tq::Index& idx) -> std::optional<nb::ndarray<nb::numpy, float>> {
            const auto& c = idx.center();
            if (c.empty()) return std::nullopt;
            float* p = nullptr;
            auto a = new_array<float>({c.size()}, &p);
            std::copy(c.begin(), c.end(), p);
            return a;
          },
          nb::rv_policy::move,
          "The fitted center (dim,) float32 (a new array), None before the fit or without the center option.")
      .def("set_center",
           [](tq::Index& idx, const InArray& mean) {
             size_t one = 0;
             const float* mp = view<float>(mean, "mean", 1, 1, -1, &one);
             TQ_CHECK(mean.shape(0) == static_cast<size_t>(idx.dim()), "set_center: mean has %zu components, the index has dim %d",
                      mean.shape(0), idx.dim());
             idx.set_center(mp);
           },
           "mean"_a,
           "Set the center of an empty index built with the center option ((dim,) float32, e.g. another "
           "index's center): indexes with one center encode alike.")
      .def("search_candidates",
           [](const tq::Index& idx, const InArray& q, int k, int threads, int rerank, int rerank_full,
              bool fast_scan) {
             size_t nq = 0;
             const float* qp = view<float>(q, "q", 2, 2, idx.dim(), &nq);
             const tq::SearchParams p = search_params(k, threads, rerank, rerank_full, fast_scan);
             const size_t r = idx.candidates_per_query(p);
             float *s1 = nullptr, *s2 = nullptr, *s3 = nullptr, *so = nullptr;
             int64_t *io = nullptr, *sl = nullptr;
             auto a1 = new_array<float>({nq, r}, &s1);
             auto a2 = new_array<float>({nq, r}, &s2);
             auto a3 = new_array<float>({nq, r}, &s3);
             auto ao = new_array<float>({nq, r}, &so);
             auto ai = new_array<int64_t>({nq, r}, &io);
             auto as = new_array<int64_t>({nq, r}, &sl);
             {
               nb::gil_scoped_release nogil;
               idx.search_candidates(nq, qp, p, s1, s2, s3, so, io, sl);
             }
             return nb::make_tuple(a1, a2, a3, ao, ai, as);
           },
           "q"_a, "k"_a = 10, nb::kw_only(), "threads"_a = 0, "rerank"_a = -1, "rerank_full"_a = 0,
           "fast_scan"_a = true,
           "The candidates a search(q, k, ...) keeps for each query before its cut to k, for merging shards "
           "(turboquant.ShardedIndex): (scan, rerank, full, scores, ids, slots), each (nq, r): per query, best "
           "first by scan score, the internal score of each stage (higher is better), the score search() "
           "would report, the id and the slot (insertion position); missing rows: slot -1, scores -inf.")
      .def("save", [](const tq::Index& idx, const std::string& path) {
             nb::gil_scoped_release nogil;
             idx.save(path);
           },
           "path"_a, "Write the index file (atomically; `tq index search --index` reads it).")
      .def_static("load",
                  [](const std::string& path) {
                    nb::gil_scoped_release nogil;
                    return tq::Index::load(path);
                  },
                  "path"_a, "Read an index file (from save() or `tq index build`); validates every field.")
      .def("__getstate__", [](const tq::Index& idx) { return nb::make_tuple(index_bytes(idx)); })
      .def("__setstate__",
           [](tq::Index& self, const nb::tuple& state) {
             TQ_CHECK(state.size() == 1 && nb::isinstance<nb::bytes>(state[0]), "Index.__setstate__: bad state");
             nb::bytes b = nb::cast<nb::bytes>(state[0]);
             new (&self) tq::Index(tq::Index::from_bytes(reinterpret_cast<const uint8_t*>(b.c_str()), b.size(),
                                                         "<pickle>"));
           })
      .def("__repr__", &index_repr);

  m.def("read_vectors",
        [](const std::string& path, std::optional<size_t> max_rows) {
          return matrix_array(tq::read_vectors(path, max_rows.value_or(SIZE_MAX)));
        },
        "path"_a, "max_rows"_a = nb::none(),
        "Vectors from a .fvecs, .bvecs (bytes as floats 0..255) or .npy ('<f4', C order) file as an (n, d) "
        "float32 array; max_rows: only the leading rows. The file is validated first (whole records, one d, "
        "finite values): anything else raises Error naming the file and the record.");
  m.def("read_ivecs",
        [](const std::string& path, std::optional<size_t> max_rows) {
          return matrix_array(tq::read_ivecs(path, max_rows.value_or(SIZE_MAX)));
        },
        "path"_a, "max_rows"_a = nb::none(),
        "An .ivecs file (e.g. ground-truth neighbour ids) as an (n, d) int32 array, validated as read_vectors.");

  m.def("exact_search",
        [](const InArray& x, const InArray& q, int k, const std::string& metric, int threads) {
          size_t n = 0, nq = 0;
          TQ_CHECK(x.ndim() == 2, "x must have 2 dimensions");
          const float* xp = view<float>(x, "x", 2, 2, -1, &n);
          const int d = static_cast<int>(x.shape(1));
          const float* qp = view<float>(q, "q", 2, 2, d, &nq);
          TQ_CHECK(k >= 1 && k <= (1 << 20), "exact_search: k = %d outside [1, 2^20]", k);
          check_finite(n * d, xp, "x");
          check_finite(nq * d, qp, "q");
          const tq::Metric mt = tq::parse_metric(metric);
          float* sp = nullptr;
          int64_t* ip = nullptr;
          auto scores = new_array<float>({nq, static_cast<size_t>(k)}, &sp);
          auto ids = new_array<int64_t>({nq, static_cast<size_t>(k)}, &ip);
          {
            nb::gil_scoped_release nogil;
            tq::exact_search(mt, n, d, xp, nq, qp, k, sp, ip, threads);
          }
          return nb::make_tuple(scores, ids);
        },
        "x"_a, "q"_a, "k"_a = 10, "metric"_a = "cosine", "threads"_a = 0,
        "Brute-force float search (ground truth): (scores, ids) as Index.search.");

  // ---- KVCache
  nb::class_<PyKVCache>(m, "KVCache",
                        "Quantized KV cache of n_layers x n_kv_heads x head_dim with fused attention. The cache "
                        "choice is a label as `tq perplexity --kv-config` takes it: 'f16', 'tq4/tq3' (K/V types), "
                        "'k=tq3h6 v=tq4n8 sink=1 center=k,rope,512 scale-k', 'tq4/tq3 w128 plain', ..., or '@path' for "
                        "a cache config file.")
      .def("__init__",
           [](PyKVCache* self, const std::string& label, int n_layers, int n_kv_heads, int head_dim, int max_tokens,
              float rope_base, int rope_dim, bool rope_neox) {
             new (self) PyKVCache(label, tq::capi::kv_cache_config(label, n_layers, n_kv_heads, head_dim, max_tokens,
                                                                   rope_base, rope_dim, rope_neox));
           },
           "label"_a = "f16", "n_layers"_a = 1, "n_kv_heads"_a = 1, "head_dim"_a = 128, "max_tokens"_a = 4096,
           "rope_base"_a = 0.0f, "rope_dim"_a = 0, "rope_neox"_a = false,
           "rope_base, rope_dim: the keys' RoPE, needed when the K mean rotates with RoPE ('cr', part of a tq K "
           "type's automatic protection unless the label says 'plain' or gives a centring); rope_neox: the model "
           "rotates the pairs (i, i + rope_dim / 2) (GPT-NeoX style: Qwen 2/3, Gemma) rather than (2i, 2i + 1); "
           "give K and queries as the model holds them.")
      .def_prop_ro("label", [](const PyKVCache& c) { return c.label; })
      .def_prop_ro("n_layers", [](const PyKVCache& c) { return c.cache.config().n_layers; })
      .def_prop_ro("n_kv_heads", [](const PyKVCache& c) { return c.cache.config().n_kv_heads; })
      .def_prop_ro("head_dim", [](const PyKVCache& c) { return c.cache.config().head_dim; })
      .def_prop_ro("max_tokens", [](const PyKVCache& c) { return c.cache.config().max_tokens; })
      .def_prop_ro("bytes_used", [](const PyKVCache& c) { return c.cache.bytes_used(); })
      .def_prop_ro("bytes_per_token", [](const PyKVCache& c) { return c.cache.bytes_per_token(); })
      .def("n_tokens", [](const PyKVCache& c, int layer) { return c.cache.n_tokens(layer); }, "layer"_a = 0)
      .def("clear", [](PyKVCache& c) { c.cache.clear(); })
      .def("append",
           [](PyKVCache& c, int layer, const InArray& k, const InArray& v, int threads) {
             const auto& cfg = c.cache.config();
             size_t nk = 0, nv = 0;
             const float* kp = view<float>(k, "k", 3, 3, cfg.head_dim, &nk);
             const float* vp = view<float>(v, "v", 3, 3, cfg.head_dim, &nv);
             TQ_CHECK(k.shape(1) == static_cast<size_t>(cfg.n_kv_heads) && v.shape(1) == k.shape(1) &&
                          v.shape(0) == k.shape(0),
                      "k and v must both have shape (n_tokens, %d, %d), got %s and %s", cfg.n_kv_heads, cfg.head_dim,
                      shape_str(k).c_str(), shape_str(v).c_str());
             TQ_CHECK(k.shape(0) <= static_cast<size_t>(cfg.max_tokens), "append: %zu tokens exceed max_tokens %d",
                      k.shape(0), cfg.max_tokens);
             nb::gil_scoped_release nogil;
             c.cache.append(layer, static_cast<int>(k.shape(0)), kp, vp, threads);
           },
           "layer"_a, "k"_a, "v"_a, "threads"_a = 1,
           "Append tokens to one layer: k, v (n_tokens, n_kv_heads, head_dim) float32 (RoPE already applied).")
      .def("attention",
           [](const PyKVCache& c, int layer, const InArray& q, float scale, int threads, bool reference) {
             const auto& cfg = c.cache.config();
             size_t rows = 0;
             const float* qp = view<float>(q, "q", 3, 3, cfg.head_dim, &rows);
             TQ_CHECK(q.shape(0) <= (1u << 30), "attention: too many queries");
             tq::AttentionParams p;
             p.n_heads = static_cast<int>(q.shape(1));
             p.scale = scale;
             p.n_threads = threads;
             check_finite(q.shape(0) * q.shape(1) * q.shape(2), qp, "q");
             float* out = nullptr;
             auto res = new_array<float>({q.shape(0), q.shape(1), q.shape(2)}, &out);
             nb::gil_scoped_release nogil;
             if (reference)
               tq::attention_ref(c.cache, layer, static_cast<int>(q.shape(0)), qp, out, p);
             else
               tq::attention(c.cache, layer, static_cast<int>(q.shape(0)), qp, out, p);
             return res;
           },
           "layer"_a, "q"_a, "scale"_a = 0.0f, "threads"_a = 0, "reference"_a = false,
           "Causal attention of the n_q queries q (n_q, n_heads, head_dim) float32 at the layer's last n_q "
           "positions; n_heads a multiple of n_kv_heads (GQA). scale 0: 1/sqrt(head_dim). reference=True: "
           "the test oracle (rows dequantized, exact float attention). Returns (n_q, n_heads, head_dim).")
      .def("__repr__", [](const PyKVCache& c) {
        const auto& cfg = c.cache.config();
        return tq::strprintf("turboquant.KVCache('%s', n_layers=%d, n_kv_heads=%d, head_dim=%d, max_tokens=%d, "
                             "tokens=%d)",
                             tq::short_label(c.label).c_str(), cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
                             cfg.max_tokens, c.cache.n_tokens(0));
      });

  // ---- Model
  nb::class_<PyModel>(m, "Model", "A GGUF Llama-family model (e.g. SmolLM2-135M) with its tokenizer.")
      .def_static("load",
                  [](const std::string& path, int threads) {
                    auto pm = [&] {
                      nb::gil_scoped_release nogil;
                      auto g = tq::GgufFile::open(path);
                      tq::Tokenizer tok(g);
                      tq::LlamaModel lm = tq::LlamaModel::load(g);
                      lm.set_threads(threads);
                      return new PyModel{std::move(g), std::move(tok), std::move(lm), path};
                    }();
                    return std::unique_ptr<PyModel>(pm);
                  },
                  "path"_a, "threads"_a = 0, "Load a GGUF file; threads 0: all cores.")
      .def_prop_ro("path", [](const PyModel& m) { return m.path; })
      .def_prop_ro("n_layers", [](const PyModel& m) { return m.model.config().n_layers; })
      .def_prop_ro("n_heads", [](const PyModel& m) { return m.model.config().n_heads; })
      .def_prop_ro("n_kv_heads", [](const PyModel& m) { return m.model.config().n_kv_heads; })
      .def_prop_ro("head_dim", [](const PyModel& m) { return m.model.config().head_dim; })
      .def_prop_ro("n_vocab", [](const PyModel& m) { return m.model.config().n_vocab; })
      .def_prop_ro("n_ctx_train", [](const PyModel& m) { return m.model.config().n_ctx_train; })
      .def_prop_rw("threads", [](const PyModel& m) { return m.model.threads(); },
                   [](PyModel& m, int t) { m.model.set_threads(t); })
      .def("tokenize",
           [](const PyModel& m, const std::string& text, bool add_bos, bool parse_special) {
             return add_bos ? m.tok.encode_with_bos(text, parse_special) : m.tok.encode(text, parse_special);
           },
           "text"_a, "add_bos"_a = true, "parse_special"_a = false, "Token ids of text.")
      .def("detokenize",
           [](const PyModel& m, const std::vector<int32_t>& ids, bool render_special) {
             const int nv = m.model.config().n_vocab;
             for (size_t i = 0; i < ids.size(); ++i)
               TQ_CHECK(ids[i] >= 0 && ids[i] < nv, "detokenize: token id %d at %zu outside [0, %d)", ids[i], i, nv);
             const std::string b = m.tok.decode(ids, render_special);
             return nb::bytes(b.data(), b.size());
           },
           "ids"_a, "render_special"_a = false, "The bytes of the token ids (UTF-8 text split at token edges may be "
                                                  "partial: decode with errors='replace').")
      .def("new_cache",
           [](const PyModel& m, const std::string& label, int max_tokens) {
             return new PyKVCache(label, tq::capi::kv_options(label).resolve(m.model.config(), max_tokens));
           },
           "label"_a = "f16", "max_tokens"_a = 2048, "A KVCache with this model's shape.")
      .def("perplexity",
           [](const PyModel& m, nb::handle text, const std::string& cache, int n_ctx, int n_chunks, bool compare,
              const std::string& ref) {
             const std::vector<int32_t> toks = tokens_of(m, text, "text");
             tq::PerplexityOptions o;
             o.n_ctx = n_ctx;
             o.n_chunks = n_chunks;
             o.compare = compare;
             o.kv = tq::capi::kv_options(cache);
             o.ref = tq::capi::kv_options(ref);
             tq::PerplexityResult r;
             {
               nb::gil_scoped_release nogil;
               r = tq::perplexity(m.model, toks, o);
             }
             nb::dict d;
             d["cache"] = cache;
             d["n_ctx"] = r.n_ctx;
             d["n_chunks"] = r.n_chunks;
             d["n_scored"] = r.n_scored;
             d["ppl"] = r.ppl;
             d["kv_bytes_per_token"] = r.kv_bytes_per_token;
             d["bits_per_value"] = r.bits_per_value;
             d["seconds"] = r.seconds;
             d["chunk_ppl"] = r.chunk_ppl;
             if (compare) {
               d["ppl_ref"] = r.ppl_ref;
               d["kld_mean"] = r.kld_mean;
               d["kld_p99"] = r.kld_p99;
               d["top1_agreement"] = r.top1_agreement;
             }
             return d;
           },
           "text"_a, "cache"_a = "f16", "n_ctx"_a = 512, "n_chunks"_a = 0, "compare"_a = false, "ref"_a = "f16",
           "Perplexity of text (str, or a list of token ids) on the cache label `cache`, as `tq perplexity`: "
           "windows of n_ctx tokens, the second half of each scored. compare=True also runs the `ref` cache "
           "for KL divergence and top-1 agreement. Returns a dict.")
      .def("generate",
           [](const PyModel& m, nb::handle prompt, int max_tokens, const std::string& cache, float temperature,
              float top_p, int top_k, uint64_t seed, bool chat) {
             std::vector<int32_t> ids;
             if (chat) {
               TQ_CHECK(nb::isinstance<nb::str>(prompt), "generate: chat=True needs a str prompt");
               ids = m.tok.encode_with_bos(m.tok.apply_chat_template({{"user", nb::cast<std::string>(prompt)}}, true),
                                           true);
             } else {
               ids = tokens_of(m, prompt, "prompt");
             }
             TQ_CHECK(!ids.empty(), "generate: empty prompt");
             TQ_CHECK(max_tokens >= 0, "generate: max_tokens must be >= 0");
             const tq::KvSpec kv = tq::capi::kv_options(cache);
             tq::SamplerParams sp;
             sp.temperature = temperature;
             sp.top_p = top_p;
             sp.top_k = top_k;
             sp.seed = seed;
             std::vector<int32_t> out;
             {
               nb::gil_scoped_release nogil;
               tq::KvCache kc(kv.resolve(m.model.config(), static_cast<int>(ids.size()) + max_tokens));
               tq::Sampler sampler(sp);
               std::vector<float> lg = m.model.forward_last(kc, ids);
               for (int i = 0; i < max_tokens; ++i) {
                 const int32_t id = sampler.sample(lg.data(), static_cast<int>(lg.size()));
                 if (m.tok.is_end_of_generation(id)) break;
                 out.push_back(id);
                 if (i + 1 < max_tokens) lg = m.model.forward_last(kc, {id});
               }
             }
             const std::string text = m.tok.decode(out);
             return nb::make_tuple(nb::steal(PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace")),
                                  out);
           },
           "prompt"_a, "max_tokens"_a = 32, "cache"_a = "f16", "temperature"_a = 0.0f, "top_p"_a = 0.95f,
           "top_k"_a = 0, "seed"_a = 1, "chat"_a = false,
           "Generate up to max_tokens tokens after prompt (str or token ids) on the cache label `cache` "
           "(temperature 0: greedy), as `tq generate`. Returns (text, token ids).")
      .def("__repr__", [](const PyModel& m) {
        const auto& c = m.model.config();
        return tq::strprintf("turboquant.Model('%s', arch=%s, n_layers=%d, n_heads=%d, n_kv_heads=%d, head_dim=%d)",
                             m.path.c_str(), c.arch.c_str(), c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
      });
}
