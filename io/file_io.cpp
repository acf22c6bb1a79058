// io/file_io.cpp
#include "io/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace lockstep {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  std::vector<char> name(path_.begin(), path_.end());
  const std::string suffix = ".tmp-XXXXXX";
  name.insert(name.end(), suffix.begin(), suffix.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  LOCKSTEP_CHECK(fd_ >= 0, "cannot write ", path_, ": creating a temporary file next to it failed (",
                 errno_text(), ")");
  temp_path_ = name.data();
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  LOCKSTEP_CHECK(fd_ >= 0, "cannot write ", path_, ": the file was already committed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // write() may write less than asked (and at most ~2 GiB per call on Linux): loop.
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    LOCKSTEP_CHECK(n > 0, "cannot write ", path_, ": ", n < 0 ? errno_text() : "wrote 0 bytes");
    p += n;
    bytes -= size_t(n);
  }
}

void AtomicFile::commit() {
  LOCKSTEP_CHECK(fd_ >= 0, "cannot write ", path_, ": the file was already committed");
  // mkstemp creates mode 0600; a checkpoint should be readable like any other file.
  LOCKSTEP_CHECK(::fchmod(fd_, 0644) == 0, "cannot write ", path_, ": fchmod: ", errno_text());
  // Flush before the rename: otherwise a crash could leave the new name pointing at missing data.
  LOCKSTEP_CHECK(::fsync(fd_) == 0, "cannot write ", path_, ": fsync: ", errno_text());
  const int fd = fd_;
  fd_ = -1;
  LOCKSTEP_CHECK(::close(fd) == 0, "cannot write ", path_, ": close: ", errno_text());
  LOCKSTEP_CHECK(std::rename(temp_path_.c_str(), path_.c_str()) == 0, "cannot write ", path_,
                 ": renaming ", temp_path_, " over it failed (", errno_text(), ")");
  temp_path_.clear();
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents);
  file.commit();
}

namespace {

// fsync of one file or folder (a folder's fsync makes the names in it durable).
void sync_path(const std::filesystem::path& path, bool folder) {
  const int fd = ::open(path.c_str(), (folder ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  LOCKSTEP_CHECK(fd >= 0, "cannot open ", path.string(), " to flush it: ", errno_text());
  const bool ok = ::fsync(fd) == 0;
  const std::string error = errno_text();
  ::close(fd);
  LOCKSTEP_CHECK(ok, "cannot flush ", path.string(), " to disk: ", error);
}

// Every file and folder under `root`, and `root`: a rename of `root` that reaches the disk then
// finds all of them there (files copied in, not only those written by AtomicFile).
void sync_tree(const std::filesystem::path& root) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_directory()) sync_path(entry.path(), true);
    else if (entry.is_regular_file()) sync_path(entry.path(), false);
  }
  sync_path(root, true);
}

}  // namespace

void replace_folder(const std::string& source, const std::string& target) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::absolute(fs::path(target)).parent_path();
  try {
    sync_tree(source);
    bool exchanged = false;
    if (fs::exists(target)) {
      exchanged = ::renameat2(AT_FDCWD, source.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0;
      // EINVAL / ENOSYS: a file system without the exchange; anything else is a real failure.
      LOCKSTEP_CHECK(exchanged || errno == EINVAL || errno == ENOSYS, "cannot replace ", target,
                     " by ", source, ": ", errno_text());
    }
    if (exchanged) {
      fs::remove_all(source);  // the old folder
    } else {
      const std::string old = target + ".old";
      fs::remove_all(old);
      if (fs::exists(target)) fs::rename(target, old);
      fs::rename(source, target);
      fs::remove_all(old);
    }
    sync_path(parent, true);
  } catch (const fs::filesystem_error& e) {
    fail(detail::concat("cannot replace ", target, " by ", source, ": ", e.what()));
  }
}

bool recover_replaced_folder(const std::string& target) {
  namespace fs = std::filesystem;
  const std::string old = target + ".old";
  if (fs::exists(target) || !fs::is_directory(old)) return false;
  fs::rename(old, target);
  return true;
}

std::string read_file(const std::string& path, std::string_view what) {
  struct stat st {};
  LOCKSTEP_CHECK(::stat(path.c_str(), &st) == 0, "cannot read ", what, " ", path, ": ", errno_text());
  LOCKSTEP_CHECK(S_ISREG(st.st_mode), "cannot read ", what, " ", path, ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK(in.is_open(), "cannot read ", what, " ", path, ": ", errno_text());
  std::ostringstream text;
  text << in.rdbuf();
  LOCKSTEP_CHECK(in.good() || in.eof(), "cannot read ", what, " ", path, ": read failed");
  return text.str();
}

std::string_view trimmed(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n\f\v";
  const size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kSpace) - begin + 1);
}

void for_each_nonblank_line(std::string_view text,
                            const std::function<void(std::string_view line, size_t number)>& each_line) {
  size_t number = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++number;
    if (!trimmed(line).empty()) each_line(line, number);
  }
}

}  // namespace lockstep
