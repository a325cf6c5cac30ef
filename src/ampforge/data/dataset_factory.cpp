#include "ampforge/data/dataset_factory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include <fmt/format.h>

#include "ampforge/data/image_folder.h"
#include "ampforge/data/resized_dataset.h"
#include "ampforge/data/text_corpus.h"
#include "ampforge/data/wordpiece.h"
#include "ampforge/data/yolo_dataset.h"
#include "ampforge/util/error.h"

namespace ampforge::data {

namespace fs = std::filesystem;

namespace {

DatasetSplits synthetic_images(const DatasetSpec& s) {
  const int64_t side = s.image_size > 0 ? s.image_size : 28;
  const Shape shape{s.channels, side, side};
  DatasetSplits d;
  d.train = std::make_shared<SyntheticDataset>(s.synthetic_size, shape, s.synthetic_classes, s.seed + 1);
  d.test = std::make_shared<SyntheticDataset>(std::max<int64_t>(s.synthetic_size / 4, 1), shape, s.synthetic_classes,
                                              s.seed + 2);
  return d;
}

DatasetSplits detection(const DatasetSpec& s) {
  AF_CHECK(s.channels == 3, "--dataset detection gives RGB images; --model {} takes {} channel(s)", s.model,
           s.channels);
  std::string data_file = s.detection_data;
  if (data_file == "fashion-mnist-detection") {
    const std::string dir = s.data_dir.empty() ? std::string("fashion-mnist-detection") : s.data_dir;
    data_file = dir + "/data.yaml";
    if (!fs::exists(data_file)) {
      if (s.verbose) std::fprintf(stderr, "composing the Fashion-MNIST detection set into %s\n", dir.c_str());
      ComposeDetectionOptions co;
      co.seed = s.seed;
      compose_fashion_mnist_detection(dir, co);
    }
  }
  const DetectionDataSpec spec = read_detection_data_file(data_file);
  DetectionDatasetOptions o;
  o.image_size = s.image_size > 0 ? s.image_size : 320;
  o.name = s.detection_data == "fashion-mnist-detection" ? s.detection_data : "detection";
  o.augment = false;
  DatasetSplits d;
  d.test = std::make_shared<YoloDetectionDataset>(spec.val, spec.names, o);
  o.augment = true;
  o.mosaic = s.mosaic;
  o.close_mosaic_epoch = s.close_mosaic_epoch;
  d.train = std::make_shared<YoloDetectionDataset>(spec.train, spec.names, o);
  d.class_names = spec.names;
  return d;
}

DatasetSplits image_folder(const DatasetSpec& s) {
  AF_CHECK(!s.data_dir.empty(),
           "--dataset image-folder needs --data-dir DIR (with DIR/train and DIR/val, one sub-folder per class)");
  const int64_t side = s.image_size > 0 ? s.image_size : 224;
  const fs::path root(s.data_dir), train_dir = root / "train";
  const fs::path eval_dir = fs::is_directory(root / "val") ? root / "val" : root / "test";
  AF_CHECK(fs::is_directory(train_dir), "--data-dir {}: no 'train' folder (expected DIR/train/<class>/<image> and "
           "DIR/val/<class>/<image>)", s.data_dir);
  AF_CHECK(fs::is_directory(eval_dir), "--data-dir {}: no 'val' (or 'test') folder for evaluation", s.data_dir);
  auto train = std::make_shared<ImageFolderDataset>(train_dir.string(), ImageFolderOptions::train_defaults(side));
  auto test = std::make_shared<ImageFolderDataset>(eval_dir.string(), ImageFolderOptions::eval_defaults(side));
  AF_CHECK(train->classes() == test->classes(), "--data-dir {}: the class folders of train ({}) and {} ({}) differ",
           s.data_dir, train->classes().size(), eval_dir.filename().string(), test->classes().size());
  AF_CHECK(s.channels == 3, "--dataset image-folder gives RGB images; --model {} takes {} channel(s)", s.model,
           s.channels);
  DatasetSplits d;
  d.class_names = train->classes();
  d.train = train;
  d.test = test;
  return d;
}

DatasetSplits idx(const DatasetSpec& s) {
  const std::string dir = !s.data_dir.empty()          ? s.data_dir
                          : s.name == "fashion-mnist" ? default_fashion_mnist_dir()
                                                      : "/usr/share/datasets/mnist";
  std::shared_ptr<Dataset> train = std::make_shared<MnistDataset>(dir, true, s.name);
  std::shared_ptr<Dataset> test = std::make_shared<MnistDataset>(dir, false, s.name);
  const int64_t native = train->example_shape()[1];
  const int64_t side = s.image_size > 0 ? s.image_size : native;
  if (side != native || s.channels != 1) {  // e.g. 3 x 32 x 32 for the torchvision ResNets
    train = std::make_shared<ResizedDataset>(train, s.channels, side);
    test = std::make_shared<ResizedDataset>(test, s.channels, side);
  }
  DatasetSplits d;
  d.train = train;
  d.test = test;
  return d;
}

DatasetSplits synthetic_tokens(const DatasetSpec& s) {
  const int64_t vocab = s.vocab.empty() ? 30522 : Vocab::load(s.vocab).size();
  DatasetSplits d;
  d.train = std::make_shared<SyntheticTokenDataset>(s.synthetic_size, s.seq_len, vocab, s.seed + 1);
  d.test = std::make_shared<SyntheticTokenDataset>(std::max<int64_t>(s.synthetic_size / 4, 1), s.seq_len, vocab,
                                                   s.seed + 2);
  TokenVocabulary t;
  t.size = vocab;
  t.pad_id = 0, t.cls_id = 2, t.sep_id = 3, t.mask_id = 4;  // SyntheticTokenDataset's ids
  d.tokens = t;
  return d;
}

std::string text_cache_dir(const DatasetSpec& s) {
  if (!s.text_cache.empty()) return s.text_cache;
  if (const char* d = std::getenv("AMPFORGE_CACHE_DIR"); d && *d) return std::string(d) + "/text";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/ampforge/text";
  return (fs::temp_directory_path() / "ampforge-text").string();
}

// The corpus' documents, its vocabulary (given, or learned from the training split once and cached) and its
// token file (cached by corpus, vocabulary and their sizes), then the two splits as fixed-length sequences.
DatasetSplits text(const DatasetSpec& s) {
  AF_CHECK(!s.corpus.empty(), "--dataset text needs --corpus wordnet|FILE");
  TextSplitOptions so;
  so.seq_len = s.seq_len;
  const bool wordnet = s.corpus == "wordnet";
  const std::vector<std::string> docs = wordnet ? read_wordnet_glosses() : read_text_lines(s.corpus);
  const std::string corpus_id = wordnet ? std::string("wordnet") : fs::path(s.corpus).filename().string();
  // A key for the cache: the corpus (name, size, document count), the vocabulary and the split rule.
  uint64_t h = std::hash<std::string>{}(wordnet ? std::string(kDefaultWordNetDir) : fs::absolute(s.corpus).string());
  h ^= docs.size() * 0x9E3779B97F4A7C15ull;
  for (const auto& d : docs) h = h * 1099511628211ull ^ std::hash<std::string>{}(d);
  const fs::path dir = fs::path(text_cache_dir(s)) / fmt::format("{}-{:016x}", corpus_id, h);
  fs::create_directories(dir);
  so.held_out_every = 20;
  std::string vocab_path = s.vocab;
  if (vocab_path.empty()) {
    vocab_path = (dir / fmt::format("vocab-{}.txt", s.vocab_size)).string();
    if (!fs::exists(vocab_path)) {
      std::vector<std::string> train_docs;
      for (size_t d = 0; d < docs.size(); ++d)
        if (d % static_cast<size_t>(so.held_out_every) != 0) train_docs.push_back(docs[d]);
      VocabLearnOptions vo;
      vo.vocab_size = s.vocab_size;
      const Vocab v = learn_wordpiece_vocab(train_docs, vo);
      v.save(vocab_path + ".tmp");
      fs::rename(vocab_path + ".tmp", vocab_path);
      if (s.verbose)
        std::fprintf(stderr, "vocab: learned %lld WordPiece tokens from the training split of %s -> %s\n",
                     static_cast<long long>(v.size()), corpus_id.c_str(), vocab_path.c_str());
    }
  }
  const WordPieceTokenizer tok = WordPieceTokenizer::from_file(vocab_path);
  const std::string tok_path =
      (dir / fmt::format("tokens-{:016x}.tok", std::hash<std::string>{}(fs::absolute(vocab_path).string()) ^
                                                   static_cast<uint64_t>(tok.vocab().size()))).string();
  if (!fs::exists(tok_path)) TokenFile::write(tok_path, docs, tok);
  auto tf = std::make_shared<const TokenFile>(TokenFile::read(tok_path));
  AF_CHECK(tf->vocab_size() == tok.vocab().size(), "token file {} was made with a vocabulary of {} tokens, --vocab has "
           "{}; delete it to re-tokenise", tok_path, tf->vocab_size(), tok.vocab().size());
  auto train = std::make_shared<TextSequenceDataset>(tf, true, so, tok.cls_id(), tok.sep_id(), tok.pad_id(),
                                                     "text:" + corpus_id);
  auto test = std::make_shared<TextSequenceDataset>(tf, false, so, tok.cls_id(), tok.sep_id(), tok.pad_id(),
                                                    "text:" + corpus_id + ":held-out");
  if (s.verbose)
    std::fprintf(stderr, "text: %s, %lld documents, %lld tokens (vocabulary %lld); %lld training and %lld held-out "
                 "sequences of %lld\n", corpus_id.c_str(), static_cast<long long>(tf->documents()),
                 static_cast<long long>(tf->tokens()), static_cast<long long>(tok.vocab().size()),
                 static_cast<long long>(train->size()), static_cast<long long>(test->size()),
                 static_cast<long long>(s.seq_len));
  TokenVocabulary t;
  t.size = tok.vocab().size();
  t.pad_id = tok.pad_id(), t.cls_id = tok.cls_id(), t.sep_id = tok.sep_id(), t.mask_id = tok.mask_id();
  t.training_stream = &train->stream();
  DatasetSplits d;
  d.tokens = t;
  d.train = train;
  d.test = test;
  return d;
}

}  // namespace

const std::vector<std::string>& dataset_names() {
  static const std::vector<std::string> names{"fashion-mnist", "mnist", "image-folder", "synthetic", "text",
                                              "detection"};
  return names;
}

bool uses_detection_data(const std::string& name) { return name == "detection"; }

DatasetSplits make_dataset_splits(const DatasetSpec& s) {
  if (s.token_ids) {
    AF_CHECK(s.seq_len <= s.max_positions, "--seq-len {} is longer than the model's position table ({} positions, "
             "max_position_embeddings)", s.seq_len, s.max_positions);
    if (s.name == "synthetic") return synthetic_tokens(s);
    if (s.name == "text") return text(s);
  } else {
    if (s.name == "synthetic") return synthetic_images(s);
    if (uses_detection_data(s.name)) return detection(s);
    if (s.name == "image-folder") return image_folder(s);
    if (s.name == "fashion-mnist" || s.name == "mnist") return idx(s);
  }
  std::string known;
  for (const std::string& n : dataset_names()) known += (known.empty() ? "" : ", ") + n;
  AF_THROW(InvalidArgument, "--dataset '{}' gives no {} data (data sets: {})", s.name,
           s.token_ids ? "token-id" : "image", known);
}

}  // namespace ampforge::data
