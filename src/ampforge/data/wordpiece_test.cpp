// WordPiece tokenizer against the reference implementation of scripts/gen_bert_golden.py (committed output
// tests/data/models/wordpiece_golden.json for tests/data/text/wordpiece_{vocab,sentences}.txt), errors for bad
// vocabularies, framing, and the vocabulary builder.
#include "ampforge/data/wordpiece.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ampforge/util/error.h"

using namespace ampforge;
using namespace ampforge::data;

namespace {

const std::string kText = std::string(AMPFORGE_TEST_DATA_DIR) + "/text";
const std::string kGolden = std::string(AMPFORGE_TEST_DATA_DIR) + "/models/wordpiece_golden.json";

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

}  // namespace

TEST(WordPiece, MatchesTheReferenceTokenizer) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(kText + "/wordpiece_vocab.txt");
  std::ifstream in(kGolden);
  ASSERT_TRUE(in) << kGolden << " (regenerate with /usr/bin/python3 scripts/gen_bert_golden.py tests/data/models)";
  const nlohmann::json g = nlohmann::json::parse(in);
  // The golden was made from the sentences file as it is now.
  std::ifstream sentences(kText + "/wordpiece_sentences.txt", std::ios::binary);
  std::vector<std::string> lines;
  for (std::string l; std::getline(sentences, l);) lines.push_back(l);
  const auto& cases = g.at("cases");
  ASSERT_EQ(cases.size(), lines.size());
  ASSERT_GE(cases.size(), 10u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i].at("text").get<std::string>();
    EXPECT_EQ(text, lines[i]);
    EXPECT_EQ(tok.basic_tokenize(text), cases[i].at("basic").get<std::vector<std::string>>()) << text;
    EXPECT_EQ(tok.tokenize(text), cases[i].at("tokens").get<std::vector<std::string>>()) << text;
    EXPECT_EQ(tok.encode(text).ids, cases[i].at("ids").get<std::vector<int64_t>>()) << text;
  }
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
