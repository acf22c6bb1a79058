// safetensors: write -> read identity for every dtype and layout, agreement with the Python
// `safetensors` library both ways, and one clear error for every kind of broken file.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "core/dtypes.h"
#include "io/file_io.h"
#include "io/safetensors.h"
#include "io_test_helpers.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
using testing::expect_error;
using testing::same_bytes;
using testing::TempDir;
using testing::write_bytes;

const std::string kSourceDir = LOCKSTEP_SOURCE_DIR;

// Random bytes (never zeros: a reader that returns untouched memory cannot pass).
Tensor random_tensor(Shape shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(1 + rng() % 255);
  return t;
}

// A safetensors file from a header text and data bytes (the header is not padded).
std::string raw_file(const std::string& header, const std::string& data = "") {
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  return bytes + header + data;
}

// ---- f16 -----------------------------------------------------------------------------------------

// Independent reference: the value of a binary16 code from its definition.
double f16_value(int code) {
  const int sign = code & 0x8000 ? -1 : 1, exp = (code >> 10) & 31, mant = code & 1023;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 15 - 10);
}

TEST(SafetensorsF16, DecodesAll65536Codes) {
  for (int c = 0; c < 65536; ++c) {
    const float f = f16_to_float(f16{uint16_t(c)});
    const double ref = f16_value(c);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(f)) << c;
    } else {
      EXPECT_EQ(double(f), ref) << "code " << c;
      EXPECT_EQ(std::signbit(f), bool(c & 0x8000)) << "code " << c;  // -0 stays -0
    }
#ifdef __FLT16_MAX__
    // The compiler's own _Float16 -> float conversion as a second oracle.
    _Float16 h;
    const uint16_t bits = uint16_t(c);
    std::memcpy(&h, &bits, 2);
    if (!std::isnan(ref)) {
      EXPECT_EQ(float_bits(f), float_bits(float(h))) << "code " << c;
    }
#endif
  }
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_name(DType::f16), "f16");
}

// ---- write -> read -------------------------------------------------------------------------------

NamedTensors every_dtype_tensors() {
  return {
      {"model.embed_tokens.weight", random_tensor({5, 3}, DType::bf16, 1)},
      {"model.norm.weight", random_tensor({7}, DType::f16, 2)},  // odd byte count before others
      {"lm_head.weight", random_tensor({2, 3, 4}, DType::f32, 3)},
      {"scale_e8m0", random_tensor({3}, DType::e8m0, 4)},
      {"weight_e4m3", random_tensor({4, 5}, DType::e4m3, 5)},
      {"ids_i32", random_tensor({3}, DType::i32, 6)},
      {"ids_i64", random_tensor({2, 1}, DType::i64, 7)},
      {"scalar_f32", random_tensor({}, DType::f32, 8)},
      {"empty_bf16", Tensor::empty({0, 5}, DType::bf16)},
      {"empty_i64", Tensor::empty({3, 0}, DType::i64)},
  };
}

TEST(SafetensorsWrite, RoundTripsEveryDtypeShapeAndMetadata) {
  TempDir dir;
  const NamedTensors tensors = every_dtype_tensors();
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "round trip ✓"}};
  write_safetensors(dir.file("a.safetensors"), tensors, metadata);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"a.safetensors"});  // no temporary left behind

  const SafetensorsFile file(dir.file("a.safetensors"));
  EXPECT_EQ(file.metadata(), metadata);
  EXPECT_EQ(file.size(), tensors.size());
  std::vector<std::string> sorted;
  for (const auto& [name, t] : tensors) sorted.push_back(name);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(file.names(), sorted);
  for (const auto& [name, expected] : tensors) {
    const Tensor t = file.tensor(name);
    EXPECT_TRUE(same_bytes(t, expected)) << name << ": " << t.describe();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % dtype_size(t.dtype()), 0u) << name;
    EXPECT_EQ(file.tensor(name).data(), t.data()) << name << ": a view, not a fresh copy";
  }
  EXPECT_EQ(file.entry("model.embed_tokens.weight").dtype, "BF16");
  EXPECT_EQ(file.entry("model.norm.weight").dtype, "F16");
  EXPECT_EQ(file.entry("weight_e4m3").dtype, "F8_E4M3");
  EXPECT_EQ(file.entry("scale_e8m0").dtype, "F8_E8M0");
  EXPECT_EQ(file.entry("scalar_f32").shape, Shape{});

  // The header is space-padded so the data section starts 8-byte aligned; names come sorted.
  const std::string bytes = read_file(dir.file("a.safetensors"), "test file");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  const std::string header = bytes.substr(8, header_bytes);
  const size_t json_end = header.find_last_of('}') + 1;
  EXPECT_EQ(header.substr(json_end), std::string(header_bytes - json_end, ' '));
  EXPECT_LT(header.find("\"ids_i32\""), header.find("\"lm_head.weight\""));
}

TEST(SafetensorsWrite, OverwritesAtomicallyAndRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  write_safetensors(path, {{"x", random_tensor({4}, DType::f32, 9)}});
  const std::string before = read_file(path, "test file");
  float cuda_dummy = 0;
  const Tensor on_cuda = Tensor::view_of(&cuda_dummy, {1}, DType::f32, Device::cuda);
  const Tensor t = random_tensor({2}, DType::bf16, 10);
  expect_error([&] { write_safetensors(path, {{"a", t}, {"a", t}}); }, {path, "'a' appears twice"});
  expect_error([&] { write_safetensors(path, {{"", t}}); }, {path, "invalid tensor name"});
  expect_error([&] { write_safetensors(path, {{"__metadata__", t}}); }, {"invalid tensor name"});
  expect_error([&] { write_safetensors(path, {{"g", on_cuda}}); }, {path, "'g'", "CPU"});
  expect_error([&] { write_safetensors(path, {{"u", Tensor()}}); }, {"'u'", "not allocated"});
  expect_error([&] { write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", t}}); },
               {"no/such/dir/x.safetensors"});
  // A failed write leaves the old file as it was and nothing else behind.
  EXPECT_EQ(read_file(path, "test file"), before);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.safetensors"});
}

TEST(SafetensorsWrite, AtomicFileWithoutCommitLeavesNoTrace) {
  TempDir dir;
  const std::string path = dir.file("f.txt");
  write_file_atomically(path, "old");
  {
    AtomicFile file(path);
    file.write("new, but never committed");
    EXPECT_EQ(dir.list().size(), 2u);  // the target and the temporary
  }
  EXPECT_EQ(read_file(path, "test file"), "old");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"f.txt"});
}

// Files from writers that did not pad the header: data misaligned for its dtype comes back as an
// aligned copy with the same values.
TEST(SafetensorsFile, MisalignedDataIsCopiedToAlignedMemory) {
  TempDir dir;
  const float values[2] = {1.5f, -2.25f};
  std::string data(reinterpret_cast<const char*>(values), 8);
  const std::string header = R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  write_bytes(dir.file("m.safetensors"), raw_file(header, data));
  const SafetensorsFile file(dir.file("m.safetensors"));
  const Tensor t = file.tensor("v");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 4, 0u);
  EXPECT_EQ(t.data_as<float>()[0], 1.5f);
  EXPECT_EQ(t.data_as<float>()[1], -2.25f);
}

// ---- sharded checkpoints -------------------------------------------------------------------------

TEST(SafetensorsCheckpoint, ShardedWriteReadsBackAcrossShards) {
  TempDir dir;
  NamedTensors tensors;
  for (int i = 0; i < 9; ++i)
    tensors.emplace_back("model.layers." + std::to_string(i) + ".weight",
                         random_tensor({int64_t(10 + i), 8}, i % 2 ? DType::bf16 : DType::f32, 20 + i));
  tensors.emplace_back("model.big", random_tensor({300}, DType::f32, 40));  // over the limit alone
  tensors.emplace_back("model.scalar", random_tensor({}, DType::f16, 41));
  const size_t max_shard = 700;
  const std::vector<std::string> written =
      write_safetensors_checkpoint(dir.path().string(), tensors, max_shard, {{"format", "pt"}});
  ASSERT_GE(written.size(), 4u);
  EXPECT_EQ(written.back(), "model.safetensors.index.json");
  const std::string shards = std::to_string(written.size() - 1);
  EXPECT_EQ(written[0], "model-00001-of-0000" + shards + ".safetensors");

  size_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();
  const json index = json::parse(read_file(dir.file("model.safetensors.index.json"), "index"));
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());

  const SafetensorsCheckpoint checkpoint(dir.path().string());
  EXPECT_EQ(checkpoint.files().size(), written.size() - 1);
  for (const SafetensorsFile& shard : checkpoint.files()) {
    size_t bytes = 0;
    for (const std::string& name : shard.names()) bytes += shard.tensor(name).nbytes();
    EXPECT_TRUE(bytes <= max_shard || shard.size() == 1) << shard.path() << ": " << bytes;
    EXPECT_EQ(shard.metadata().at("format"), "pt");
  }
  EXPECT_EQ(checkpoint.size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    EXPECT_TRUE(same_bytes(checkpoint.tensor(name), expected)) << name;
    EXPECT_EQ(checkpoint.entry(name).shape, expected.shape()) << name;
    const std::string shard = index["weight_map"][name].get<std::string>();
    EXPECT_TRUE(SafetensorsFile(dir.file(shard)).contains(name)) << name << " in " << shard;
  }

  // Rewriting as one file removes the index (and back), so the folder is never ambiguous.
  EXPECT_EQ(write_safetensors_checkpoint(dir.path().string(), tensors),
            std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors.index.json")));
  const SafetensorsCheckpoint single(dir.path().string());
  EXPECT_EQ(single.files().size(), 1u);
  for (const auto& [name, expected] : tensors) EXPECT_TRUE(same_bytes(single.tensor(name), expected));
  write_safetensors_checkpoint(dir.path().string(), tensors, max_shard);
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors")));
  EXPECT_EQ(SafetensorsCheckpoint(dir.path().string()).size(), tensors.size());

  // A path to one .safetensors file is a checkpoint too.
  EXPECT_EQ(SafetensorsCheckpoint(dir.file(written[0])).files().size(), 1u);
}

TEST(SafetensorsCheckpoint, UnknownNameListsTheClosestNames) {
  TempDir dir;
  write_safetensors_checkpoint(dir.path().string(),
                               {{"model.layers.0.self_attn.q_proj.weight", random_tensor({2}, DType::f32, 1)},
                                {"model.layers.0.self_attn.k_proj.weight", random_tensor({2}, DType::f32, 2)},
                                {"model.norm.weight", random_tensor({2}, DType::f32, 3)}});
  const SafetensorsCheckpoint checkpoint(dir.path().string());
  expect_error([&] { checkpoint.tensor("model.layers.0.self_attn.q_proj.weigth"); },
               {"'model.layers.0.self_attn.q_proj.weigth' not found", dir.path().string(),
                "3 tensors", "closest: 'model.layers.0.self_attn.q_proj.weight'"});
  expect_error([&] { checkpoint.entry("lm_head.bias"); },
               {"'lm_head.bias' not found", "3 tensors", "none with a similar name"});
  expect_error([&] { write_safetensors_checkpoint(dir.path().string(), {}, 0); },
               {"max_shard_bytes"});
}

// ---- malformed files -----------------------------------------------------------------------------

class SafetensorsMalformed : public ::testing::Test {
 protected:
  // Writes `bytes` as a file and expects opening it to fail with a message naming the file.
  void expect_open_error(const std::string& bytes, std::initializer_list<std::string_view> parts) {
    const std::string path = dir_.file("bad.safetensors");
    write_bytes(path, bytes);
    expect_error([&] { SafetensorsFile file(path); }, {path});
    expect_error([&] { SafetensorsFile file(path); }, parts);
  }
  // A header holding one entry `w` (and 8 data bytes).
  void expect_entry_error(const std::string& entry, std::initializer_list<std::string_view> parts) {
    SCOPED_TRACE(entry);
    expect_open_error(raw_file("{\"w\":" + entry + "}", std::string(8, 'x')), {"tensor 'w'"});
    expect_open_error(raw_file("{\"w\":" + entry + "}", std::string(8, 'x')), parts);
  }
  TempDir dir_;
};

TEST_F(SafetensorsMalformed, UnreadableOrTruncatedFiles) {
  expect_error([&] { SafetensorsFile file(dir_.file("missing.safetensors")); },
               {"cannot open", dir_.file("missing.safetensors"), "No such file"});
  expect_error([&] { SafetensorsFile file(dir_.path().string()); }, {"not a regular file"});
  expect_open_error("", {"0 bytes", "too short"});
  expect_open_error("abcde", {"5 bytes", "too short"});
  std::string huge_length = raw_file("{}");
  huge_length[1] = 1;  // 258 bytes of header claimed, 2 present
  expect_open_error(huge_length, {"header length 258 is larger than the rest of the file (2 bytes)"});
  expect_open_error(raw_file("{\"w\": {\"dtype\": "), {"header is not valid JSON"});
  expect_open_error(raw_file("[1, 2]"), {"header is not a JSON object but a array"});
  expect_open_error(raw_file("{\"__metadata__\": {\"k\": 1}}"), {"'__metadata__'", "not a string"});
  expect_open_error(raw_file("{\"__metadata__\": [1]}"), {"'__metadata__' is not a JSON object"});
}

// The header length is bounded by the file's size less the 8-byte length prefix. One byte over
// must fail with that message, and not wrap the data section's size: with the prefix left out of
// the bound, a file of a few dozen bytes declaring a 4 MiB tensor opened.
TEST_F(SafetensorsMalformed, HeaderLengthBoundIsExact) {
  const std::string empty_tensor = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  const std::string path = dir_.file("bound.safetensors");
  std::string at_bound = raw_file(empty_tensor);  // header_bytes == file size - 8: no data section
  write_bytes(path, at_bound);
  const SafetensorsFile file(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"w"}));
  EXPECT_EQ(file.entry("w").end, 0u);

  const std::string rest = std::to_string(empty_tensor.size());
  for (uint64_t over : {1, 2, 8}) {
    std::string bytes = at_bound;
    const uint64_t declared = empty_tensor.size() + over;
    std::memcpy(bytes.data(), &declared, 8);
    SCOPED_TRACE(declared);
    expect_open_error(bytes, {"header length " + std::to_string(declared) +
                              " is larger than the rest of the file (" + rest + " bytes)"});
  }
  // The file of the wrapped size: a 4 MiB tensor declared, its header alone in the file.
  const std::string big = R"({"w":{"dtype":"F32","shape":[1048576],"data_offsets":[0,4194304]}})";
  for (uint64_t over : {0, 1, 8}) {
    std::string bytes = raw_file(big);
    const uint64_t declared = big.size() + over;
    std::memcpy(bytes.data(), &declared, 8);
    SCOPED_TRACE(declared);
    if (over == 0)
      expect_open_error(bytes, {"data_offsets [0,4194304] reach beyond the end of the file", "0 bytes"});
    else
      expect_open_error(bytes, {"is larger than the rest of the file"});
  }
}

TEST_F(SafetensorsMalformed, BrokenEntries) {
  expect_entry_error("[1]", {"entry is not a JSON object"});
  expect_entry_error(R"({"shape":[2],"data_offsets":[0,8]})", {"has no 'dtype'"});
  expect_entry_error(R"({"dtype":"F32","data_offsets":[0,8]})", {"has no 'shape'"});
  expect_entry_error(R"({"dtype":"F32","shape":[2]})", {"has no 'data_offsets'"});
  expect_entry_error(R"({"dtype":"F128","shape":[2],"data_offsets":[0,8]})",
                     {"unsupported dtype \"F128\""});
  expect_entry_error(R"({"dtype":5,"shape":[2],"data_offsets":[0,8]})", {"'dtype' is not a string"});
  expect_entry_error(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})",
                     {"shape [-2]", "not a non-negative integer"});
  expect_entry_error(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})",
                     {"shape [2.5]", "not a non-negative integer"});
  expect_entry_error(R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})", {"'shape' is not an array"});
  expect_entry_error(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})",
                     {"overflows"});
  expect_entry_error(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})", {"[8,0] are out of order"});
  expect_entry_error(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})",
                     {"[0,16] reach beyond the end of the file", "8 bytes"});
  expect_entry_error(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})",
                     {"'data_offsets' must be [begin, end]"});
  expect_entry_error(R"({"dtype":"F32","shape":[2],"data_offsets":[-1,7]})",
                     {"'data_offsets' must be [begin, end]"});
  expect_entry_error(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})",
                     {"shape [3] of F32 needs 12 bytes, but data_offsets [0,8] hold 8"});
  expect_entry_error(R"({"dtype":"F4","shape":[3],"data_offsets":[0,1]})", {"not a whole number of bytes"});
}

TEST_F(SafetensorsMalformed, OverlappingTensors) {
  expect_open_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F16","shape":[2],"data_offsets":[6,10]}})",
                             std::string(12, 'x')),
                    {"tensors 'a' (bytes 0..8) and 'b' (bytes 6..10) overlap"});
}

// Entries of dtypes lockstep has no DType for are listed; only asking for their data fails.
TEST_F(SafetensorsMalformed, UnsupportedDtypeFailsOnlyWhenRead) {
  const std::string path = dir_.file("f64.safetensors");
  write_bytes(path, raw_file(R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},)"
                             R"("f":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                             std::string(16, 'x')));
  const SafetensorsFile file(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"d", "f"}));
  EXPECT_EQ(file.entry("d").dtype, "F64");
  EXPECT_NO_THROW(file.tensor("f"));
  expect_error([&] { file.tensor("d"); }, {path, "tensor 'd'", "unsupported dtype F64", "BF16"});
}

TEST_F(SafetensorsMalformed, BrokenShardedCheckpoints) {
  const std::string folder = dir_.path().string();
  const Tensor t = random_tensor({2}, DType::f32, 1);
  const std::string index = dir_.file("model.safetensors.index.json");
  expect_error([&] { SafetensorsCheckpoint c(folder); }, {folder, "neither model.safetensors nor"});
  expect_error([&] { SafetensorsCheckpoint c(dir_.file("nope")); }, {"nope", "does not exist"});

  write_safetensors(dir_.file("s1.safetensors"), {{"a", t}, {"b", t}});
  write_safetensors(dir_.file("s2.safetensors"), {{"b", t}, {"c", t}});
  write_file_atomically(index, R"({"weight_map": {"a": "s1.safetensors", "c": "s9.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(folder); },
               {index, "names shard file s9.safetensors", "tensor 'c'", "does not exist"});
  write_file_atomically(index, R"({"weight_map": {"a": "s1.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(folder); },
               {"tensor 'b' is in two shards", "s1.safetensors", "s2.safetensors"});
  write_safetensors(dir_.file("s2.safetensors"), {{"c", t}});
  write_file_atomically(index, R"({"weight_map": {"a": "s2.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(folder); },
               {index, "maps tensor 'a' to s2.safetensors, but that shard does not contain it"});
  write_file_atomically(index, R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(folder); }, {index, "not a file name in the same folder"});
  write_file_atomically(index, R"({"weight_map": {"a": 1}})");
  expect_error([&] { SafetensorsCheckpoint c(folder); }, {index, "tensor 'a'", "not a file name"});
  write_file_atomically(index, R"({"metadata": {}})");
  expect_error([&] { SafetensorsCheckpoint c(folder); }, {index, "'weight_map'"});
  write_file_atomically(index, R"({"weight_map": )");
  expect_error([&] { SafetensorsCheckpoint c(folder); }, {index, "not valid JSON"});

  write_file_atomically(index, R"({"weight_map": {"a": "s1.safetensors", "c": "s2.safetensors"}})");
  const SafetensorsCheckpoint ok(folder);
  EXPECT_EQ(ok.names(), (std::vector<std::string>{"a", "b", "c"}));  // shards are the truth
  expect_error([&] { ok.tensor("d"); }, {"'d' not found", "3 tensors"});

  write_safetensors(dir_.file("model.safetensors"), {{"a", t}});
  expect_error([&] { SafetensorsCheckpoint c(folder); }, {"holds both"});
}

// ---- the Python safetensors library as the oracle ------------------------------------------------

TEST(SafetensorsPython, ReadsTheFileWrittenByPython) {
  const std::string path = kSourceDir + "/tests/data/safetensors/python_written.safetensors";
  const SafetensorsFile file(path);
  EXPECT_EQ(file.metadata(), (SafetensorsMetadata{{"format", "pt"},
                                                  {"written_by", "scripts/dev/safetensors_fixture.py"}}));
  EXPECT_EQ(file.size(), 7u);

  const Tensor f32 = file.tensor("model.f32_matrix");
  ASSERT_EQ(f32.shape(), (Shape{3, 4}));
  const float f32_expected[12] = {-1.5f, -0.0f, 0.0f, 1.0f, 2.5f, 3.25f, -7.125f, 1e-3f,
                                  65504.0f, 3.4028235e38f, -1e-40f, 0.1f};
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(float_bits(f32.data_as<float>()[i]), float_bits(f32_expected[i])) << i;

  const Tensor bf = file.tensor("model.bf16_vector");
  ASSERT_EQ(bf.shape(), Shape{5});
  const float bf_expected[5] = {1.0f, -1.5f, INFINITY, std::ldexp(1.0f, -133), 3.140625f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(bf16_to_float(bf.data_as<bf16>()[i]), bf_expected[i]) << i;

  const Tensor h = file.tensor("model.f16_vector");
  ASSERT_EQ(h.shape(), Shape{6});
  const float h_expected[6] = {1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), 0.333251953125f, -0.0f};
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(float_bits(f16_to_float(h.data_as<f16>()[i])), float_bits(h_expected[i])) << i;

  const Tensor e = file.tensor("model.e4m3_codes");
  const float e_expected[4] = {1.0f, -1.0f, 448.0f, std::ldexp(1.0f, -9)};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(e4m3_to_float(e.data_as<e4m3>()[i]), e_expected[i]) << i;

  const Tensor ids = file.tensor("model.i64_ids");
  ASSERT_EQ(ids.shape(), (Shape{2, 2}));
  const int64_t ids_expected[4] = {1, -2, int64_t(1) << 40, -(int64_t(1) << 62)};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ids.data_as<int64_t>()[i], ids_expected[i]) << i;

  const Tensor scalar = file.tensor("model.i32_scalar");
  EXPECT_EQ(scalar.shape(), Shape{});
  EXPECT_EQ(scalar.data_as<int32_t>()[0], 7);
  EXPECT_EQ(file.tensor("model.f32_empty").shape(), (Shape{0, 3}));
}

// Runs `command`, returns its standard output; the exit status goes to `status`.
std::string run(const std::string& command, int& status) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return status = -1, "";
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  status = pclose(pipe);
  return out;
}

TEST(SafetensorsPython, PythonReadsTheFileWeWrite) {
  int status = 0;
  run("python3 -c 'import safetensors, numpy' 2>/dev/null", status);
  if (status != 0) GTEST_SKIP() << "python3 with safetensors and numpy not found (pip install safetensors numpy)";

  TempDir dir;
  const NamedTensors tensors = every_dtype_tensors();
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"by", "lockstep"}};
  write_safetensors(dir.file("ours.safetensors"), tensors, metadata);
  const std::string out = run("python3 '" + kSourceDir + "/scripts/dev/safetensors_fixture.py' dump '" +
                                  dir.file("ours.safetensors") + "' 2>&1",
                              status);
  ASSERT_EQ(status, 0) << out;
  const json dump = json::parse(out);
  EXPECT_EQ(dump["metadata"], json(metadata));
  ASSERT_EQ(dump["tensors"].size(), tensors.size());
  const SafetensorsFile file(dir.file("ours.safetensors"));
  for (const auto& [name, t] : tensors) {
    const json& entry = dump["tensors"][name];
    EXPECT_EQ(entry["dtype"], file.entry(name).dtype) << name;
    EXPECT_EQ(entry["shape"].get<Shape>(), t.shape()) << name;
    std::string hex;
    char byte[3];
    for (size_t i = 0; i < t.nbytes(); ++i) {
      std::snprintf(byte, sizeof byte, "%02x", static_cast<const unsigned char*>(t.data())[i]);
      hex += byte;
    }
    EXPECT_EQ(entry["hex"], hex) << name;
  }
}

}  // namespace
}  // namespace lockstep
