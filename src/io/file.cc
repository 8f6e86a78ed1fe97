#include "io/file.h"

#include "base/sha256.h"
#include "base/strings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace nibble {

namespace {
// A failed open: the path is missing (kNotFound) or the OS refused it (kIo).
ErrorCode OpenErrorCode() { return errno == ENOENT || errno == ENOTDIR ? ErrorCode::kNotFound : ErrorCode::kIo; }
}  // namespace

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

Result<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MakeErrorCode(OpenErrorCode(), "cannot open ", path, ": ", ErrnoText());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string e = ErrnoText();
    ::close(fd);
    return MakeErrorCode(ErrorCode::kIo, "cannot stat ", path, ": ", e);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return MakeError("cannot read ", path, ": is a directory, expected a file");
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string e = ErrnoText();
      ::close(fd);
      return MakeErrorCode(ErrorCode::kIo, "cannot read ", path, ": ", e);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MakeErrorCode(OpenErrorCode(), "cannot open ", path, ": ", ErrnoText());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string e = ErrnoText();
    ::close(fd);
    return MakeErrorCode(ErrorCode::kIo, "cannot stat ", path, ": ", e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return MakeError("cannot map ", path, ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string e = ErrnoText();
      ::close(fd);
      return MakeErrorCode(ErrorCode::kIo, "cannot mmap ", path, ": ", e);
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

void MappedFile::Release(const uint8_t* p, size_t n) const {
  if (n == 0 || !Contains(p, n)) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void MappedFile::Evict(const uint8_t* p, size_t n) const {
  if (n == 0 || !Contains(p, n)) return;
  Release(p, n);
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::posix_fadvise(fd, static_cast<off_t>(p - data_), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
  ::close(fd);
}

void MappedFile::WillNeed(const uint8_t* p, size_t n) const {
  if (n == 0 || !Contains(p, n)) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

namespace {

// Writes all of `data` to `fd`, retrying short writes and EINTR; false (errno set) on failure.
bool WriteAll(int fd, std::span<const uint8_t> data) {
  const uint8_t* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Status WriteFileAtomic(const std::string& path, const void* bytes, size_t size) {
  return WriteFileAtomicParts(path, {std::span<const uint8_t>(static_cast<const uint8_t*>(bytes), size)});
}

Status WriteFileAtomicParts(const std::string& path, const std::vector<std::span<const uint8_t>>& parts) {
  NIBBLE_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Open(path));
  for (const auto& part : parts) NIBBLE_RETURN_IF_ERROR(w->Write(part.data(), part.size()));
  return w->Commit();
}

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Open(const std::string& path) {
  std::unique_ptr<AtomicFileWriter> w(new AtomicFileWriter());
  w->path_ = path;
  w->tmp_ = path + ".tmp-" + std::to_string(::getpid());
  w->fd_ = ::open(w->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return MakeErrorCode(ErrorCode::kIo, "cannot create ", w->tmp_, ": ", ErrnoText());
  return w;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Status AtomicFileWriter::Write(const void* bytes, size_t size) {
  if (!WriteAll(fd_, std::span<const uint8_t>(static_cast<const uint8_t*>(bytes), size)))
    return MakeErrorCode(ErrorCode::kIo, "cannot write ", tmp_, ": ", ErrnoText());
  return Status::Ok();
}

Status AtomicFileWriter::Commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string e = ErrnoText();
    ::unlink(tmp_.c_str());
    return MakeErrorCode(ErrorCode::kIo, "cannot flush ", tmp_, ": ", e);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::string e = ErrnoText();
    ::unlink(tmp_.c_str());
    return MakeErrorCode(ErrorCode::kIo, "cannot rename ", tmp_, " to ", path_, ": ", e);
  }
  return Status::Ok();
}

Status CheckModelDir(const std::string& dir) {
  if (!PathExists(dir)) return MakeErrorCode(ErrorCode::kNotFound, dir, ": model directory does not exist");
  if (!IsDirectory(dir)) return MakeErrorCode(ErrorCode::kNotFound, dir, ": is not a directory (expected a Hugging Face model directory)");
  if (!PathExists(JoinPath(dir, "config.json")))
    return MakeErrorCode(ErrorCode::kNotFound, dir, ": no config.json (expected a Hugging Face model directory)");
  return Status::Ok();
}

Status FileSha256Update(const std::string& path, uint64_t offset, int64_t size, Sha256& h) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return MakeErrorCode(ErrorCode::kIo, "cannot open ", path, ": ", ErrnoText());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || (size >= 0 && offset + static_cast<uint64_t>(size) > static_cast<uint64_t>(st.st_size))) {
    ::close(fd);
    return MakeErrorCode(ErrorCode::kCorruptInput, path, " is shorter than ", offset, " + ", size, " bytes");
  }
  uint64_t left = size >= 0 ? static_cast<uint64_t>(size) : static_cast<uint64_t>(st.st_size) - std::min<uint64_t>(offset, st.st_size);
  std::vector<char> buf(1 << 20);
  uint64_t at = offset;
  while (left > 0) {
    const ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(left, buf.size()), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? ErrnoText() : "unexpected end of file";
      ::close(fd);
      return MakeErrorCode(ErrorCode::kIo, "cannot read ", path, ": ", why);
    }
    h.Update(std::string_view(buf.data(), static_cast<size_t>(n)));
    (void)::posix_fadvise(fd, static_cast<off_t>(at), n, POSIX_FADV_DONTNEED);
    at += static_cast<uint64_t>(n);
    left -= static_cast<uint64_t>(n);
  }
  ::close(fd);
  return Status::Ok();
}

Result<std::string> FileSha256(const std::string& path, uint64_t offset, int64_t size) {
  Sha256 h;
  NIBBLE_RETURN_IF_ERROR(FileSha256Update(path, offset, size, h));
  return h.HexDigest();
}

}  // namespace nibble
