// io/file_io.h — reading a whole file (and walking its lines), and writing one atomically: readers
// see either the old file or the complete new one, never a half-written one. The bytes go to a
// temporary file in the same folder (same file system, so rename is atomic), flushed to disk and
// renamed over the target.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace lockstep {

class AtomicFile {
 public:
  // Creates "<path>.tmp-XXXXXX" next to `path`; throws lockstep::Error naming `path` if it cannot.
  explicit AtomicFile(std::string path);
  // Without commit() (an error on the way): removes the temporary file, leaves `path` untouched.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync, close, rename over the target. The file then has mode 0644.
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
};

// The whole of `contents` as the file `path`, atomically.
void write_file_atomically(const std::string& path, std::string_view contents);

// The whole file as bytes; `what` names it in the error ("config", "index").
std::string read_file(const std::string& path, std::string_view what);

// `text` without its leading and trailing whitespace.
std::string_view trimmed(std::string_view text);

// Calls each_line(line, number) on every line of `text` (JSONL files) that is not blank, in order;
// lines are numbered from 1, blank ones counted, so that an error can name "path:number".
void for_each_nonblank_line(std::string_view text,
                            const std::function<void(std::string_view line, size_t number)>& each_line);

}  // namespace lockstep
