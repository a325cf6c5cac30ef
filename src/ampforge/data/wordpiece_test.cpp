// WordPiece tokenizer against Hugging Face's tokenizers (BertWordPieceTokenizer; transformers' BertTokenizerFast is
// the same Rust code), from the goldens of scripts/gen_wordpiece_golden.py (no Python at test time):
//   - the edge cases (tests/data/text/wordpiece_sentences.txt, wordpiece_edge_cases.txt with wordpiece_vocab.txt;
//     golden tests/data/models/wordpiece_golden.json): words, pieces and framed ids of every line;
//   - every Unicode code point c in "a" c "b" (wordpiece_unicode.json): dropped, a word break, a word of its own or
//     kept, and what it becomes (lower-cased, accents stripped);
//   - the real corpus: all of WordNet's glosses (wordnet-base, as `--corpus wordnet` reads them) with the
//     8192-token vocabulary tokenizers' trainer learned from them (wordnet_vocab.txt; golden
//     wordpiece_wordnet.{json,safetensors}: a hash of every gloss's ids, the full ids of every 1000th gloss).
// Where tokenizers and transformers' Python tokenizer (BERT's rules on Python's Unicode 14 database, as ampforge's
// tables) disagree, the golden lists the difference, why, and which side ampforge follows; the tests expect
// exactly that side, so every difference from tokenizers is listed and explained there ("reasons").
// Also: errors for bad vocabularies, framing, and the vocabulary builder.
#include "ampforge/data/wordpiece.h"

#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ampforge/core/safetensors.h"
#include "ampforge/data/text_corpus.h"
#include "ampforge/util/error.h"

using namespace ampforge;
using namespace ampforge::data;
using nlohmann::json;

namespace {

const std::string kText = std::string(AMPFORGE_TEST_DATA_DIR) + "/text";
const std::string kModels = std::string(AMPFORGE_TEST_DATA_DIR) + "/models";
constexpr const char* kRegenerate =
    "regenerate with HF_HUB_OFFLINE=1 .venv-peer/bin/python scripts/gen_wordpiece_golden.py";

std::string temp_file(const std::string& name, const std::string& content) {
  const auto p = std::filesystem::temp_directory_path() / ("ampforge_wordpiece_" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool verbose() {
  const char* v = std::getenv("AMPFORGE_PARITY_VERBOSE");
  return v && *v && std::string(v) != "0";
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path + " (" + kRegenerate + ")");
  return json::parse(in);
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::string joined(const std::vector<std::string>& words) {
  std::string s = "[";
  for (size_t i = 0; i < words.size(); ++i) s += (i ? "|" : "") + words[i];
  return s + "]";
}

// The goldens' hash (scripts/gen_wordpiece_golden.py): FNV-1a over 64-bit words.
constexpr uint64_t kFnvOffset = 0xCBF29CE484222325ULL, kFnvPrime = 0x100000001B3ULL;
uint64_t fnv(uint64_t h, uint64_t x) { return (h ^ x) * kFnvPrime; }
uint64_t fold16(uint64_t h) { return (h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) & 0xFFFF; }

}  // namespace

// Each line's words, pieces and framed ids, as tokenizers gives them (or, where the golden says so and why, as
// transformers' Python tokenizer gives them).
TEST(WordPiece, MatchesHuggingFaceTokenizersOnEdgeCases) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kText + "/wordpiece_vocab.txt");
  const json g = read_json(kModels + "/wordpiece_golden.json");
  ASSERT_EQ(g.at("vocab").get<std::string>(), "tests/data/text/wordpiece_vocab.txt");
  size_t n = 0, legacy = 0;
  for (const json& file : g.at("files")) {
    const std::string name = file.at("sentences").get<std::string>();
    // The golden was made from the sentences file as it is now.
    const std::vector<std::string> lines =
        read_lines(std::string(AMPFORGE_TEST_DATA_DIR) + "/" + name.substr(std::string("tests/data/").size()));
    const json& cases = file.at("cases");
    ASSERT_EQ(cases.size(), lines.size()) << name << " changed since the golden was made (" << kRegenerate << ")";
    for (size_t i = 0; i < cases.size(); ++i, ++n) {
      const std::string text = cases[i].at("text").get<std::string>();
      EXPECT_EQ(text, lines[i]) << name << " line " << i + 1;
      const bool follows_legacy = cases[i].value("ampforge", "tokenizers") == "legacy";
      const json& want = follows_legacy ? cases[i].at("legacy") : cases[i];
      legacy += follows_legacy;
      const std::string why = cases[i].contains("reason") ? " (expected: " + cases[i].value("ampforge", "") +
                                                                 ", reason " + cases[i].value("reason", "") + ")"
                                                           : "";
      EXPECT_EQ(tok.basic_tokenize(text), want.at("basic").get<std::vector<std::string>>()) << text << why;
      EXPECT_EQ(tok.tokenize(text), want.at("tokens").get<std::vector<std::string>>()) << text << why;
      EXPECT_EQ(tok.encode(text).ids, want.at("ids").get<std::vector<int64_t>>()) << text << why;
    }
  }
  EXPECT_GE(n, 25u);
  if (verbose()) std::printf("  %zu lines, %zu following the legacy tokenizer (see the golden's reasons)\n", n, legacy);
}

// Every code point in "a" c "b". Expected: tokenizers' answer, except the code points the golden lists under
// ampforge_differs (each with its reason: Unicode 14 categories where tokenizers' tables are older, BERT's CJK
// range where tokenizers has a typo, unassigned code points that tokenizers lower-cases with a newer Unicode).
TEST(WordPiece, MatchesHuggingFaceTokenizersOnEveryCodePoint) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kText + "/wordpiece_vocab.txt");
  const json g = read_json(kModels + "/wordpiece_unicode.json");
  constexpr char32_t kEnd = 0x110000;
  std::vector<char> cls(kEnd, 'k');  // d(rop) s(pace) i(solate) k(eep)
  std::vector<std::string> reason(kEnd);
  auto letter = [](const std::string& c) {
    return c == "drop" ? 'd' : c == "space" ? 's' : c == "isolate" ? 'i' : 'k';
  };
  for (const json& r : g.at("classes"))
    for (auto c = r[0].get<uint32_t>(); c <= r[1].get<uint32_t>(); ++c) cls[c] = letter(r[2].get<std::string>());
  std::map<char32_t, std::string> fold;
  for (const auto& [k, v] : g.at("fold").items()) fold[static_cast<char32_t>(std::stoul(k))] = v.get<std::string>();
  std::map<std::string, int64_t> differs;  // per reason
  for (const json& r : g.at("ampforge_differs"))
    for (auto c = r[0].get<uint32_t>(); c <= r[1].get<uint32_t>(); ++c) {
      cls[c] = letter(r[2].get<std::string>());
      reason[c] = r[3].get<std::string>();
      fold.erase(c);
      ++differs[reason[c]];
    }
  for (const auto& [k, v] : g.at("ampforge_differs_fold").items())
    fold[static_cast<char32_t>(std::stoul(k))] = v.get<std::string>();
  for (const auto& [r, count] : g.at("ampforge_differs_count").items())
    EXPECT_EQ(differs[r], count.get<int64_t>()) << "the golden's ampforge_differs ranges for " << r;
  const json& hangul = g.at("hangul_syllables");
  const auto hangul_first = hangul.at("first").get<uint32_t>(), hangul_last = hangul.at("last").get<uint32_t>();

  int64_t bad = 0, checked = 0;
  std::string report;
  uint64_t hangul_hash = kFnvOffset;
  for (char32_t c = 0; c < kEnd; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;  // surrogates: not characters (UTF-8 cannot hold them)
    const std::string ch = utf8(c);
    const std::vector<std::string> got = tok.basic_tokenize("a" + ch + "b");
    std::vector<std::string> want;
    const bool is_hangul = c >= hangul_first && c <= hangul_last;
    const auto it = fold.find(c);
    std::string f = it != fold.end() ? it->second : ch;
    if (is_hangul && got.size() == 1 && got[0].size() > 2) {  // what a syllable becomes: checked by the hash
      f = got[0].substr(1, got[0].size() - 2);
      for (unsigned char b : f) hangul_hash = fnv(hangul_hash, b);
      hangul_hash = fnv(hangul_hash, 10);
    }
    switch (cls[c]) {
      case 'd': want = {"ab"}; break;
      case 's': want = {"a", "b"}; break;
      case 'i': want = {"a", f, "b"}; break;
      default: want = {"a" + f + "b"};
    }
    ++checked;
    if (got != want) {
      if (++bad <= 25)
        report += fmt::format("  U+{:04X}: ampforge {}, expected {} ({})\n", static_cast<uint32_t>(c), joined(got),
                              joined(want), reason[c].empty() ? "tokenizers" : "ampforge_differs: " + reason[c]);
    }
  }
  EXPECT_EQ(checked, 0x110000 - 0x800);
  EXPECT_EQ(bad, 0) << bad << " code points differ from the golden (first 25):\n" << report;
  EXPECT_EQ(fmt::format("{:016x}", hangul_hash), hangul.at("fnv").get<std::string>())
      << "Hangul syllables: the jamo ampforge decomposes them into differ from tokenizers' NFD";
  if (verbose())
    for (const auto& [r, count] : differs) std::printf("  differs from tokenizers as listed: %-28s %lld code points\n",
                                                       r.c_str(), static_cast<long long>(count));
}

// All of WordNet's glosses: the ids of every gloss equal tokenizers' (hash per gloss, full ids for a sample).
// Prints ampforge's tokenisation speed with AMPFORGE_PARITY_VERBOSE=1 (one thread, as the golden's reference).
TEST(WordPiece, MatchesHuggingFaceTokenizersOnWordNet) {
  const json g = read_json(kModels + "/wordpiece_wordnet.json");
  const std::string dir = g.at("wordnet_dir").get<std::string>();
  if (!std::filesystem::exists(dir + "/data.noun"))
    GTEST_SKIP() << "WordNet is not installed in " << dir << " (Debian's wordnet-base, scripts/setup installs it)";
  const std::vector<std::string> glosses = read_wordnet_glosses(dir);
  uint64_t corpus = kFnvOffset;
  for (const std::string& d : glosses) {
    for (unsigned char b : d) corpus = fnv(corpus, b);
    corpus = fnv(corpus, 10);
  }
  ASSERT_EQ(glosses.size(), g.at("glosses").get<size_t>()) << "another WordNet than the golden's (wordnet-base "
                                                           << g.at("wordnet_base") << "; " << kRegenerate << ")";
  ASSERT_EQ(fmt::format("{:016x}", corpus), g.at("corpus_fnv").get<std::string>())
      << "WordNet's glosses differ from the golden's (wordnet-base " << g.at("wordnet_base") << "; " << kRegenerate
      << ")";
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kText + "/wordnet_vocab.txt");
  ASSERT_EQ(tok.vocab().size(), g.at("vocab_size").get<int64_t>());

  std::vector<std::vector<int64_t>> ids(glosses.size());
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  for (size_t i = 0; i < glosses.size(); ++i) ids[i] = tok.token_ids(glosses[i]);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_seconds = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;

  const SafetensorsFile h = load_safetensors(kModels + "/wordpiece_wordnet.safetensors");
  const Tensor& h16 = h.at("gloss_hash16");
  const Tensor& blocks = h.at("block_hash");
  ASSERT_EQ(h16.shape(), (Shape{static_cast<int64_t>(glosses.size()), 2}));
  const auto block = g.at("block").get<size_t>();
  ASSERT_EQ(blocks.numel(), static_cast<int64_t>((glosses.size() + block - 1) / block));
  const uint8_t* h16p = h16.data<uint8_t>();
  const int64_t* bp = blocks.data<int64_t>();
  int64_t tokens = 0, unk = 0, bad_blocks = 0, bad = 0;
  std::string report;
  for (size_t b = 0; b * block < glosses.size(); ++b) {
    uint64_t hb = kFnvOffset;
    const size_t end = std::min(glosses.size(), (b + 1) * block);
    for (size_t i = b * block; i < end; ++i) {
      hb = fnv(hb, ids[i].size());
      for (int64_t id : ids[i]) hb = fnv(hb, static_cast<uint64_t>(id)), unk += id == tok.unk_id();
      tokens += static_cast<int64_t>(ids[i].size());
    }
    if (hb == static_cast<uint64_t>(bp[b])) continue;
    ++bad_blocks;
    for (size_t i = b * block; i < end; ++i) {
      uint64_t s = kFnvOffset;
      for (int64_t id : ids[i]) s = fnv(s, static_cast<uint64_t>(id));
      if (fold16(s) == (h16p[2 * i] | (uint64_t{h16p[2 * i + 1]} << 8))) continue;
      if (++bad <= 20)
        report += fmt::format("  gloss {}: \"{}\"\n    ampforge {}\n", i, glosses[i], joined(tok.tokenize(glosses[i])));
    }
  }
  EXPECT_EQ(bad_blocks, 0) << bad_blocks << " blocks of " << block << " glosses differ from tokenizers; the glosses "
                           << "whose 16-bit hash differs (" << bad << ", first 20; tokenizers' pieces: "
                           << "scripts/gen_wordpiece_golden.py --show INDEX...):\n" << report;
  EXPECT_EQ(tokens, g.at("tokens").get<int64_t>());
  EXPECT_EQ(unk, g.at("unk_tokens").get<int64_t>());
  for (const json& s : g.at("samples")) {
    const auto i = s.at("index").get<size_t>();
    ASSERT_LT(i, glosses.size());
    EXPECT_EQ(glosses[i], s.at("text").get<std::string>());
    EXPECT_EQ(tok.tokenize(glosses[i]), s.at("tokens").get<std::vector<std::string>>()) << glosses[i];
    EXPECT_EQ(ids[i], s.at("ids").get<std::vector<int64_t>>()) << glosses[i];
  }
  if (verbose())
    std::printf("  ampforge: %zu glosses, %lld tokens in %.3f s wall, %.3f s CPU (%.0f glosses/s, %.0f tokens/s "
                "wall), one thread\n", glosses.size(), static_cast<long long>(tokens), seconds, cpu_seconds,
                static_cast<double>(glosses.size()) / seconds, static_cast<double>(tokens) / seconds);
}

// The committed goldens and their inputs stay small (the corpus itself is not stored: hashes and a sample).
TEST(WordPiece, GoldensAreSmall) {
  uintmax_t bytes = 0;
  for (const std::string& f : {kModels + "/wordpiece_golden.json", kModels + "/wordpiece_unicode.json",
                               kModels + "/wordpiece_wordnet.json", kModels + "/wordpiece_wordnet.safetensors",
                               kText + "/wordnet_vocab.txt", kText + "/wordpiece_edge_cases.txt"}) {
    ASSERT_TRUE(std::filesystem::exists(f)) << f << " (" << kRegenerate << ")";
    bytes += std::filesystem::file_size(f);
  }
  EXPECT_LT(bytes, uintmax_t{1} << 20);
}

TEST(WordPiece, RulesOnKnownExamples) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kText + "/wordpiece_vocab.txt");
  EXPECT_EQ(tok.tokenize("unaffable"), (std::vector<std::string>{"un", "##aff", "##able"}));
  EXPECT_EQ(tok.basic_tokenize("Café, naïve!"), (std::vector<std::string>{"cafe", ",", "naive", "!"}));
  EXPECT_EQ(tok.basic_tokenize("中文x"), (std::vector<std::string>{"中", "文", "x"}));
  EXPECT_EQ(tok.tokenize("zzz"), (std::vector<std::string>{"[UNK]"}));
  EXPECT_EQ(tok.tokenize(std::string(101, 'x')), (std::vector<std::string>{"[UNK]"}));  // > 100 characters
  EXPECT_EQ(tok.tokenize(std::string(100, 'x')).size(), 100u);                         // x ##x ... ##x
  // Cased: no lower-casing, no accent stripping.
  WordPieceOptions cased;
  cased.lower_case = false;
  const WordPieceTokenizer ct(tok.vocab(), cased);
  EXPECT_EQ(ct.basic_tokenize("Café"), (std::vector<std::string>{"Café"}));
}

TEST(WordPiece, FramingTruncationPaddingAndMasks) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kText + "/wordpiece_vocab.txt");
  const Encoding e = tok.encode("hello world", 8, 6);
  EXPECT_EQ(e.ids, (std::vector<int64_t>{tok.cls_id(), tok.vocab().id("hello"), tok.vocab().id("world"), tok.sep_id(),
                                         tok.pad_id(), tok.pad_id()}));
  EXPECT_EQ(e.attention_mask, (std::vector<int64_t>{1, 1, 1, 1, 0, 0}));
  const Encoding t = tok.encode("hello world hello world", 4);
  EXPECT_EQ(t.ids.size(), 4u);
  EXPECT_EQ(t.ids.front(), tok.cls_id());
  EXPECT_EQ(t.ids.back(), tok.sep_id());
  EXPECT_NE(error_of([&] { tok.encode("x", 1); }).find("max_length"), std::string::npos);
}

TEST(WordPiece, BadVocabulariesGetClearErrors) {
  std::string m = error_of([] { Vocab::load("/nonexistent/vocab.txt"); });
  EXPECT_NE(m.find("/nonexistent/vocab.txt"), std::string::npos) << m;
  m = error_of([] { Vocab::load(temp_file("empty.txt", "")); });
  EXPECT_NE(m.find("is empty"), std::string::npos) << m;
  m = error_of([] { Vocab::load(temp_file("blank.txt", "[PAD]\n\n[UNK]\n")); });
  EXPECT_NE(m.find("line 2: empty line"), std::string::npos) << m;
  m = error_of([] { Vocab::load(temp_file("dup.txt", "[PAD]\nfoo\nfoo\n")); });
  EXPECT_NE(m.find("'foo' appears twice"), std::string::npos) << m;
  m = error_of([] { Vocab::load(temp_file("space.txt", "[PAD]\nfoo bar\n")); });
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;
  // A token that save() could not write back (found by fuzzing: "foo\r" loaded, saved, and came back as "foo").
  m = error_of([] { Vocab::load(temp_file("cr.txt", "[PAD]\nfoo\r\r\n")); });
  EXPECT_NE(m.find("line 2"), std::string::npos) << m;
  m = error_of([] { Vocab({"[PAD]", std::string("a\0b", 3)}); });
  EXPECT_NE(m.find("control character"), std::string::npos) << m;
  m = error_of([] { Vocab::load(temp_file("utf8.txt", "[PAD]\n\xff\xfe\n")); });
  EXPECT_NE(m.find("invalid UTF-8"), std::string::npos) << m;
  m = error_of([] { WordPieceTokenizer::from_file(temp_file("nospecial.txt", "[PAD]\n[UNK]\nfoo\n")); });
  EXPECT_NE(m.find("[CLS]"), std::string::npos) << m;
  EXPECT_NE(m.find("nospecial.txt"), std::string::npos) << m;
}

TEST(WordPiece, VocabularyBuilderLearnsPiecesThatTokenizeTheCorpus) {
  const std::vector<std::string> texts{"the running dog runs", "a dog is running", "runs and running and run",
                                       "the dogs run"};
  VocabLearnOptions o;
  o.vocab_size = 60;
  o.min_frequency = 2;
  const Vocab v = learn_wordpiece_vocab(texts, o);
  EXPECT_LE(v.size(), 60);
  EXPECT_EQ(v.token(0), "[PAD]");
  EXPECT_EQ(v.token(4), "[MASK]");
  EXPECT_TRUE(v.contains("##n"));
  EXPECT_TRUE(v.contains("running") || v.contains("runn")) << "frequent words become pieces";
  EXPECT_EQ(learn_wordpiece_vocab(texts, o).tokens(), v.tokens()) << "deterministic";
  const WordPieceTokenizer tok(v);
  for (const auto& t : texts)
    for (const auto& p : tok.tokenize(t)) EXPECT_NE(p, "[UNK]") << t;  // every character is in the alphabet
  // Round trip through a file.
  const std::string path = temp_file("learned.txt", "");
  v.save(path);
  EXPECT_EQ(Vocab::load(path).tokens(), v.tokens());
  EXPECT_NE(error_of([] { learn_wordpiece_vocab({" ", ""}); }).find("no words"), std::string::npos);
  o.vocab_size = 6;
  EXPECT_NE(error_of([&] { learn_wordpiece_vocab(texts, o); }).find("cannot hold"), std::string::npos);
}
