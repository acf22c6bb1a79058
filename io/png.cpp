// io/png.cpp
#include "io/png.h"

#include <zlib.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "core/error.h"
#include "io/file_io.h"

namespace lockstep {
namespace {

void append_u32_be(std::string& out, uint32_t v) {
  const char bytes[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  out.append(bytes, 4);
}

// length, type, data, CRC(type + data)
void append_chunk(std::string& out, std::string_view type, std::string_view data) {
  append_u32_be(out, uint32_t(data.size()));
  const size_t type_at = out.size();
  out.append(type);
  out.append(data);
  const auto* crc_input = reinterpret_cast<const Bytef*>(out.data() + type_at);
  append_u32_be(out, uint32_t(crc32(crc32(0L, Z_NULL, 0), crc_input, uInt(type.size() + data.size()))));
}

}  // namespace

void write_png(const std::filesystem::path& path, int64_t width, int64_t height, std::span<const uint8_t> rgb) {
  constexpr int64_t kMaxSide = (int64_t(1) << 31) - 1;
  LOCKSTEP_CHECK(width >= 1 && width <= kMaxSide && height >= 1 && height <= kMaxSide, "write_png ", path.string(),
                 ": width and height must be in [1, 2^31 - 1], not ", width, " x ", height);
  const size_t row_bytes = size_t(width) * 3;
  LOCKSTEP_CHECK(rgb.size() / row_bytes == size_t(height) && rgb.size() % row_bytes == 0, "write_png ",
                 path.string(), ": rgb must hold width*height*3 = ", width, "*", height, "*3 bytes, not ",
                 rgb.size());

  std::string rows;
  rows.reserve(size_t(height) * (row_bytes + 1));
  for (int64_t y = 0; y < height; ++y) {
    rows.push_back('\0');  // filter type None
    rows.append(reinterpret_cast<const char*>(rgb.data()) + size_t(y) * row_bytes, row_bytes);
  }
  uLongf compressed_size = compressBound(uLong(rows.size()));
  std::string compressed(compressed_size, '\0');
  const int status = compress2(reinterpret_cast<Bytef*>(compressed.data()), &compressed_size,
                               reinterpret_cast<const Bytef*>(rows.data()), uLong(rows.size()), Z_DEFAULT_COMPRESSION);
  LOCKSTEP_CHECK(status == Z_OK, "write_png ", path.string(), ": zlib compress2 failed (", status, ")");
  compressed.resize(compressed_size);

  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  append_u32_be(header, uint32_t(width));
  append_u32_be(header, uint32_t(height));
  header.append({char(8), char(2), char(0), char(0), char(0)});  // depth, RGB, deflate, filter set 0, no interlace
  append_chunk(png, "IHDR", header);
  constexpr size_t kIdatBytes = size_t(1) << 20;
  for (size_t at = 0; at < compressed.size(); at += kIdatBytes)
    append_chunk(png, "IDAT", std::string_view(compressed).substr(at, kIdatBytes));
  append_chunk(png, "IEND", {});
  write_file_atomically(path.string(), png);
}

}  // namespace lockstep
