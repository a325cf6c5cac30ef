// Token files, corpus readers and the fixed-length sequence data sets (see text_corpus.h).
#include "ampforge/data/text_corpus.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ampforge/core/generator.h"
#include "ampforge/util/error.h"

namespace ampforge::data {

namespace {

constexpr char kMagic[8] = {'A', 'F', 'T', 'O', 'K', 'E', 'N', '1'};

template <class T>
void put(std::ofstream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <class T>
T get_value(std::ifstream& in, const std::string& path, const char* what) {
  T v{};
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  if (!in) AF_THROW(InvalidArgument, "token file '{}' is truncated (reading {}); re-create it", path, what);
  return v;
}

}  // namespace

TokenFile::TokenFile(std::vector<uint32_t> tokens, std::vector<uint64_t> offsets, int64_t vocab_size)
    : tokens_(std::move(tokens)), offsets_(std::move(offsets)), vocab_(vocab_size) {
  AF_CHECK(vocab_ > 0 && vocab_ <= (int64_t{1} << 24), "token file: vocabulary size {} must be in [1, 2^24] (ids "
           "travel as exact floats)", vocab_);
  AF_CHECK(!offsets_.empty() && offsets_.front() == 0 && offsets_.back() == tokens_.size(),
           "token file: the index must start at 0 and end at the token count {}", tokens_.size());
  for (size_t d = 0; d + 1 < offsets_.size(); ++d)
    AF_CHECK(offsets_[d] <= offsets_[d + 1], "token file: the index decreases at document {}", d);
  for (size_t i = 0; i < tokens_.size(); ++i)
    AF_CHECK(tokens_[i] < static_cast<uint64_t>(vocab_), "token file: token {} has id {}, outside the vocabulary of "
             "{} (was the file made with another vocab.txt?)", i, tokens_[i], vocab_);
}

void TokenFile::write(const std::string& path, const std::vector<std::string>& documents, const WordPieceTokenizer& tok) {
  AF_CHECK(!documents.empty(), "text corpus: no documents to tokenise (the corpus is empty)");
  std::vector<uint32_t> ids;
  std::vector<uint64_t> offsets{0};
  for (const std::string& d : documents) {
    for (int64_t id : tok.token_ids(d)) ids.push_back(static_cast<uint32_t>(id));
    offsets.push_back(ids.size());
  }
  AF_CHECK(!ids.empty(), "text corpus: {} documents but no tokens (the corpus is empty)", documents.size());
  const int64_t vocab = tok.vocab().size();
  const TokenFile check(ids, offsets, vocab);  // the same validation as reading
  const uint32_t width = vocab <= 65536 ? 2 : 4;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) AF_THROW(Io, "cannot write the token file '{}'", tmp);
    out.write(kMagic, sizeof kMagic);
    put<uint32_t>(out, width);
    put<uint32_t>(out, static_cast<uint32_t>(vocab));
    put<uint64_t>(out, documents.size());
    put<uint64_t>(out, ids.size());
    for (uint64_t o : offsets) put<uint64_t>(out, o);
    if (width == 2) {
      std::vector<uint16_t> narrow(ids.begin(), ids.end());
      out.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    } else {
      out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
    }
    if (!out) AF_THROW(Io, "writing the token file '{}' failed", tmp);
  }
  std::filesystem::rename(tmp, path);  // atomic: a reader never sees half a file
}

TokenFile TokenFile::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) AF_THROW(Io, "cannot read the token file '{}'", path);
  char magic[8];
  in.read(magic, sizeof magic);
  AF_CHECK(in && std::memcmp(magic, kMagic, sizeof magic) == 0, "'{}' is not an ampforge token file (expected the "
           "magic AFTOKEN1)", path);
  const auto width = get_value<uint32_t>(in, path, "the token width");
  const auto vocab = get_value<uint32_t>(in, path, "the vocabulary size");
  const auto docs = get_value<uint64_t>(in, path, "the document count");
  const auto n = get_value<uint64_t>(in, path, "the token count");
  AF_CHECK(width == 2 || width == 4, "token file '{}': token width {} (expected 2 or 4)", path, width);
  const auto size = std::filesystem::file_size(path);
  const uint64_t expect = sizeof magic + 4 + 4 + 8 + 8 + (docs + 1) * 8 + n * width;
  AF_CHECK(docs < (uint64_t{1} << 40) && n < (uint64_t{1} << 40) && size == expect,
           "token file '{}' has {} bytes, its header says {} (truncated or corrupt; re-create it)", path, size, expect);
  std::vector<uint64_t> offsets(docs + 1);
  in.read(reinterpret_cast<char*>(offsets.data()), static_cast<std::streamsize>(offsets.size() * 8));
  std::vector<uint32_t> ids(n);
  if (width == 2) {
    std::vector<uint16_t> narrow(n);
    in.read(reinterpret_cast<char*>(narrow.data()), static_cast<std::streamsize>(n * 2));
    ids.assign(narrow.begin(), narrow.end());
  } else {
    in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(n * 4));
  }
  if (!in) AF_THROW(Io, "reading the token file '{}' failed", path);
  try {
    return TokenFile(std::move(ids), std::move(offsets), vocab);
  } catch (const Error& e) {
    AF_THROW(InvalidArgument, "token file '{}': {}", path, e.what());
  }
}

std::vector<std::string> read_wordnet_glosses(const std::string& dir) {
  std::vector<std::string> docs;
  for (const char* part : {"data.noun", "data.verb", "data.adj", "data.adv"}) {
    const std::string path = dir + "/" + part;
    std::ifstream in(path);
    if (!in) AF_THROW(Io, "cannot read WordNet's {} (install Debian's wordnet-base, or pass --corpus FILE)", path);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("  ", 0) == 0) continue;  // the licence header: lines starting with two spaces
      const size_t bar = line.find(" | ");  // synset fields | gloss (definitions; "examples")
      if (bar == std::string::npos) continue;
      std::string gloss = line.substr(bar + 3);
      while (!gloss.empty() && (gloss.back() == ' ' || gloss.back() == '\r')) gloss.pop_back();
      if (!gloss.empty()) docs.push_back(std::move(gloss));
    }
  }
  AF_CHECK(!docs.empty(), "WordNet in {} has no glosses (the corpus is empty)", dir);
  return docs;
}

std::vector<std::string> read_text_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) AF_THROW(Io, "cannot read the text corpus '{}'", path);
  std::vector<std::string> docs;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) docs.push_back(std::move(line));
  }
  AF_CHECK(!docs.empty(), "the text corpus '{}' is empty (expected one document per line)", path);
  return docs;
}

TextSequenceDataset::TextSequenceDataset(std::shared_ptr<const TokenFile> tf, bool train, const TextSplitOptions& opt,
                                         int64_t cls_id, int64_t sep_id, int64_t pad_id, std::string name)
    : seq_len_(opt.seq_len), vocab_(tf->vocab_size()), cls_(cls_id), sep_(sep_id), pad_(pad_id), name_(std::move(name)) {
  AF_CHECK(seq_len_ >= 3, "text data: the sequence length must hold [CLS], a token and [SEP] (>= 3), got {}", seq_len_);
  AF_CHECK(opt.held_out_every >= 0, "text data: held_out_every must be >= 0, got {}", opt.held_out_every);
  for (int64_t id : {cls_id, sep_id, pad_id})
    AF_CHECK(id >= 0 && id < vocab_, "text data: special token id {} is outside the vocabulary of {}", id, vocab_);
  const auto& off = tf->offsets();
  for (int64_t d = 0; d < tf->documents(); ++d) {
    const bool held = opt.held_out_every > 0 && d % opt.held_out_every == 0;
    if (held == train) continue;
    stream_.insert(stream_.end(), tf->ids().begin() + static_cast<long>(off[static_cast<size_t>(d)]),
                   tf->ids().begin() + static_cast<long>(off[static_cast<size_t>(d) + 1]));
  }
  AF_CHECK(!stream_.empty(), "text data: the {} split is empty ({} documents, held out every {}th)",
           train ? "training" : "held-out", tf->documents(), opt.held_out_every);
  const int64_t body = seq_len_ - 2;
  for (int64_t s = 0; s < static_cast<int64_t>(stream_.size()); s += body) starts_.push_back(s);
}

void TextSequenceDataset::get(int64_t i, float* dst) const {
  AF_CHECK(i >= 0 && i < size(), "text data: example {} is outside [0, {})", i, size());
  const int64_t body = seq_len_ - 2, start = starts_[static_cast<size_t>(i)];
  const int64_t n = std::min<int64_t>(body, static_cast<int64_t>(stream_.size()) - start);
  dst[0] = static_cast<float>(cls_);
  for (int64_t k = 0; k < n; ++k) dst[1 + k] = static_cast<float>(stream_[static_cast<size_t>(start + k)]);
  dst[1 + n] = static_cast<float>(sep_);
  for (int64_t k = 2 + n; k < seq_len_; ++k) dst[k] = static_cast<float>(pad_);
}

SyntheticTokenDataset::SyntheticTokenDataset(int64_t size, int64_t seq_len, int64_t vocab, uint64_t seed, int64_t cls,
                                             int64_t sep, int64_t first)
    : n_(size), seq_len_(seq_len), vocab_(vocab), seed_(seed), cls_(cls), sep_(sep), first_(first) {
  AF_CHECK(size >= 1 && seq_len >= 3, "synthetic text: need size >= 1 and seq_len >= 3, got {} and {}", size, seq_len);
  AF_CHECK(first >= 0 && first < vocab && cls < vocab && sep < vocab, "synthetic text: ids must be inside the "
           "vocabulary of {}", vocab);
}

void SyntheticTokenDataset::get(int64_t i, float* dst) const {
  const auto range = static_cast<uint64_t>(vocab_ - first_);
  dst[0] = static_cast<float>(cls_);
  for (int64_t k = 1; k + 1 < seq_len_; ++k) {
    const auto w = philox4x32(seed_ ^ 0x7e47ULL, static_cast<uint64_t>(i) * static_cast<uint64_t>(seq_len_) +
                                                     static_cast<uint64_t>(k));
    dst[k] = static_cast<float>(first_ + static_cast<int64_t>(((uint64_t{w[0]} << 32) | w[1]) % range));
  }
  dst[seq_len_ - 1] = static_cast<float>(sep_);
}

}  // namespace ampforge::data
