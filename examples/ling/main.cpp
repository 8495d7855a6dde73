// `ling`: the command line. Every ling::Error becomes a message on stderr and exit code 1; nothing crashes.
#include <cstdio>
#include <exception>

#include "ling/core/error.hpp"
#include "registry.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ling: Ling-3.0-class hybrid models (KDA + gated MLA + MoE + MTP) on CPU and CUDA"};
  app.require_subcommand(1);
  auto& list = ling::cli::commands();
  std::sort(list.begin(), list.end(), [](auto const& a, auto const& b) { return a.order < b.order; });
  for (auto const& c : list) c.add(app);
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    return app.exit(e);
  } catch (ling::Error const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
