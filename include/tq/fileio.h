// Crash-safe file writing and bounded file reading.
//
// atomic_write_file(path, ...) writes the new contents to a temporary file in the same
// directory (`<path>.tmp.<pid>.<counter>`), fsyncs it, renames it over `path` and fsyncs the
// directory. A crash at any point leaves either the old or the new file at `path`, never a
// mix; a failed write (exception) removes the temporary file and leaves `path` untouched.
// Errors (cannot create, short write, ENOSPC, ...) throw tq::Error naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tq {

// Sequential writer handed to the fill callback of atomic_write_file.
class FileWriter {
 public:
  virtual ~FileWriter() = default;
  virtual void write(const void* data, size_t n) = 0;
  virtual uint64_t bytes_written() const noexcept = 0;
};

// Replace `path` atomically with whatever `fill` writes.
void atomic_write_file(const std::string& path, const std::function<void(FileWriter&)>& fill);
// Replace `path` atomically with n bytes.
void atomic_write_file(const std::string& path, const void* data, size_t n);

// The whole file, refusing files larger than max_bytes (tq::Error naming the path).
std::vector<uint8_t> read_file_bytes(const std::string& path, size_t max_bytes = SIZE_MAX);
// Size in bytes of a regular file (tq::Error when it cannot be stat'ed).
uint64_t file_size(const std::string& path);

// Fault injection for tests: simulate a crash (the process stopping) at a given point of the
// next atomic writes in this process. The temporary file is left behind as a crash would,
// `path` is not touched, and tq::Error("simulated crash ...") is thrown.
enum class AtomicWriteFault : uint8_t { none = 0, after_partial_write = 1, before_rename = 2 };
void set_atomic_write_fault(AtomicWriteFault f) noexcept;

}  // namespace tq

namespace tq {
// XXH3 64-bit hash (xxHash), the checksum of tq's binary files.
uint64_t checksum64(const void* data, size_t n) noexcept;
}  // namespace tq
