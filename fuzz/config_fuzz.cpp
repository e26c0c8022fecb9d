// libFuzzer target: the bytes are a config file's text (or a run directory's config.json),
// read by the parser that --config and --resume use. Parsing and validation may refuse with
// config_error and nothing else; a config that is accepted must come back unchanged from
// to_json and config_from_json.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  troupe::train_config cfg;
  try {
    cfg = troupe::config_from_json(text);
  } catch (const troupe::config_error&) {
    return 0;
  }
  try {
    troupe::validate(cfg);
  } catch (const troupe::config_error&) {
    // Refused with a message: what the CLI prints before exit 2.
  }
  const std::string once = troupe::to_json(cfg).dump();
  const std::string twice = troupe::to_json(troupe::config_from_json(once)).dump();
  if (once != twice) {
    std::fprintf(stderr, "config round trip changed:\n%s\n%s\n", once.c_str(), twice.c_str());
    std::abort();
  }
  return 0;
}
