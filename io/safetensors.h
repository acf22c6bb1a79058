// io/safetensors.h — Hugging Face safetensors checkpoints: reading one file or a sharded folder
// (zero-copy, through mmap) and writing them (atomically).
//
// The format: 8 bytes little-endian N, then N bytes of JSON header, then the data section.
//   {"__metadata__": {"k": "v", ...},                       (optional, strings only)
//    "name": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// Offsets are bytes relative to the start of the data section. Writers pad the header with spaces
// so the data section starts 8-byte aligned.
//
// dtypes lockstep reads and writes: F32, BF16, F16, F8_E4M3, F8_E8M0, I32, I64 (every DType).
// Entries of the format's other dtypes (F64, U8, BOOL, F4, ...) are validated and listed, and
// asking for their tensor is an "unsupported dtype" error: a checkpoint with one unused odd buffer
// still opens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace lockstep {

using SafetensorsMetadata = std::map<std::string, std::string>;

// One tensor's header entry, as the file describes it.
struct SafetensorsEntry {
  std::string dtype;  // as written in the file: "BF16", "F32", ...
  Shape shape;
  size_t begin = 0, end = 0;  // byte range in the data section
};

// One .safetensors file, mapped read-only. Tensors are views into the mapping: they are valid only
// while this object lives, and are read-only (writing through one faults; copy with .to(cpu)).
// A tensor whose bytes are not aligned to its element size (files whose header was not padded) is
// returned as an owned copy instead, so typed loads are always aligned.
class SafetensorsFile {
 public:
  // Maps and validates the whole header; every malformed input throws lockstep::Error naming the
  // file and, where it applies, the tensor.
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  size_t size() const { return entries_.size(); }
  const SafetensorsEntry& entry(const std::string& name) const;
  Tensor tensor(const std::string& name) const;
  const SafetensorsMetadata& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // start of the data section, inside the mapping
  std::map<std::string, SafetensorsEntry> entries_;
  SafetensorsMetadata metadata_;
};

// A model checkpoint: a folder holding `model.safetensors`, or shards listed by
// `model.safetensors.index.json` ({"weight_map": {tensor name: shard file name}}), or a path to a
// single .safetensors file. Every shard is opened (mmap + header) up front, so a broken or
// inconsistent checkpoint fails here, not in the middle of loading a model.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted, across all shards
  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  size_t size() const { return shard_of_.size(); }
  const SafetensorsEntry& entry(const std::string& name) const;
  // A view into the shard's mapping, valid while this checkpoint lives.
  Tensor tensor(const std::string& name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  const SafetensorsFile& file_of(const std::string& name) const;

  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> shard_of_;  // tensor name -> index into files_
};

// Tensors in the order the caller wants them; names must be unique.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes one .safetensors file atomically (temporary file + rename). Tensors must be on the CPU.
// The header lists names sorted; the data is ordered by element size (largest first), then name,
// so every tensor starts aligned to its element size.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const SafetensorsMetadata& metadata = {});

// Hugging Face's default shard size, "5GB" (decimal).
constexpr size_t kDefaultMaxShardBytes = 5'000'000'000;

// Writes a checkpoint into `folder` (created if missing) the way Hugging Face does: everything in
// `model.safetensors` when the tensor bytes fit in `max_shard_bytes`, otherwise shards
// `model-0000i-of-0000n.safetensors` (filled in the caller's order; a tensor larger than the limit
// gets a shard of its own) plus `model.safetensors.index.json`, written last. Each file is written
// atomically; the file of the other layout (a stale index or single file) is removed at the end so
// the folder is never ambiguous. Returns the file names written, the index last.
std::vector<std::string> write_safetensors_checkpoint(const std::string& folder,
                                                      const NamedTensors& tensors,
                                                      size_t max_shard_bytes = kDefaultMaxShardBytes,
                                                      const SafetensorsMetadata& metadata = {});

}  // namespace lockstep
