#pragma once
// A checkpoint directory in HF format (spec §3): config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json ({"weight_map": {tensor: file}}). Every file stays mapped for the Checkpoint's
// lifetime; tensors are looked up by name. Errors name the directory, the file and the tensor.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ling/core/error.hpp"
#include "ling/io/model_config.hpp"
#include "ling/io/safetensors.hpp"

namespace ling::io {

class Checkpoint {
 public:
  static Checkpoint open(std::filesystem::path const& dir) {
    namespace fs = std::filesystem;
    Checkpoint c;
    c.dir_ = dir;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(ErrorCode::kIo, dir.string() + ": not a directory");
    c.config_ = ModelConfig::load(dir / "config.json");

    fs::path const single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    if (fs::exists(index, ec)) {
      c.open_sharded(index);
    } else if (fs::exists(single, ec)) {
      c.files_.push_back(SafetensorsFile::open(single));
      for (auto const& t : c.files_.back().tensors()) c.add(t);
    } else {
      fail(ErrorCode::kIo, dir.string() + ": neither model.safetensors nor model.safetensors.index.json exists");
    }
    return c;
  }

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(Checkpoint const&) = delete;
  Checkpoint& operator=(Checkpoint const&) = delete;

  ModelConfig const& config() const noexcept { return config_; }
  std::filesystem::path const& dir() const noexcept { return dir_; }
  TensorInfo const* find(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? nullptr : it->second;
  }
  TensorInfo const& get(std::string_view name) const {
    if (auto const* t = find(name)) return *t;
    fail(ErrorCode::kMissingTensor, dir_.string() + ": tensor '" + std::string(name) + "' is not in the checkpoint");
  }
  // Every tensor name, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(by_name_.size());
    for (auto const& [n, t] : by_name_) out.push_back(n);
    std::sort(out.begin(), out.end());
    return out;
  }
  std::size_t size() const noexcept { return by_name_.size(); }
  std::vector<SafetensorsFile> const& files() const noexcept { return files_; }

 private:
  Checkpoint() = default;

  void add(TensorInfo const& t) {
    auto [it, inserted] = by_name_.emplace(t.name, &t);
    if (!inserted)
      fail(ErrorCode::kFormat, dir_.string() + ": tensor '" + t.name + "' is stored twice (" + it->second->file +
                                   " and " + t.file + ")");
  }

  void open_sharded(std::filesystem::path const& index) {
    std::ifstream in(index, std::ios::binary);
    if (!in) fail(ErrorCode::kIo, index.string() + ": cannot open");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) fail(ErrorCode::kFormat, index.string() + ": not a JSON object");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) fail(ErrorCode::kFormat, index.string() + ": no \"weight_map\" object");
    std::map<std::string, std::vector<std::string>> by_file;  // shard -> tensors it should hold
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        fail(ErrorCode::kFormat, index.string() + ": weight_map entry '" + it.key() + "' is not a file name");
      std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." || f == "..")
        fail(ErrorCode::kFormat, index.string() + ": weight_map entry '" + it.key() + "' names a bad file '" + f + "'");
      by_file[f].push_back(it.key());
    }
    std::error_code ec;
    for (auto const& [f, names] : by_file) {
      std::filesystem::path p = dir_ / f;
      if (!std::filesystem::exists(p, ec))
        fail(ErrorCode::kIo, index.string() + ": shard '" + f + "' (holding tensor '" + names.front() + "') does not exist");
      files_.push_back(SafetensorsFile::open(p));
      SafetensorsFile const& shard = files_.back();
      for (auto const& n : names)
        if (!shard.find(n))
          fail(ErrorCode::kFormat, index.string() + ": tensor '" + n + "' is mapped to " + p.string() + " which does not hold it");
    }
    // Every tensor of every shard counts, listed or not, so that a tensor in two shards is caught.
    for (auto const& shard : files_)
      for (auto const& t : shard.tensors()) add(t);
    for (auto const& [f, names] : by_file)
      for (auto const& n : names)
        if (by_name_.at(n)->file != (dir_ / f).string())
          fail(ErrorCode::kFormat, index.string() + ": tensor '" + n + "' is mapped to " + f + " but found in " + by_name_.at(n)->file);
  }

  std::filesystem::path dir_;
  ModelConfig config_;
  std::vector<SafetensorsFile> files_;  // TensorInfo pointers below point into these (stable under move)
  std::unordered_map<std::string, TensorInfo const*> by_name_;
};

}  // namespace ling::io
