#pragma once
// Read-only, memory-mapped .safetensors files (format of huggingface/safetensors), validated as the reference
// implementation does before any tensor is handed out:
//   [u64 little-endian N][N bytes of UTF-8 JSON header][data]
//   header = { "__metadata__"?: {str: str}, name: {"dtype": str, "shape": [u64...], "data_offsets": [begin, end]} }
// Checks: N <= 100 MB and 8 + N <= file size; the header is a UTF-8 JSON object without duplicate keys; every dtype
// is known; the shape's element count does not overflow; end - begin == elements x dtype size; the tensors, sorted by
// offset, tile the data area from 0 with no gap or overlap and end exactly at its end; __metadata__ maps strings to
// strings. Each failure is a ling::Error (kIo or kFormat) naming the file and, where there is one, the tensor.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ling/core/dtypes.hpp"
#include "ling/core/error.hpp"

namespace ling::io {

// One tensor of a mapped file. `data` points into the mapping and lives as long as the file object.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape;
  std::byte const* data = nullptr;
  std::size_t size = 0;  // bytes
  std::string file;      // path of the file that holds it

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

inline std::string shape_to_string(std::span<std::int64_t const> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);  // appended, not `"," + std::string`: GCC 12 warns on that form (-Wrestrict)
  }
  s += ']';
  return s;
}

// A read-only mapping of a whole file (POSIX mmap). Movable, not copyable.
class MappedFile {
 public:
  MappedFile() = default;
  static MappedFile open(std::filesystem::path const& path) {
    MappedFile m;
    m.path_ = path.string();
    int fd = ::open(m.path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorCode::kIo, m.path_ + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      fail(ErrorCode::kIo, m.path_ + ": cannot stat (" + std::strerror(e) + ")");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(ErrorCode::kIo, m.path_ + ": not a regular file");
    }
    m.size_ = std::size_t(st.st_size);
    if (m.size_ > 0) {
      void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd);
        fail(ErrorCode::kIo, m.path_ + ": mmap failed (" + std::strerror(e) + ")");
      }
      m.data_ = static_cast<std::byte const*>(p);
    }
    ::close(fd);  // the mapping stays valid without the descriptor
    return m;
  }
  MappedFile(MappedFile&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  MappedFile(MappedFile const&) = delete;
  MappedFile& operator=(MappedFile const&) = delete;
  ~MappedFile() { unmap(); }

  std::byte const* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::string const& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
  std::string path_;
  std::byte const* data_ = nullptr;
  std::size_t size_ = 0;
};

namespace detail::st {

inline constexpr std::uint64_t kMaxHeaderSize = 100'000'000;  // the reference's MAX_HEADER_SIZE

// Parses the header JSON and rejects a key repeated inside one object (nlohmann would keep the last one silently).
inline nlohmann::json parse_header(std::string_view text, std::string const& file) {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  std::string duplicate;
  auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) keys.emplace_back();
    else if (ev == E::object_end) { if (!keys.empty()) keys.pop_back(); }
    else if (ev == E::key && !keys.empty() && duplicate.empty()) {
      std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) duplicate = k;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (nlohmann::json::exception const& e) {
    fail(ErrorCode::kFormat, file + ": header is not valid UTF-8 JSON (" + e.what() + ")");
  }
  if (!duplicate.empty()) fail(ErrorCode::kFormat, file + ": header repeats the key '" + duplicate + "'");
  if (!j.is_object()) fail(ErrorCode::kFormat, file + ": header is not a JSON object");
  return j;
}

inline std::uint64_t as_u64(nlohmann::json const& v, std::string const& what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
    fail(ErrorCode::kFormat, what + " must be a non-negative integer, got " + v.dump());
  return v.get<std::uint64_t>();
}

}  // namespace detail::st

class SafetensorsFile {
 public:
  SafetensorsFile() = default;

  static SafetensorsFile open(std::filesystem::path const& path) {
    SafetensorsFile f;
    f.map_ = MappedFile::open(path);
    f.parse();
    return f;
  }

  std::span<TensorInfo const> tensors() const noexcept { return tensors_; }
  TensorInfo const* find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  std::map<std::string, std::string> const& metadata() const noexcept { return metadata_; }
  std::string const& path() const noexcept { return map_.path(); }
  std::size_t file_size() const noexcept { return map_.size(); }

 private:
  void parse() {
    std::string const& file = map_.path();
    std::byte const* base = map_.data();
    std::size_t const file_size = map_.size();
    if (file_size < 8) fail(ErrorCode::kFormat, file + ": " + std::to_string(file_size) + " bytes, too short for a header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | std::uint64_t(std::to_integer<std::uint8_t>(base[i]));
    if (n > detail::st::kMaxHeaderSize)
      fail(ErrorCode::kFormat, file + ": header length " + std::to_string(n) + " exceeds the 100 MB limit");
    if (n > file_size - 8)
      fail(ErrorCode::kFormat, file + ": header length " + std::to_string(n) + " runs past the end of the file (" +
                                   std::to_string(file_size) + " bytes)");
    std::string_view text(reinterpret_cast<char const*>(base + 8), std::size_t(n));
    if (text.empty() || text.front() != '{')
      fail(ErrorCode::kFormat, file + ": header is not a JSON object (it must start with '{')");
    nlohmann::json header = detail::st::parse_header(text, file);

    std::byte const* data = base + 8 + n;
    std::uint64_t const data_size = file_size - 8 - n;
    struct Span {
      std::uint64_t begin, end;
      std::size_t index;
    };
    std::vector<Span> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
      std::string const& name = it.key();
      nlohmann::json const& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail(ErrorCode::kFormat, file + ": __metadata__ is not a string-to-string map");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string())
            fail(ErrorCode::kFormat, file + ": __metadata__ entry '" + m.key() + "' is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      std::string const what = file + ": tensor '" + name + "'";
      if (!v.is_object()) fail(ErrorCode::kFormat, what + " is not an object");
      auto dt = v.find("dtype"), sh = v.find("shape"), off = v.find("data_offsets");
      if (dt == v.end() || sh == v.end() || off == v.end())
        fail(ErrorCode::kFormat, what + " lacks dtype, shape or data_offsets");
      for (auto k = v.begin(); k != v.end(); ++k)
        if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
          fail(ErrorCode::kFormat, what + " has an unknown field '" + k.key() + "'");
      TensorInfo t;
      t.name = name;
      t.file = file;
      if (!dt->is_string()) fail(ErrorCode::kFormat, what + ": dtype is not a string");
      if (!parse_dtype(dt->get<std::string>(), t.dtype))
        fail(ErrorCode::kFormat, what + ": unknown dtype '" + dt->get<std::string>() + "'");
      if (!sh->is_array()) fail(ErrorCode::kFormat, what + ": shape is not a list");
      std::uint64_t count = 1;
      bool overflow = false;
      for (auto const& d : *sh) {
        std::uint64_t x = detail::st::as_u64(d, what + ": shape entry");
        if (x > std::uint64_t(INT64_MAX)) overflow = true;
        else t.shape.push_back(std::int64_t(x));
        if (x != 0 && count > UINT64_MAX / x) overflow = true;
        count *= x;
      }
      std::uint64_t const elem = dtype_size(t.dtype);
      if (overflow || count > std::uint64_t(INT64_MAX) || (elem && count > UINT64_MAX / elem))
        fail(ErrorCode::kFormat, what + ": shape " + sh->dump() + " overflows the element count");
      if (!off->is_array() || off->size() != 2) fail(ErrorCode::kFormat, what + ": data_offsets is not [begin, end]");
      std::uint64_t b = detail::st::as_u64((*off)[0], what + ": data_offsets begin");
      std::uint64_t e = detail::st::as_u64((*off)[1], what + ": data_offsets end");
      if (e < b) fail(ErrorCode::kFormat, what + ": data_offsets end " + std::to_string(e) + " < begin " + std::to_string(b));
      if (e - b != count * elem)
        fail(ErrorCode::kFormat, what + ": " + std::to_string(e - b) + " bytes for shape " + shape_to_string(t.shape) +
                                     " x " + std::string(dtype_name(t.dtype)) + " (" + std::to_string(elem) +
                                     " B) = " + std::to_string(count * elem) + " bytes");
      t.size = std::size_t(e - b);
      spans.push_back({b, e, tensors_.size()});
      tensors_.push_back(std::move(t));
    }
    // The tensors must tile [0, data_size) in offset order (the reference's validate()).
    std::sort(spans.begin(), spans.end(),
              [](Span const& a, Span const& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    std::uint64_t expected = 0;
    for (Span const& s : spans) {
      std::string const what = file + ": tensor '" + tensors_[s.index].name + "'";
      if (s.begin < expected)
        fail(ErrorCode::kFormat, what + ": data_offsets begin " + std::to_string(s.begin) + " overlaps the previous tensor (ends at " +
                                     std::to_string(expected) + ")");
      if (s.begin > expected)
        fail(ErrorCode::kFormat, what + ": data_offsets begin " + std::to_string(s.begin) + " leaves a gap after offset " +
                                     std::to_string(expected));
      if (s.end > data_size)
        fail(ErrorCode::kFormat, what + ": data_offsets end " + std::to_string(s.end) + " runs past the end of the data (" +
                                     std::to_string(data_size) + " bytes)");
      expected = s.end;
    }
    if (expected != data_size)
      fail(ErrorCode::kFormat, file + ": tensors end at data offset " + std::to_string(expected) + " but the data area holds " +
                                   std::to_string(data_size) + " bytes");
    for (Span const& s : spans) tensors_[s.index].data = data + s.begin;
    std::sort(tensors_.begin(), tensors_.end(), [](TensorInfo const& a, TensorInfo const& b) { return a.data < b.data || (a.data == b.data && a.name < b.name); });
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  }

  MappedFile map_;
  std::vector<TensorInfo> tensors_;  // in file order
  std::unordered_map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ling::io
