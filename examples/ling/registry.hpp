#pragma once
// Subcommands of `ling` register themselves: each file defines `static Registrar r{order, add_xxx};`.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <vector>

namespace ling::cli {

struct Command {
  int order;
  std::function<void(CLI::App&)> add;
};

inline std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}

struct Registrar {
  Registrar(int order, std::function<void(CLI::App&)> add) { commands().push_back({order, std::move(add)}); }
};

}  // namespace ling::cli
