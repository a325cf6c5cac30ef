// Test helper (header-only) for the whole-model parity tests (models/*_parity_test.cpp): one golden set is
// tests/data/models/<stem>.safetensors (the reference's numbers) beside <stem>.json (how, with which library
// versions, what was recorded), written by a scripts/gen_*_golden.py.
#pragma once

#include <exception>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/core/safetensors.h"

namespace ampforge::testutil {

struct ParityGolden {
  SafetensorsFile file;
  nlohmann::json manifest;
  std::string error;  // non-empty when either file could not be read: which, why, and `regenerate`
};

// Reads <dir>/<stem>.safetensors and <dir>/<stem>.json; never throws (a test reports `error` and fails).
inline ParityGolden load_parity_golden(const std::string& dir, const std::string& stem, const std::string& what,
                                       const std::string& regenerate) {
  ParityGolden g;
  const std::string base = dir + "/" + stem;
  try {
    g.file = load_safetensors(base + ".safetensors");
    std::ifstream in(base + ".json");
    g.manifest = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    g.error = fmt::format("cannot read the {} goldens {}.*: {} ({})", what, base, e.what(), regenerate);
  }
  return g;
}

}  // namespace ampforge::testutil
