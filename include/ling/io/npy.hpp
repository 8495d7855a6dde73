#pragma once
// A minimal .npy (format 1.0) writer for float32 C-order arrays, e.g. `ling logits` output. Throws ling::Error
// (kIo) naming the file when it cannot be written.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "ling/core/error.hpp"

namespace ling::io {

inline std::string npy_header(std::span<std::int64_t const> shape, char const* descr = "<f4") {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // magic (6) + version (2) + header length (2) + dict + padding + '\n' is a multiple of 64.
  std::size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += char(1);
  h += char(0);
  h += char(dict.size() & 0xFF);
  h += char((dict.size() >> 8) & 0xFF);
  return h + dict;
}

inline void write_npy(std::filesystem::path const& path, std::span<float const> data, std::span<std::int64_t const> shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  require(n == std::int64_t(data.size()), ErrorCode::kInternal,
          path.string() + ": npy shape holds " + std::to_string(n) + " values, data " + std::to_string(data.size()));
  std::FILE* f = std::fopen(path.string().c_str(), "wb");
  if (!f) fail(ErrorCode::kIo, path.string() + ": cannot open for writing");
  std::string const h = npy_header(shape);
  bool ok = std::fwrite(h.data(), 1, h.size(), f) == h.size();
  // float32 little-endian, which every supported host is.
  if (ok && !data.empty()) ok = std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) fail(ErrorCode::kIo, path.string() + ": write failed");
}

inline void write_npy(std::filesystem::path const& path, std::vector<float> const& data,
                      std::vector<std::int64_t> const& shape) {
  write_npy(path, std::span<float const>(data), std::span<std::int64_t const>(shape));
}

}  // namespace ling::io
