// BERT's WordPiece tokenizer (Devlin et al. 2018; the rules of Google's tokenization.py / Hugging Face's
// BertTokenizer, re-implemented from their description), reading a standard `vocab.txt` (one token per line,
// the line number is the id), and a vocabulary builder for users without one.
//
// Basic tokenizer, per text: drop U+0000, U+FFFD, control, format and private-use characters (Unicode Cc/Cf/Co except
// \t \n \r, which are whitespace), map whitespace (Zs, Zl, Zp, \t \n \r) to spaces, put spaces around CJK
// ideographs, split on spaces;
// for an uncased vocabulary lower-case each word and strip accents (NFD, then drop combining marks Mn); split
// every punctuation character (Unicode P* and the ASCII symbols !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~) into its own
// word. WordPiece, per word: greedy longest match first from the left, continuation pieces prefixed "##";
// a word longer than max_input_chars_per_word (100) or with any part unmatched becomes one [UNK].
// Unicode facts come from a generated table (data/wordpiece_unicode.inc, scripts/gen_unicode_tables.py).
// Checked against Hugging Face's tokenizers (BertWordPieceTokenizer = transformers' BertTokenizerFast) on every code
// point and on all of WordNet's glosses (wordpiece_test.cpp); where it and transformers' Python tokenizer disagree,
// the golden (scripts/gen_wordpiece_golden.py) says which one this follows and why. In short: like tokenizers,
// lower-casing is per character (no final-sigma rule: Σ at a word's end becomes σ), unassigned code points are
// kept, and special tokens spelled in the text ("[MASK]") are text (tokenizers' encode_special_tokens = True);
// like BERT's Python tokenizer, the categories are Unicode 14's (tokenizers' tables predate Unicode 10) and the
// CJK blocks start at U+2B820 (tokenizers: U+2B920).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ampforge::data {

// Token <-> id. Ids are line numbers of vocab.txt (0-based); tokens are unique.
class Vocab {
 public:
  Vocab() = default;
  // Throws InvalidArgument naming the duplicate / empty token and its line.
  explicit Vocab(std::vector<std::string> tokens);
  // Reads vocab.txt (UTF-8, one token per line, '\r' stripped). Throws Io when unreadable, InvalidArgument
  // when empty, malformed (an empty line, a token with spaces, invalid UTF-8) or with a duplicate; the
  // message names the file and line.
  static Vocab load(const std::string& path);
  void save(const std::string& path) const;  // one token per line; throws Io naming the file

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t id(const std::string& token) const;  // -1 when absent
  bool contains(const std::string& token) const { return id(token) >= 0; }
  const std::string& token(int64_t id) const;  // throws InvalidArgument when out of range
  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
};

struct WordPieceOptions {
  bool lower_case = true;  // uncased vocabulary: lower-case and strip accents
  bool tokenize_chinese_chars = true;
  int64_t max_input_chars_per_word = 100;
  std::string unk = "[UNK]", cls = "[CLS]", sep = "[SEP]", pad = "[PAD]", mask = "[MASK]";
};

// One framed sequence: [CLS] pieces [SEP], truncated to max_length and padded with [PAD] to pad_to.
struct Encoding {
  std::vector<int64_t> ids;
  std::vector<int64_t> attention_mask;  // 1 for real tokens (including [CLS] and [SEP]), 0 for padding
};

class WordPieceTokenizer {
 public:
  // Throws InvalidArgument when a special token (unk, cls, sep, pad, mask) is missing from the vocabulary.
  explicit WordPieceTokenizer(Vocab vocab, WordPieceOptions opt = {});
  // Vocab::load(path), then the constructor (errors name the file).
  static WordPieceTokenizer from_file(const std::string& path, WordPieceOptions opt = {});

  // The basic tokenizer's words (UTF-8). Invalid UTF-8 bytes are dropped like control characters.
  std::vector<std::string> basic_tokenize(const std::string& text) const;
  // WordPiece pieces of one basic word.
  std::vector<std::string> wordpiece(const std::string& word) const;
  std::vector<std::string> tokenize(const std::string& text) const;  // basic, then WordPiece
  std::vector<int64_t> token_ids(const std::string& text) const;     // tokenize's ids, no framing
  // [CLS] ids [SEP] (ids truncated so the whole fits max_length >= 2), then padding to pad_to (0: none).
  Encoding encode(const std::string& text, int64_t max_length = 512, int64_t pad_to = 0) const;

  const Vocab& vocab() const { return vocab_; }
  const WordPieceOptions& options() const { return opt_; }
  int64_t unk_id() const { return unk_; }
  int64_t cls_id() const { return cls_; }
  int64_t sep_id() const { return sep_; }
  int64_t pad_id() const { return pad_; }
  int64_t mask_id() const { return mask_; }

 private:
  Vocab vocab_;
  WordPieceOptions opt_;
  int64_t unk_, cls_, sep_, pad_, mask_;
};

struct VocabLearnOptions {
  int64_t vocab_size = 8192;  // including the special tokens and the alphabet
  int64_t min_frequency = 2;  // pairs seen fewer times are never merged
  bool lower_case = true;
  int64_t max_input_chars_per_word = 100;  // longer words are skipped (they become [UNK])
};

// Learns a WordPiece vocabulary from texts: the basic tokenizer's words are split into characters
// (continuations "##c"), then the most frequent adjacent pair is merged (ties: the smaller pair of ids,
// i.e. the earlier-created symbols) until vocab_size or no pair reaches min_frequency — the BPE-style
// training Hugging Face's WordPieceTrainer uses. Result: [PAD] [UNK] [CLS] [SEP] [MASK], the alphabet by
// frequency, then the merges in order. Deterministic. Throws InvalidArgument when the texts have no words or
// vocab_size cannot hold the special tokens and the alphabet.
Vocab learn_wordpiece_vocab(const std::vector<std::string>& texts, const VocabLearnOptions& opt = {});

}  // namespace ampforge::data
