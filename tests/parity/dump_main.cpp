// ampforge_parity_dump OUT_DIR: writes OUT_DIR/manifest.json (every parity case: op, attrs, input specs)
// and OUT_DIR/inputs.safetensors (each case's input values "<case>/in/<i>" and the fixed random gradient
// of its first output "<case>/grad_out", all from ampforge's Philox generator, so the dump is identical on
// every run and machine). scripts/gen_golden.py turns them into tests/parity/golden/golden.safetensors.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ampforge/core/safetensors.h"
#include "ampforge/util/error.h"
#include "registry.h"

using namespace ampforge;

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: %s OUT_DIR\n  writes OUT_DIR/manifest.json and OUT_DIR/inputs.safetensors\n", argv[0]);
    return argc == 2 ? 0 : 2;
  }
  const std::filesystem::path dir = argv[1];
  try {
    std::filesystem::create_directories(dir);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const parity::Case& c : parity::cases()) {
      const std::vector<Tensor> vals = parity::generate_inputs(c);
      for (size_t i = 0; i < vals.size(); ++i) tensors.emplace_back(c.name + "/in/" + std::to_string(i), vals[i]);
      // One F32 forward to learn the output shape for grad_out.
      const std::vector<Tensor> outs = c.fn(parity::prepare_inputs(c, vals, DType::F32), c.attrs);
      tensors.emplace_back(c.name + "/grad_out", parity::generate_grad_output(c, outs.at(0).shape()));
    }
    const std::string manifest = parity::manifest().dump(1);
    {
      std::ofstream f(dir / "manifest.json");
      f << manifest << "\n";
      if (!f) throw Error(ErrorKind::Io, "cannot write " + (dir / "manifest.json").string());
    }
    save_safetensors((dir / "inputs.safetensors").string(), tensors, {{"manifest", parity::manifest().dump()}});
    std::printf("wrote %zu cases to %s\n", parity::cases().size(), dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ampforge_parity_dump: %s\n", e.what());
    return 1;
  }
}
