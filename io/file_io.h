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

// Puts the complete folder `source` in the place of folder `target` (both in the same folder) so
// that, even if the process is killed at any point, `target` names either the old folder or the
// new one, whole: everything under `source` is flushed to disk first, then the two are exchanged
// in one atomic rename (renameat2 RENAME_EXCHANGE) and the old one, now at `source`, is removed.
// Without a `target` yet, or on a file system that cannot exchange, `target` is first renamed to
// "<target>.old" (which recover_replaced_folder puts back if a crash left no `target`). Throws
// lockstep::Error naming the folders.
void replace_folder(const std::string& source, const std::string& target);

// After a crash inside replace_folder's fallback (between its two renames): when `target` is
// missing and "<target>.old" exists, renames it back. Returns whether it did.
bool recover_replaced_folder(const std::string& target);

// The whole file as bytes; `what` names it in the error ("config", "index").
std::string read_file(const std::string& path, std::string_view what);

// `text` without its leading and trailing whitespace.
std::string_view trimmed(std::string_view text);

// Calls each_line(line, number) on every line of `text` (JSONL files) that is not blank, in order;
// lines are numbered from 1, blank ones counted, so that an error can name "path:number".
void for_each_nonblank_line(std::string_view text,
                            const std::function<void(std::string_view line, size_t number)>& each_line);

}  // namespace lockstep
