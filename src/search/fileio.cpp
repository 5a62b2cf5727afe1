// Atomic file replacement (temp file + fsync + rename + fsync of the directory) and bounded
// whole-file reads. See include/tq/fileio.h.
#include "tq/fileio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "tq/error.h"

namespace tq {

namespace {

std::atomic<uint8_t> g_fault{0};
std::atomic<uint64_t> g_tmp_counter{0};

std::string dir_of(const std::string& path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

class FdWriter final : public FileWriter {
 public:
  FdWriter(int fd, const std::string& path) : fd_(fd), path_(path) {}
  void write(const void* data, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      TQ_CHECK(w > 0, "write to '%s' failed: %s", path_.c_str(), std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
  }
  uint64_t bytes_written() const noexcept override { return written_; }

 private:
  int fd_;
  const std::string& path_;
  uint64_t written_ = 0;
};

// Writes that simulate a crash part-way through: only the first half reaches the disk.
class HalfWriter final : public FileWriter {
 public:
  explicit HalfWriter(FdWriter& w) : w_(w) {}
  void write(const void* data, size_t n) override {
    if (n > 1) w_.write(data, n / 2);
    TQ_CHECK(false, "simulated crash during write");
  }
  uint64_t bytes_written() const noexcept override { return w_.bytes_written(); }

 private:
  FdWriter& w_;
};

void fsync_dir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TQ_CHECK(dfd >= 0, "cannot open directory '%s' to fsync it: %s", dir.c_str(), std::strerror(errno));
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  TQ_CHECK(rc == 0, "fsync of directory '%s' failed: %s", dir.c_str(), std::strerror(err));
}

}  // namespace

void set_atomic_write_fault(AtomicWriteFault f) noexcept { g_fault.store(static_cast<uint8_t>(f)); }

void atomic_write_file(const std::string& path, const std::function<void(FileWriter&)>& fill) {
  TQ_CHECK(!path.empty(), "atomic_write_file: empty path");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(g_tmp_counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TQ_CHECK(fd >= 0, "cannot create temporary file '%s': %s", tmp.c_str(), std::strerror(errno));
  const auto fault = static_cast<AtomicWriteFault>(g_fault.load());
  bool crashed = false;
  try {
    FdWriter w(fd, tmp);
    if (fault == AtomicWriteFault::after_partial_write) {
      crashed = true;
      HalfWriter hw(w);
      fill(hw);
      TQ_CHECK(false, "simulated crash during write");
    }
    fill(w);
    TQ_CHECK(::fsync(fd) == 0, "fsync of '%s' failed: %s", tmp.c_str(), std::strerror(errno));
    if (fault == AtomicWriteFault::before_rename) {
      crashed = true;
      TQ_CHECK(false, "simulated crash before rename of '%s'", tmp.c_str());
    }
    TQ_CHECK(::close(fd) == 0, "close of '%s' failed: %s", tmp.c_str(), std::strerror(errno));
    fd = -1;
    TQ_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "rename '%s' -> '%s' failed: %s",
             tmp.c_str(), path.c_str(), std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    if (!crashed) ::unlink(tmp.c_str());  // a real crash would leave it; a clean error does not
    throw;
  }
  fsync_dir(dir_of(path));
}

void atomic_write_file(const std::string& path, const void* data, size_t n) {
  atomic_write_file(path, [&](FileWriter& w) { w.write(data, n); });
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  TQ_CHECK(::stat(path.c_str(), &st) == 0, "cannot stat '%s': %s", path.c_str(), std::strerror(errno));
  TQ_CHECK(S_ISREG(st.st_mode), "'%s' is not a regular file", path.c_str());
  return static_cast<uint64_t>(st.st_size);
}

std::vector<uint8_t> read_file_bytes(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TQ_CHECK(fd >= 0, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    TQ_CHECK(false, "'%s' is not a readable regular file", path.c_str());
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    TQ_CHECK(false, "'%s' is %llu bytes, more than the limit of %zu", path.c_str(),
             static_cast<unsigned long long>(size), max_bytes);
  }
  std::vector<uint8_t> buf;
  try {
    buf.resize(static_cast<size_t>(size));
  } catch (...) {
    ::close(fd);
    throw;
  }
  size_t off = 0;
  while (off < buf.size()) {
    ssize_t r = ::read(fd, buf.data() + off, buf.size() - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      ::close(fd);
      TQ_CHECK(false, "read of '%s' failed at byte %zu: %s", path.c_str(), off,
               r == 0 ? "unexpected end of file" : std::strerror(err));
    }
    off += static_cast<size_t>(r);
  }
  ::close(fd);
  return buf;
}

}  // namespace tq

#include <xxhash.h>

namespace tq {
uint64_t checksum64(const void* data, size_t n) noexcept { return XXH3_64bits(data, n); }
}  // namespace tq
