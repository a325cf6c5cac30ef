// WordPiece tokenizer and vocabulary builder (see wordpiece.h for the rules kept).
#include "ampforge/data/wordpiece.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <queue>
#include <set>
#include <unordered_set>

#include "ampforge/util/error.h"
#include "ampforge/util/file.h"

namespace ampforge::data {

namespace {

struct CodeRange {
  char32_t lo, hi;
};
struct FoldEntry {
  char32_t cp;
  uint32_t offset, len;
};
#include "ampforge/data/wordpiece_unicode.inc"

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], char32_t c) {
  const CodeRange* it = std::upper_bound(r, r + N, c, [](char32_t v, const CodeRange& x) { return v < x.lo; });
  return it != r && c <= (it - 1)->hi;
}

// Word breaks: Zs, \t \n \r, and LINE / PARAGRAPH SEPARATOR (Zl, Zp: the only other characters that both of Hugging
// Face's BERT tokenizers split at, through Python's str.split() and Rust's char::is_whitespace).
bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x2028 || c == 0x2029 || in_ranges(kSpaceSep, c);
}
// Private use (Co): three fixed ranges (Unicode's stability policy), dropped by both Hugging Face tokenizers.
bool is_private_use(char32_t c) {
  return (c >= 0xE000 && c <= 0xF8FF) || (c >= 0xF0000 && c <= 0xFFFFD) || (c >= 0x100000 && c <= 0x10FFFD);
}
bool is_control(char32_t c) {
  return c != '\t' && c != '\n' && c != '\r' && (in_ranges(kControl, c) || is_private_use(c));
}
bool is_punctuation(char32_t c) {
  // BERT treats every non-alphanumeric ASCII symbol as punctuation ("$", "^", "`" are not Unicode P*).
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  return in_ranges(kPunctuation, c);
}
// The CJK Unified Ideographs blocks (BERT's _is_chinese_char): Han characters only, not kana or hangul.
bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Decodes UTF-8; invalid sequences decode to U+FFFD (which the cleanup drops). ok = false if any was invalid.
std::u32string decode_utf8(const std::string& s, bool* ok = nullptr) {
  std::u32string out;
  out.reserve(s.size());
  if (ok) *ok = true;
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
    char32_t c = n == 0 ? b : n == 1 ? (b & 0x1F) : n == 2 ? (b & 0x0F) : (b & 0x07);
    bool good = n >= 0 && i + static_cast<size_t>(n) < s.size();  // the continuation bytes exist
    for (int k = 1; good && k <= n; ++k) {
      const auto cb = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cb >> 6) != 2) good = false;
      else c = (c << 6) | (cb & 0x3F);
    }
    // Overlong forms, surrogates and values above U+10FFFF are invalid.
    if (good && ((n == 1 && c < 0x80) || (n == 2 && c < 0x800) || (n == 3 && c < 0x10000) || c > 0x10FFFF ||
                 (c >= 0xD800 && c <= 0xDFFF)))
      good = false;
    if (!good) {
      out.push_back(0xFFFD);
      if (ok) *ok = false;
      ++i;
      continue;
    }
    out.push_back(c);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string encode_utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// lower(c), then NFD with combining marks removed (the uncased form), appended to out.
void append_folded(std::u32string& out, char32_t c) {
  if (c < 0x80) {  // ASCII: only letters change
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (c >= 0xAC00 && c <= 0xD7A3) {  // Hangul syllable: NFD is L V (T) jamo (Unicode ch. 3.12)
    const char32_t s = c - 0xAC00;
    out.push_back(0x1100 + s / (21 * 28));
    out.push_back(0x1161 + (s % (21 * 28)) / 28);
    if (s % 28) out.push_back(0x11A7 + s % 28);
    return;
  }
  const FoldEntry* end = kFold + std::size(kFold);
  const FoldEntry* it = std::lower_bound(kFold, end, c, [](const FoldEntry& e, char32_t v) { return e.cp < v; });
  if (it != end && it->cp == c) {
    out.append(kFoldPool + it->offset, kFoldPool + it->offset + it->len);
    return;
  }
  out.push_back(c);
}

}  // namespace

// ---- Vocab ----------------------------------------------------------------------------------------------------
Vocab::Vocab(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    AF_CHECK(!tokens_[i].empty(), "vocabulary: token {} is empty", i);
    // What save() writes must load back as the same tokens: one per line, so no line breaks, no whitespace
    // (the loader refuses it) and no NUL or carriage return (a line's trailing '\r' is dropped on load).
    AF_CHECK(tokens_[i].find_first_of(std::string(" \t\n\r\v\f\0", 7)) == std::string::npos,
             "vocabulary: token {} contains whitespace or a control character (\\0 \\r \\n \\t \\v \\f or a "
             "space), which a vocab.txt line cannot hold", i);
    const auto [it, fresh] = ids_.emplace(tokens_[i], static_cast<int64_t>(i));
    AF_CHECK(fresh, "vocabulary: token '{}' appears twice (ids {} and {})", tokens_[i], it->second, i);
  }
}

Vocab Vocab::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) AF_THROW(Io, "cannot read the vocabulary file '{}' (expected a BERT vocab.txt: one token per line)", path);
  std::vector<std::string> tokens;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    AF_CHECK(!line.empty(), "vocabulary file '{}', line {}: empty line (a vocab.txt has one token per line)", path, n);
    AF_CHECK(line.find_first_of(std::string(" \t\r\v\f\0", 6)) == std::string::npos, "vocabulary file '{}', line {}: "
             "token '{}' contains whitespace or a control character (a vocab.txt has one token per line)", path, n,
             line);
    bool ok = true;
    decode_utf8(line, &ok);
    AF_CHECK(ok, "vocabulary file '{}', line {}: invalid UTF-8", path, n);
    tokens.push_back(line);
  }
  AF_CHECK(!tokens.empty(), "vocabulary file '{}' is empty", path);
  try {
    return Vocab(std::move(tokens));
  } catch (const Error& e) {
    AF_THROW(InvalidArgument, "vocabulary file '{}': {}", path, e.what());
  }
}

void Vocab::save(const std::string& path) const {
  std::string text;
  for (const auto& t : tokens_) text += t + '\n';
  write_file_atomically(path, text, "vocabulary file");
}

int64_t Vocab::id(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

const std::string& Vocab::token(int64_t id) const {
  AF_CHECK(id >= 0 && id < size(), "vocabulary: id {} is outside [0, {})", id, size());
  return tokens_[static_cast<size_t>(id)];
}

// ---- WordPieceTokenizer ---------------------------------------------------------------------------------------
WordPieceTokenizer::WordPieceTokenizer(Vocab vocab, WordPieceOptions opt) : vocab_(std::move(vocab)), opt_(opt) {
  AF_CHECK(opt_.max_input_chars_per_word > 0, "WordPiece: max_input_chars_per_word must be positive");
  auto special = [&](const std::string& t) {
    const int64_t id = vocab_.id(t);
    AF_CHECK(id >= 0, "WordPiece: the vocabulary ({} tokens) has no special token '{}' (a BERT vocab.txt holds [PAD], "
             "[UNK], [CLS], [SEP] and [MASK])", vocab_.size(), t);
    return id;
  };
  unk_ = special(opt_.unk), cls_ = special(opt_.cls), sep_ = special(opt_.sep), pad_ = special(opt_.pad);
  mask_ = special(opt_.mask);
}

WordPieceTokenizer WordPieceTokenizer::from_file(const std::string& path, WordPieceOptions opt) {
  Vocab v = Vocab::load(path);
  try {
    return WordPieceTokenizer(std::move(v), opt);
  } catch (const Error& e) {
    AF_THROW(InvalidArgument, "vocabulary file '{}': {}", path, e.what());
  }
}

std::vector<std::string> WordPieceTokenizer::basic_tokenize(const std::string& text) const {
  // Clean-up and CJK spacing in one pass over code points; words are cut at spaces and punctuation.
  const std::u32string cps = decode_utf8(text);
  std::vector<std::string> out;
  std::u32string word, folded;
  auto flush = [&] {
    if (word.empty()) return;
    if (opt_.lower_case) {
      folded.clear();
      for (char32_t c : word) append_folded(folded, c);
    } else {
      folded = word;
    }
    // Punctuation splits after folding (BERT lower-cases and strips accents first, then splits).
    std::u32string cur;
    for (char32_t c : folded) {
      if (is_punctuation(c)) {
        if (!cur.empty()) out.push_back(encode_utf8(cur)), cur.clear();
        out.push_back(encode_utf8(std::u32string(1, c)));
      } else {
        cur.push_back(c);
      }
    }
    if (!cur.empty()) out.push_back(encode_utf8(cur));
    word.clear();
  };
  for (char32_t c : cps) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_whitespace(c)) {
      flush();
    } else if (opt_.tokenize_chinese_chars && is_cjk(c)) {
      flush();
      word.push_back(c);
      flush();
    } else {
      word.push_back(c);
    }
  }
  flush();
  return out;
}

std::vector<std::string> WordPieceTokenizer::wordpiece(const std::string& word) const {
  const std::u32string cps = decode_utf8(word);
  if (static_cast<int64_t>(cps.size()) > opt_.max_input_chars_per_word) return {opt_.unk};
  std::vector<std::string> pieces;
  size_t start = 0;
  while (start < cps.size()) {
    size_t end = cps.size();
    std::string found;
    while (start < end) {
      std::string sub = start > 0 ? "##" : "";
      sub += encode_utf8(cps.substr(start, end - start));
      if (vocab_.contains(sub)) {
        found = std::move(sub);
        break;
      }
      --end;
    }
    if (found.empty()) return {opt_.unk};  // any unmatched part makes the whole word unknown
    pieces.push_back(std::move(found));
    start = end;
  }
  return pieces;
}

std::vector<std::string> WordPieceTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (const std::string& w : basic_tokenize(text))
    for (std::string& p : wordpiece(w)) out.push_back(std::move(p));
  return out;
}

std::vector<int64_t> WordPieceTokenizer::token_ids(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& t : tokenize(text)) ids.push_back(vocab_.id(t));
  return ids;
}

Encoding WordPieceTokenizer::encode(const std::string& text, int64_t max_length, int64_t pad_to) const {
  AF_CHECK(max_length >= 2, "WordPiece::encode: max_length must hold [CLS] and [SEP] (>= 2), got {}", max_length);
  AF_CHECK(pad_to >= 0 && pad_to <= max_length, "WordPiece::encode: pad_to must be in [0, max_length {}], got {}",
           max_length, pad_to);
  std::vector<int64_t> body = token_ids(text);
  if (static_cast<int64_t>(body.size()) > max_length - 2) body.resize(static_cast<size_t>(max_length - 2));
  Encoding e;
  e.ids.push_back(cls_);
  e.ids.insert(e.ids.end(), body.begin(), body.end());
  e.ids.push_back(sep_);
  e.attention_mask.assign(e.ids.size(), 1);
  while (static_cast<int64_t>(e.ids.size()) < pad_to) e.ids.push_back(pad_), e.attention_mask.push_back(0);
  return e;
}

// ---- Vocabulary builder ---------------------------------------------------------------------------------------
Vocab learn_wordpiece_vocab(const std::vector<std::string>& texts, const VocabLearnOptions& opt) {
  const std::vector<std::string> specials{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  // The basic tokenizer needs a vocabulary with the special tokens only.
  WordPieceOptions wo;
  wo.lower_case = opt.lower_case;
  const WordPieceTokenizer basic(Vocab(specials), wo);
  std::map<std::string, int64_t> word_counts;  // ordered: deterministic
  for (const std::string& t : texts)
    for (std::string& w : basic.basic_tokenize(t)) ++word_counts[w];
  AF_CHECK(!word_counts.empty(), "learn_wordpiece_vocab: the texts contain no words");

  // Symbols: id -> string ("a", "##b", "ab", ...). Words: a sequence of symbol ids with a count.
  std::vector<std::string> symbols;
  std::unordered_map<std::string, int32_t> symbol_id;
  auto intern = [&](const std::string& s) {
    auto [it, fresh] = symbol_id.emplace(s, static_cast<int32_t>(symbols.size()));
    if (fresh) symbols.push_back(s);
    return it->second;
  };
  std::map<std::string, int64_t> alphabet_counts;
  struct Word {
    std::vector<int32_t> sym;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [w, n] : word_counts) {
    const std::u32string cps = decode_utf8(w);
    if (static_cast<int64_t>(cps.size()) > opt.max_input_chars_per_word) continue;
    Word word{{}, n};
    for (size_t i = 0; i < cps.size(); ++i) {
      const std::string s = (i ? "##" : "") + encode_utf8(cps.substr(i, 1));
      alphabet_counts[s] += n;
      word.sym.push_back(intern(s));
    }
    words.push_back(std::move(word));
  }
  // The alphabet goes first, most frequent first (ties by string), so ids do not depend on hash order.
  std::vector<std::pair<std::string, int64_t>> alphabet(alphabet_counts.begin(), alphabet_counts.end());
  std::stable_sort(alphabet.begin(), alphabet.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  const int64_t base = static_cast<int64_t>(specials.size() + alphabet.size());
  AF_CHECK(opt.vocab_size >= base, "learn_wordpiece_vocab: vocab_size {} cannot hold the {} special tokens and the "
           "alphabet of {} characters (continuations included)", opt.vocab_size, specials.size(), alphabet.size());
  std::vector<std::string> vocab = specials;
  for (const auto& [s, n] : alphabet) vocab.push_back(s);

  // Pair counts, kept up to date as merges rewrite words; `where` lists the words a pair occurs in. The best
  // pair comes from a max-heap of (count, pair) with lazy invalidation: an entry whose count no longer matches
  // is stale and re-pushed with its current count, so each merge costs the words it touches, not all pairs.
  auto key = [](int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); };
  std::unordered_map<uint64_t, int64_t> pairs;
  std::unordered_map<uint64_t, std::unordered_set<int32_t>> where;
  struct Entry {
    int64_t count;
    uint64_t pair;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : pair > o.pair; }
  };
  std::priority_queue<Entry> heap;
  std::unordered_set<uint64_t> touched;
  auto count_word = [&](int32_t wi, int64_t sign) {
    const Word& w = words[static_cast<size_t>(wi)];
    for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
      const uint64_t k = key(w.sym[i], w.sym[i + 1]);
      pairs[k] += sign * w.count;
      if (sign > 0) where[k].insert(wi), touched.insert(k);
    }
  };
  for (int32_t wi = 0; wi < static_cast<int32_t>(words.size()); ++wi) count_word(wi, +1);
  auto push_touched = [&] {
    for (uint64_t k : touched) {
      const auto it = pairs.find(k);
      if (it != pairs.end() && it->second > 0) heap.push({it->second, k});
    }
    touched.clear();
  };
  push_touched();
  std::unordered_set<std::string> in_vocab(vocab.begin(), vocab.end());
  const int64_t min_count = std::max<int64_t>(opt.min_frequency, 1);
  while (static_cast<int64_t>(vocab.size()) < opt.vocab_size && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const auto it = pairs.find(top.pair);
    const int64_t now = it == pairs.end() ? 0 : it->second;
    if (now != top.count) {  // stale: counts changed since it was pushed
      if (now > 0) heap.push({now, top.pair});
      continue;
    }
    if (top.count < min_count) break;
    const uint64_t best = top.pair;
    const auto a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xffffffffu);
    std::string merged = symbols[static_cast<size_t>(a)];
    merged += symbols[static_cast<size_t>(b)].substr(2);  // b is always a continuation ("##...")
    const int32_t m = intern(merged);
    if (in_vocab.insert(merged).second) vocab.push_back(merged);
    const std::unordered_set<int32_t> affected = std::move(where[best]);
    where.erase(best);
    for (int32_t wi : affected) {
      count_word(wi, -1);
      std::vector<int32_t>& sym = words[static_cast<size_t>(wi)].sym;
      std::vector<int32_t> out;
      for (size_t i = 0; i < sym.size(); ++i) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) out.push_back(m), ++i;
        else out.push_back(sym[i]);
      }
      sym = std::move(out);
      count_word(wi, +1);
    }
    pairs.erase(best);
    push_touched();
  }
  return Vocab(std::move(vocab));
}

}  // namespace ampforge::data
