// io/png.h — writing an 8-bit RGB image as a PNG file (atomically: readers see the old file or the
// complete new one, never a half-written one; see io/file_io.h).
//
// The file: the PNG signature, IHDR (width, height, bit depth 8, colour type 2 = RGB, no
// interlacing), the zlib stream of the rows (each row prefixed with filter byte 0, "None": plots
// are flat colour, which deflate already compresses well) split over IDAT chunks of at most
// 1 MiB, and IEND. Chunk CRCs are zlib's crc32 over the chunk type and data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

namespace lockstep {

// `rgb` holds width·height pixels of 3 bytes (r, g, b), row-major, top row first.
// width and height are in [1, 2^31 − 1] (the PNG limit); a size mismatch or a file that cannot be
// written throws lockstep::Error naming the argument or the path.
void write_png(const std::filesystem::path& path, int64_t width, int64_t height, std::span<const uint8_t> rgb);

}  // namespace lockstep
