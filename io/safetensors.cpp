// io/safetensors.cpp — see safetensors.h for the format. Reading trusts nothing in the file: every
// length, offset and shape is checked against the file size before any pointer is formed.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "core/error.h"
#include "io/file_io.h"

namespace lockstep {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::concat;

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian");

namespace {

// Every dtype of the format, with its size, and the DType lockstep reads it as (if any).
struct DTypeInfo {
  std::string_view name;
  int bits;
  std::optional<DType> dtype;
};
constexpr DTypeInfo kDTypes[] = {
    {"F32", 32, DType::f32},       {"BF16", 16, DType::bf16},     {"F16", 16, DType::f16},
    {"F8_E4M3", 8, DType::e4m3},   {"F8_E8M0", 8, DType::e8m0},   {"I32", 32, DType::i32},
    {"I64", 64, DType::i64},       {"F64", 64, std::nullopt},     {"C64", 64, std::nullopt},
    {"U64", 64, std::nullopt},     {"U32", 32, std::nullopt},     {"I16", 16, std::nullopt},
    {"U16", 16, std::nullopt},     {"I8", 8, std::nullopt},       {"U8", 8, std::nullopt},
    {"BOOL", 8, std::nullopt},     {"F8_E5M2", 8, std::nullopt},  {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},  {"F4", 4, std::nullopt},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& info : kDTypes)
    if (info.name == name) return &info;
  return nullptr;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeInfo& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  fail(concat("no safetensors dtype for ", dtype_name(dtype)));
}

std::string readable_dtypes() {
  std::string s;
  for (const DTypeInfo& info : kDTypes)
    if (info.dtype) s += (s.empty() ? "" : ", ") + std::string(info.name);
  return s;
}

// The reference implementation refuses headers above 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// "tensor 'x' not found in P (291 tensors); closest: 'a', 'b'" — a typo should be obvious.
[[noreturn]] void fail_not_found(const std::string& name, const std::string& where,
                                 const std::vector<std::string>& names) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& n : names) scored.emplace_back(edit_distance(name, n), n);
  std::sort(scored.begin(), scored.end());
  const size_t close_enough = std::max<size_t>(3, name.size() / 3);
  std::string closest;
  for (size_t i = 0; i < scored.size() && i < 3 && scored[i].first <= close_enough; ++i)
    closest += (i ? ", '" : "'") + scored[i].second + "'";
  fail(concat("tensor '", name, "' not found in ", where, " (", names.size(),
              names.size() == 1 ? " tensor" : " tensors",
              closest.empty() ? std::string(", none with a similar name)") : "); closest: " + closest));
}

// Reads a non-negative integer JSON value, or nothing.
std::optional<uint64_t> as_count(const json& v) {
  if (!v.is_number_unsigned()) return std::nullopt;  // nlohmann parses every integer >= 0 as unsigned
  return v.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& value,
                             uint64_t data_bytes) {
  const std::string where = concat(path, ": tensor '", name, "'");
  LOCKSTEP_CHECK(value.is_object(), where, ": entry is not a JSON object but ", value.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"})
    LOCKSTEP_CHECK(value.contains(field), where, ": entry has no '", field, "'");

  const json& dtype = value["dtype"];
  LOCKSTEP_CHECK(dtype.is_string(), where, ": 'dtype' is not a string but ", dtype.dump());
  const DTypeInfo* info = find_dtype(dtype.get<std::string>());
  LOCKSTEP_CHECK(info, where, ": unsupported dtype ", dtype.dump(), " (not a safetensors dtype)");

  SafetensorsEntry entry;
  entry.dtype = info->name;
  const json& shape = value["shape"];
  LOCKSTEP_CHECK(shape.is_array(), where, ": 'shape' is not an array but ", shape.dump());
  uint64_t numel = 1;
  for (const json& d : shape) {
    const std::optional<uint64_t> n = as_count(d);
    LOCKSTEP_CHECK(n && *n <= uint64_t(INT64_MAX), where, ": shape ", shape.dump(),
                   " has a dimension that is not a non-negative integer: ", d.dump());
    LOCKSTEP_CHECK(!__builtin_mul_overflow(numel, *n, &numel), where, ": shape ", shape.dump(),
                   " overflows");
    entry.shape.push_back(int64_t(*n));
  }

  const json& offsets = value["data_offsets"];
  const bool two = offsets.is_array() && offsets.size() == 2;
  const std::optional<uint64_t> begin = two ? as_count(offsets[0]) : std::nullopt;
  const std::optional<uint64_t> end = two ? as_count(offsets[1]) : std::nullopt;
  LOCKSTEP_CHECK(begin && end, where, ": 'data_offsets' must be [begin, end] with non-negative ",
                 "integers, got ", offsets.dump());
  LOCKSTEP_CHECK(*begin <= *end, where, ": data_offsets ", offsets.dump(), " are out of order");
  LOCKSTEP_CHECK(*end <= data_bytes, where, ": data_offsets ", offsets.dump(),
                 " reach beyond the end of the file (its data section is ", data_bytes, " bytes)");

  uint64_t bits = 0;
  LOCKSTEP_CHECK(!__builtin_mul_overflow(numel, uint64_t(info->bits), &bits) && bits % 8 == 0,
                 where, ": shape ", shape.dump(), " of ", info->name, " is not a whole number of bytes");
  LOCKSTEP_CHECK(bits / 8 == *end - *begin, where, ": shape ", shape.dump(), " of ", info->name,
                 " needs ", bits / 8, " bytes, but data_offsets ", offsets.dump(), " hold ",
                 *end - *begin);
  entry.begin = size_t(*begin);
  entry.end = size_t(*end);
  return entry;
}

SafetensorsMetadata parse_metadata(const std::string& path, const json& value) {
  LOCKSTEP_CHECK(value.is_object(), path, ": '__metadata__' is not a JSON object but ", value.dump());
  SafetensorsMetadata metadata;
  for (const auto& [key, v] : value.items()) {
    LOCKSTEP_CHECK(v.is_string(), path, ": '__metadata__' value of '", key,
                   "' is not a string but ", v.dump());
    metadata[key] = v.get<std::string>();
  }
  return metadata;
}

// Byte ranges may leave holes (the format's reference reader refuses them; nothing breaks if we
// don't), but two tensors sharing bytes is a corrupt file.
void check_no_overlap(const std::string& path, const std::map<std::string, SafetensorsEntry>& entries) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> ranges;
  for (const auto& [name, e] : entries)
    if (e.end > e.begin) ranges.emplace_back(&name, &e);
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [pname, prev] = ranges[i - 1];
    const auto& [cname, cur] = ranges[i];
    LOCKSTEP_CHECK(prev->end <= cur->begin, path, ": tensors '", *pname, "' (bytes ", prev->begin,
                   "..", prev->end, ") and '", *cname, "' (bytes ", cur->begin, "..", cur->end,
                   ") overlap");
  }
}

}  // namespace

// ---- SafetensorsFile -----------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  LOCKSTEP_CHECK(fd >= 0, "cannot open safetensors file ", path_, ": ", std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(concat("cannot open safetensors file ", path_, ": ",
                stat_ok ? "not a regular file" : std::strerror(stat_errno)));
  }
  const uint64_t file_bytes = uint64_t(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    fail(concat(path_, ": file is ", file_bytes,
                " bytes, too short for a safetensors file (8-byte header length first)"));
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  LOCKSTEP_CHECK(map != MAP_FAILED, "cannot map safetensors file ", path_, ": ",
                 std::strerror(map_errno));
  map_ = map;
  map_bytes_ = file_bytes;

  try {
    const auto* base = static_cast<const unsigned char*>(map_);
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, base, 8);
    LOCKSTEP_CHECK(header_bytes <= file_bytes - 8, path_, ": header length ", header_bytes,
                   " is larger than the rest of the file (", file_bytes - 8, " bytes)");
    LOCKSTEP_CHECK(header_bytes <= kMaxHeaderBytes, path_, ": header length ", header_bytes,
                   " is over the format's limit of ", kMaxHeaderBytes, " bytes");
    const char* text = reinterpret_cast<const char*>(base + 8);
    json header;
    try {
      header = json::parse(text, text + header_bytes);
    } catch (const json::exception& e) {
      fail(concat(path_, ": header is not valid JSON (", e.what(), ")"));
    }
    LOCKSTEP_CHECK(header.is_object(), path_, ": header is not a JSON object but a ",
                   header.type_name());
    data_ = base + 8 + header_bytes;
    const uint64_t data_bytes = file_bytes - 8 - header_bytes;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__")
        metadata_ = parse_metadata(path_, value);
      else
        entries_.emplace(name, parse_entry(path_, name, value, data_bytes));
    }
    check_no_overlap(path_, entries_);
  } catch (...) {
    ::munmap(map_, map_bytes_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      entries_(std::move(other.entries_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    entries_ = std::move(other.entries_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail_not_found(name, path_, names());
  return it->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const std::optional<DType> dtype = find_dtype(e.dtype)->dtype;
  LOCKSTEP_CHECK(dtype, path_, ": tensor '", name, "' has unsupported dtype ", e.dtype,
                 " (lockstep reads ", readable_dtypes(), ")");
  const unsigned char* bytes = data_ + e.begin;
  if (reinterpret_cast<uintptr_t>(bytes) % dtype_size(*dtype) != 0) {
    Tensor copy = Tensor::empty(e.shape, *dtype);
    std::memcpy(copy.data(), bytes, e.end - e.begin);
    return copy;
  }
  // The mapping is PROT_READ: the const_cast only satisfies Tensor's pointer type.
  return Tensor::view_of(const_cast<unsigned char*>(bytes), e.shape, *dtype);
}

// ---- SafetensorsCheckpoint -----------------------------------------------------------------------

namespace {

const char* const kSingleFile = "model.safetensors";
const char* const kIndexFile = "model.safetensors.index.json";

// {"weight_map": {tensor name: shard file name}} -> the same, validated.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const std::string text = read_file(index_path, "safetensors index");
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    fail(concat(index_path, ": not valid JSON (", e.what(), ")"));
  }
  LOCKSTEP_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                 index_path, ": expected a JSON object with a 'weight_map' object");
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    LOCKSTEP_CHECK(shard.is_string(), index_path, ": weight_map entry of tensor '", name,
                   "' is not a file name but ", shard.dump());
    const std::string file = shard.get<std::string>();
    // Shards live next to the index: a path elsewhere is a broken (or hostile) index.
    LOCKSTEP_CHECK(!file.empty() && file != "." && file != ".." && file.find('/') == std::string::npos,
                   index_path, ": weight_map entry of tensor '", name, "' is '", file,
                   "', not a file name in the same folder");
    weight_map[name] = file;
  }
  return weight_map;
}

}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) : path_(path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  LOCKSTEP_CHECK(fs::exists(status), "checkpoint ", path, " does not exist");
  if (fs::is_regular_file(status)) {
    files_.emplace_back(path);
    for (const std::string& name : files_[0].names()) shard_of_[name] = 0;
    return;
  }
  LOCKSTEP_CHECK(fs::is_directory(status), "checkpoint ", path, " is neither a file nor a folder");
  const fs::path folder(path), single = folder / kSingleFile, index = folder / kIndexFile;
  const bool has_single = fs::exists(single, ec), has_index = fs::exists(index, ec);
  LOCKSTEP_CHECK(!(has_single && has_index), "checkpoint ", path, " holds both ", kSingleFile,
                 " and ", kIndexFile, "; remove the stale one");
  if (!has_single && !has_index) {
    // Name what is there: a folder of differently named .safetensors files is a common mix-up.
    std::string others;
    for (const auto& e : fs::directory_iterator(folder, ec))
      if (e.path().extension() == ".safetensors") others += " " + e.path().filename().string();
    fail(concat("checkpoint ", path, " holds neither ", kSingleFile, " nor ", kIndexFile,
                others.empty() ? "" : "; .safetensors files there (open one by its path):" + others));
  }
  if (has_single) {
    files_.emplace_back(single.string());
    for (const std::string& name : files_[0].names()) shard_of_[name] = 0;
    return;
  }

  const std::map<std::string, std::string> weight_map = read_weight_map(index.string());
  std::map<std::string, size_t> file_index;  // shard file name -> index into files_
  for (const auto& [name, shard] : weight_map) {
    if (file_index.count(shard)) continue;
    LOCKSTEP_CHECK(fs::is_regular_file(folder / shard, ec), index.string(), " names shard file ",
                   shard, " (for tensor '", name, "'), but ", (folder / shard).string(),
                   " does not exist");
    file_index[shard] = files_.size();
    files_.emplace_back((folder / shard).string());
  }
  // The shards' own headers are the truth; the weight map must agree with them.
  for (size_t i = 0; i < files_.size(); ++i) {
    for (const std::string& name : files_[i].names()) {
      const auto [it, inserted] = shard_of_.emplace(name, i);
      LOCKSTEP_CHECK(inserted, path, ": tensor '", name, "' is in two shards, ",
                     files_[it->second].path(), " and ", files_[i].path());
    }
  }
  for (const auto& [name, shard] : weight_map) {
    LOCKSTEP_CHECK(files_[file_index[shard]].contains(name), index.string(), " maps tensor '", name,
                   "' to ", shard, ", but that shard does not contain it");
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> names;
  for (const auto& [name, shard] : shard_of_) names.push_back(name);
  return names;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) fail_not_found(name, "checkpoint " + path_, names());
  return files_[it->second];
}

const SafetensorsEntry& SafetensorsCheckpoint::entry(const std::string& name) const {
  return file_of(name).entry(name);
}

Tensor SafetensorsCheckpoint::tensor(const std::string& name) const {
  return file_of(name).tensor(name);
}

// ---- writing -------------------------------------------------------------------------------------

namespace {

void check_writable(const std::string& path, const NamedTensors& tensors) {
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    LOCKSTEP_CHECK(!name.empty() && name != "__metadata__", "cannot write ", path,
                   ": invalid tensor name '", name, "'");
    LOCKSTEP_CHECK(seen.insert(name).second, "cannot write ", path, ": tensor name '", name,
                   "' appears twice");
    LOCKSTEP_CHECK(t.defined() || t.numel() == 0, "cannot write ", path, ": tensor '", name,
                   "' is not allocated");
    LOCKSTEP_CHECK(t.device() == Device::cpu, "cannot write ", path, ": tensor '", name,
                   "' is ", t.describe(), "; copy it to the CPU first");
  }
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const SafetensorsMetadata& metadata) {
  check_writable(path, tensors);
  // Largest elements first: with the data section 8-aligned, every tensor then starts aligned.
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& named : tensors) order.push_back(&named);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const size_t sa = dtype_size(a->second.dtype()), sb = dtype_size(b->second.dtype());
    return sa != sb ? sa > sb : a->first < b->first;
  });

  json header = json::object();  // nlohmann's object is a std::map: names come out sorted
  size_t offset = 0;
  for (const auto* named : order) {
    const Tensor& t = named->second;
    header[named->first] = {{"dtype", std::string(safetensors_dtype_name(t.dtype()))},
                            {"shape", t.shape()},
                            {"data_offsets", json::array({offset, offset + t.nbytes()})}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned

  AtomicFile file(path);
  const uint64_t header_bytes = text.size();
  file.write(&header_bytes, 8);
  file.write(text);
  for (const auto* named : order)
    if (named->second.nbytes() > 0) file.write(named->second.data(), named->second.nbytes());
  file.commit();
}

std::vector<std::string> write_safetensors_checkpoint(const std::string& folder,
                                                      const NamedTensors& tensors,
                                                      size_t max_shard_bytes,
                                                      const SafetensorsMetadata& metadata) {
  LOCKSTEP_CHECK(max_shard_bytes > 0, "cannot write checkpoint ", folder,
                 ": max_shard_bytes must be positive");
  check_writable(folder, tensors);
  std::error_code ec;
  fs::create_directories(folder, ec);
  LOCKSTEP_CHECK(!ec, "cannot write checkpoint ", folder, ": creating the folder failed (",
                 ec.message(), ")");
  const fs::path dir(folder);

  // Removes the other layout's top file so that readers never see two checkpoints in one folder.
  auto remove_stale = [&](const char* name) {
    fs::remove(dir / name, ec);
    LOCKSTEP_CHECK(!ec, "cannot write checkpoint ", folder, ": removing the stale ", name,
                   " failed (", ec.message(), ")");
  };

  size_t total_bytes = 0;
  for (const auto& [name, t] : tensors) total_bytes += t.nbytes();
  if (total_bytes <= max_shard_bytes) {
    write_safetensors((dir / kSingleFile).string(), tensors, metadata);
    remove_stale(kIndexFile);
    return {kSingleFile};
  }

  std::vector<NamedTensors> shards(1);
  size_t shard_bytes = 0;
  for (const auto& named : tensors) {
    if (!shards.back().empty() && shard_bytes + named.second.nbytes() > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(named);
    shard_bytes += named.second.nbytes();
  }

  std::vector<std::string> written;
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((dir / name).string(), shards[i], metadata);
    for (const auto& named : shards[i]) weight_map[named.first] = name;
    written.push_back(name);
  }
  const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  write_file_atomically((dir / kIndexFile).string(), index.dump(2) + "\n");
  written.push_back(kIndexFile);
  remove_stale(kSingleFile);
  return written;
}

}  // namespace lockstep
