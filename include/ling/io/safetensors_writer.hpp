#pragma once
// A small .safetensors writer, for tests and tools that build checkpoints: tensors are written in the order added,
// contiguously from offset 0, with the header padded by spaces to a multiple of 8 bytes (as the reference does).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ling/core/dtypes.hpp"
#include "ling/core/error.hpp"

namespace ling::io {

class SafetensorsWriter {
 public:
  // Adds a tensor from raw bytes; their count must be numel(shape) x dtype_size(dtype).
  SafetensorsWriter& add(std::string name, DType dtype, std::vector<std::int64_t> shape, void const* bytes,
                         std::size_t size) {
    std::size_t n = dtype_size(dtype);
    for (auto d : shape) {
      if (d < 0) fail(ErrorCode::kInvalidArgument, "SafetensorsWriter: tensor '" + name + "' has a negative dimension");
      n *= std::size_t(d);
    }
    if (n != size)
      fail(ErrorCode::kInvalidArgument, "SafetensorsWriter: tensor '" + name + "' has " + std::to_string(size) +
                                            " bytes, its shape needs " + std::to_string(n));
    Entry e{std::move(name), dtype, std::move(shape), data_.size(), size};
    auto const* p = static_cast<std::byte const*>(bytes);
    data_.insert(data_.end(), p, p + size);
    entries_.push_back(std::move(e));
    return *this;
  }
  template <class T>
  SafetensorsWriter& add(std::string name, DType dtype, std::vector<std::int64_t> shape, std::span<T const> values) {
    return add(std::move(name), dtype, std::move(shape), values.data(), values.size_bytes());
  }
  template <class T>
  SafetensorsWriter& add(std::string name, DType dtype, std::vector<std::int64_t> shape, std::vector<T> const& values) {
    return add(std::move(name), dtype, std::move(shape), values.data(), values.size() * sizeof(T));
  }
  SafetensorsWriter& metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
    return *this;
  }

  std::string header() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    for (auto const& e : entries_)
      h[e.name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", e.shape}, {"data_offsets", {e.offset, e.offset + e.size}}};
    std::string s = h.dump();
    s.append((8 - s.size() % 8) % 8, ' ');
    return s;
  }

  void write(std::filesystem::path const& path) const {
    std::string h = header();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorCode::kIo, path.string() + ": cannot create");
    std::uint64_t n = h.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<char const*>(len), 8);
    out.write(h.data(), std::streamsize(h.size()));
    out.write(reinterpret_cast<char const*>(data_.data()), std::streamsize(data_.size()));
    if (!out) fail(ErrorCode::kIo, path.string() + ": write failed");
  }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    std::size_t offset, size;
  };
  std::vector<Entry> entries_;
  std::vector<std::byte> data_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ling::io
