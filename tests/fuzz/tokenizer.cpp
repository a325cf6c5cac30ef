// Fuzzes the WordPiece tokenizer's input (any bytes a corpus or a user may hand it: invalid UTF-8,
// control characters, CJK, combining marks), cased and uncased. Properties: ids are in the vocabulary;
// encode() frames with [CLS] ... [SEP], truncates to max_length and pads to pad_to.
#include <algorithm>

#include "ampforge/data/wordpiece.h"
#include "fuzz_util.h"

using namespace ampforge;

namespace {
data::Vocab make_vocab() {
  std::vector<std::string> t = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (const char* w : {"the", "un", "##aff", "##able", "a", "##b", "##c", "é", "中", "!", "##s", "run", "##ning",
                        "x", "##x", "ß", "straße", "ü", "привет", "##и"})
    t.push_back(w);
  for (char c = 'a'; c <= 'z'; ++c)
    if (std::find(t.begin(), t.end(), std::string("##") + c) == t.end()) t.push_back(std::string("##") + c);
  return data::Vocab(t);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const data::WordPieceTokenizer uncased(make_vocab());
  static const data::WordPieceTokenizer cased(make_vocab(), [] {
    data::WordPieceOptions o;
    o.lower_case = false;
    o.max_input_chars_per_word = 8;
    return o;
  }());
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const data::WordPieceTokenizer* tok : {&uncased, &cased}) {
    for (int64_t id : tok->token_ids(text)) FUZZ_CHECK(id >= 0 && id < tok->vocab().size());
    const data::Encoding e = tok->encode(text, 12, 12);
    FUZZ_CHECK(e.ids.size() == 12 && e.attention_mask.size() == 12);
    FUZZ_CHECK(e.ids[0] == tok->cls_id());
    int64_t real = 0;
    for (int64_t m : e.attention_mask) real += m;
    FUZZ_CHECK(real >= 2 && real <= 12 && e.ids[static_cast<size_t>(real - 1)] == tok->sep_id());
    for (size_t i = static_cast<size_t>(real); i < 12; ++i) FUZZ_CHECK(e.ids[i] == tok->pad_id());
  }
  return 0;
}
