// Fuzzes vocab.txt files (Vocab::load: BERT vocabularies users bring). Property: a vocabulary that loads
// saves and loads back to the same tokens, and builds a tokenizer when it has the special tokens.
#include "ampforge/data/wordpiece.h"
#include "ampforge/util/error.h"
#include "fuzz_util.h"

using namespace ampforge;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile in("vocab");
  data::Vocab v;
  try {
    v = data::Vocab::load(in.write(data, size));
  } catch (const Error&) {
    return 0;
  }
  const std::string again = fuzz::scratch_dir() + "/vocab.txt";
  v.save(again);
  const data::Vocab w = data::Vocab::load(again);
  FUZZ_CHECK(w.tokens() == v.tokens());
  for (int64_t i = 0; i < v.size(); ++i) FUZZ_CHECK(v.id(v.token(i)) == i);
  try {
    data::WordPieceTokenizer tok(v);
    (void)tok.encode(v.tokens().back() + " " + v.tokens().front(), 16, 16);
  } catch (const Error&) {  // special tokens missing
  }
  return 0;
}
