// tests/fuzz/fuzz_input.h — what the libFuzzer harnesses share: the input as a file (the readers
// under test take paths), and splitting one input into several strings.
//
// The rule every harness enforces: bad input may only throw lockstep::Error (one clear message).
// Any other exception (a json type_error, std::out_of_range, ...) leaves LLVMFuzzerTestOneInput,
// which libFuzzer reports as a crash, as it does ASan and UBSan reports.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::fuzz {

// One in-memory file (memfd) per harness, rewritten for every input: `path()` names it
// (/proc/self/fd/N, a regular file to stat, read and mmap), and no disk is touched.
class InputFile {
 public:
  InputFile() : fd_(::memfd_create("lockstep_fuzz", 0)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& path(std::string_view contents) {
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, contents.data(), contents.size(), 0) != ssize_t(contents.size())) {
      std::perror("writing the fuzz input file");
      std::abort();
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

// The input cut at each `separator` byte (the last part runs to the end).
inline std::vector<std::string_view> split(const uint8_t* data, size_t size, char separator) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  for (size_t begin = 0;;) {
    const size_t end = text.find(separator, begin);
    if (end == std::string_view::npos) {
      parts.push_back(text.substr(begin));
      return parts;
    }
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
}

// Stops the fuzzer with a message: a property of the code under test that the input broke.
[[noreturn]] inline void property_failed(const char* what) {
  std::fprintf(stderr, "property failed: %s\n", what);
  std::abort();
}

}  // namespace lockstep::fuzz
