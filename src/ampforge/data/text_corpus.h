// Text data for masked-LM training: a corpus is tokenised once (WordPiece, data/wordpiece.h) into a compact
// token file, which is then streamed as fixed-length sequences. Documents (one per line of the corpus, or
// one WordNet gloss) are assigned to the training or held-out split by index, so no text is shared.
//
// Token file (".tok", little-endian):
//   magic "AFTOKEN1" | u32 token bytes (2: uint16 ids, when vocab <= 65536; else 4: uint32) | u32 vocab size
//   | u64 documents | u64 tokens | u64 offsets[documents + 1] (the index: document d is tokens
//   [offsets[d], offsets[d + 1])) | the tokens
// Reading validates the sizes, the index and every id (< vocab size), naming the file.
//
// Sequences (TextSequenceDataset): the split's documents are concatenated in order and cut into chunks of
// seq_len - 2 tokens, each framed [CLS] chunk [SEP] (the last one padded with [PAD]): seq_len tokens per
// example, as DLE's phase-1 pre-training packs text. The data set's examples are those ids as floats (exact:
// ids < 2^24) of shape (seq_len); num_classes() is the vocabulary size (the model's vocab, models/registry.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampforge/data/dataset.h"
#include "ampforge/data/wordpiece.h"

namespace ampforge::data {

class TokenFile {
 public:
  // Tokenises every document (no framing) and writes the token file. Throws InvalidArgument for an empty corpus
  // (no documents or no tokens), Io when the file cannot be written.
  static void write(const std::string& path, const std::vector<std::string>& documents, const WordPieceTokenizer& tok);
  // Reads and validates a token file (errors name the file, and the offending id and vocabulary size).
  static TokenFile read(const std::string& path);
  // From ids already in memory (offsets: documents + 1 entries). Throws for an id >= vocab_size.
  TokenFile(std::vector<uint32_t> tokens, std::vector<uint64_t> offsets, int64_t vocab_size);
  TokenFile() = default;

  int64_t documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t vocab_size() const { return vocab_; }
  const std::vector<uint32_t>& ids() const { return tokens_; }
  const std::vector<uint64_t>& offsets() const { return offsets_; }

 private:
  std::vector<uint32_t> tokens_;
  std::vector<uint64_t> offsets_{0};
  int64_t vocab_ = 0;
};

// Where Debian's wordnet-base installs its data files (data.noun, data.verb, data.adj, data.adv).
inline constexpr const char* kDefaultWordNetDir = "/usr/share/wordnet";
// The glosses (definitions and quoted examples) of WordNet's synsets, one document each, in file order
// (noun, verb, adj, adv). Throws Io naming the directory when the data files are missing (install wordnet-base).
std::vector<std::string> read_wordnet_glosses(const std::string& dir = kDefaultWordNetDir);
// A plain-text corpus: one document per non-empty line. Throws Io when unreadable, InvalidArgument when empty.
std::vector<std::string> read_text_lines(const std::string& path);

struct TextSplitOptions {
  int64_t seq_len = 128;        // tokens per example, [CLS] and [SEP] included (>= 3)
  int64_t held_out_every = 20;  // document d is held out when d % held_out_every == 0 (5%); 0: none held out
};

// Fixed-length sequences of one split of a token file (see the file comment).
class TextSequenceDataset final : public Dataset {
 public:
  // train: the documents not held out; otherwise the held-out ones. Throws InvalidArgument when the split is
  // empty or seq_len < 3.
  TextSequenceDataset(std::shared_ptr<const TokenFile> tokens, bool train, const TextSplitOptions& opt,
                      int64_t cls_id, int64_t sep_id, int64_t pad_id, std::string name = "text");
  int64_t size() const override { return static_cast<int64_t>(starts_.size()); }
  Shape example_shape() const override { return Shape{seq_len_}; }
  int64_t num_classes() const override { return vocab_; }
  using Dataset::get;
  void get(int64_t i, float* dst) const override;
  int64_t label(int64_t) const override { return 0; }
  std::string name() const override { return name_; }
  // The split's token stream (for the unigram statistics of the masked-LM task).
  const std::vector<uint32_t>& stream() const { return stream_; }

 private:
  std::vector<uint32_t> stream_;  // the split's documents concatenated
  std::vector<int64_t> starts_;   // chunk starts in stream_
  int64_t seq_len_, vocab_, cls_, sep_, pad_;
  std::string name_;
};

// Random token sequences for benchmarks: [CLS], seq_len - 2 ids uniform in [first_id, vocab) from Philox of
// (seed, example), [SEP]. No padding.
class SyntheticTokenDataset final : public Dataset {
 public:
  SyntheticTokenDataset(int64_t size, int64_t seq_len, int64_t vocab, uint64_t seed, int64_t cls_id = 2,
                        int64_t sep_id = 3, int64_t first_id = 5);
  int64_t size() const override { return n_; }
  Shape example_shape() const override { return Shape{seq_len_}; }
  int64_t num_classes() const override { return vocab_; }
  using Dataset::get;
  void get(int64_t i, float* dst) const override;
  int64_t label(int64_t) const override { return 0; }
  std::string name() const override { return "synthetic-text"; }

 private:
  int64_t n_, seq_len_, vocab_;
  uint64_t seed_;
  int64_t cls_, sep_, first_;
};

}  // namespace ampforge::data
