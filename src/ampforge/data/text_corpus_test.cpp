// Text corpora (unit): token files round-trip and are validated, splits share no document, sequences are
// framed and fixed-length, WordNet is read when installed, errors name the problem.
#include "ampforge/data/text_corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "ampforge/util/error.h"

using namespace ampforge;
using namespace ampforge::data;

namespace {

const std::string kVocab = std::string(AMPFORGE_TEST_DATA_DIR) + "/text/wordpiece_vocab.txt";

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ampforge_text_" + name)).string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TextCorpus, TokenFileRoundTripAndValidation) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kVocab);
  const std::vector<std::string> docs{"hello world", "the quick brown fox", "it is not", "hello"};
  const std::string path = temp_path("rt.tok");
  TokenFile::write(path, docs, tok);
  const TokenFile f = TokenFile::read(path);
  EXPECT_EQ(f.documents(), 4);
  EXPECT_EQ(f.vocab_size(), tok.vocab().size());
  EXPECT_EQ(f.offsets(), (std::vector<uint64_t>{0, 2, 6, 9, 10}));
  EXPECT_EQ(f.ids()[0], static_cast<uint32_t>(tok.vocab().id("hello")));
  // uint16 storage for a small vocabulary: header 32 bytes + index 5 x 8 + 10 tokens x 2.
  EXPECT_EQ(std::filesystem::file_size(path), 32u + 40u + 20u);

  // Corrupt files: truncated, wrong magic, an id outside the vocabulary.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(temp_path("trunc.tok"), std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  EXPECT_NE(error_of([&] { TokenFile::read(temp_path("trunc.tok")); }).find("truncated or corrupt"), std::string::npos);
  std::ofstream(temp_path("magic.tok"), std::ios::binary) << "NOTATOKENFILE___________________________";
  EXPECT_NE(error_of([&] { TokenFile::read(temp_path("magic.tok")); }).find("not an ampforge token file"),
            std::string::npos);
  std::string bad = bytes;
  bad[bad.size() - 2] = '\xff', bad[bad.size() - 1] = '\x7f';  // last id 32767 >= vocab
  std::ofstream(temp_path("id.tok"), std::ios::binary) << bad;
  const std::string e = error_of([&] { TokenFile::read(temp_path("id.tok")); });
  EXPECT_NE(e.find("outside the vocabulary"), std::string::npos) << e;
  EXPECT_NE(e.find("id.tok"), std::string::npos) << e;
}

TEST(TextCorpus, EmptyCorporaAreErrors) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kVocab);
  EXPECT_NE(error_of([&] { TokenFile::write(temp_path("e.tok"), {}, tok); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { TokenFile::write(temp_path("e.tok"), {" ", "\t"}, tok); }).find("empty"), std::string::npos);
  std::ofstream(temp_path("blank.txt")) << "\n  \n";
  EXPECT_NE(error_of([&] { read_text_lines(temp_path("blank.txt")); }).find("is empty"), std::string::npos);
  EXPECT_NE(error_of([] { read_text_lines("/nonexistent/corpus.txt"); }).find("/nonexistent/corpus.txt"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_wordnet_glosses("/nonexistent"); }).find("wordnet-base"), std::string::npos);
}

TEST(TextCorpus, SplitsAreDisjointAndSequencesFramed) {
  // 40 documents of 3 ids each; ids encode the document, so the splits' streams show where they came from.
  std::vector<uint32_t> ids;
  std::vector<uint64_t> off{0};
  for (uint32_t d = 0; d < 40; ++d) {
    for (uint32_t k = 0; k < 3; ++k) ids.push_back(10 + d);
    off.push_back(ids.size());
  }
  auto tf = std::make_shared<const TokenFile>(ids, off, 100);
  TextSplitOptions o;
  o.seq_len = 8;  // 6 tokens per sequence
  o.held_out_every = 10;
  const TextSequenceDataset train(tf, true, o, 2, 3, 0), held(tf, false, o, 2, 3, 0);
  EXPECT_EQ(held.stream().size(), 12u);  // documents 0, 10, 20, 30
  EXPECT_EQ(train.stream().size(), 108u);
  std::set<uint32_t> a(train.stream().begin(), train.stream().end()), b(held.stream().begin(), held.stream().end());
  for (uint32_t x : b) EXPECT_FALSE(a.count(x)) << "document of id " << x << " is in both splits";
  EXPECT_EQ(train.size(), 18);
  EXPECT_EQ(train.example_shape(), (Shape{8}));
  EXPECT_EQ(train.num_classes(), 100);
  std::vector<float> x(8);
  train.get(0, x.data());
  EXPECT_EQ(x, (std::vector<float>{2, 11, 11, 11, 12, 12, 12, 3}));
  held.get(1, x.data());  // documents 0, 10, 20, 30: 12 ids, two chunks of 6
  EXPECT_EQ(x, (std::vector<float>{2, 30, 30, 30, 40, 40, 40, 3}));
  o.seq_len = 10;  // 8 per sequence: the second chunk has 4 ids and padding
  const TextSequenceDataset h2(tf, false, o, 2, 3, 0);
  std::vector<float> y(10);
  h2.get(1, y.data());
  EXPECT_EQ(y, (std::vector<float>{2, 30, 40, 40, 40, 3, 0, 0, 0, 0}));
  o.seq_len = 2;
  EXPECT_NE(error_of([&] { TextSequenceDataset(tf, true, o, 2, 3, 0); }).find(">= 3"), std::string::npos);
  o.seq_len = 8;
  o.held_out_every = 1;  // everything held out: an empty training split
  EXPECT_NE(error_of([&] { TextSequenceDataset(tf, true, o, 2, 3, 0); }).find("split is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { TokenFile({5, 200}, {0, 2}, 100); }).find("outside the vocabulary"), std::string::npos);
}

TEST(TextCorpus, SyntheticTokensAreDeterministicAndInRange) {
  const SyntheticTokenDataset d(4, 16, 50, 7);
  std::vector<float> a(16), b(16);
  d.get(2, a.data());
  d.get(2, b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.front(), 2.0f);
  EXPECT_EQ(a.back(), 3.0f);
  for (int k = 1; k < 15; ++k) EXPECT_TRUE(a[k] >= 5 && a[k] < 50) << a[k];
}

TEST(TextCorpus, WordNetGlosses) {
  ASSERT_TRUE(std::filesystem::exists(std::string(kDefaultWordNetDir) + "/data.noun"))
      << "Debian's wordnet-base is not installed (scripts/setup installs it)";
  const std::vector<std::string> g = read_wordnet_glosses();
  EXPECT_GT(g.size(), 100000u);  // 117,659 synsets in WordNet 3.0
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(g[i].find(" | "), std::string::npos);
}
