// Data sets by name: what `ampforge train --dataset NAME` (train/recipe.h) and the Python package build. A
// DatasetSpec holds plain values; make_dataset_splits turns it into a training and an evaluation split plus the
// facts a task needs from the data (class names, the meaning of token ids). C++ users with their own data set
// construct it directly and skip this file.
//
//   fashion-mnist | mnist   IDX files (Debian's dataset-fashion-mnist, or data_dir); gray 28x28, resized to
//                           image_size and repeated to `channels` when the model wants 3 (the torchvision ResNets)
//   image-folder            data_dir/train and data_dir/val (or /test), one sub-folder per class (ImageNet's
//                           layout); RGB, image_size (default 224)
//   synthetic               deterministic random images (channels x image_size², synthetic_classes classes), or
//                           random token sequences when token_ids (benchmarks)
//   detection               a YOLO-format data file (detection_data), or "fashion-mnist-detection": the set
//                           composed from Fashion-MNIST (written once into data_dir, then read back by the same
//                           reader); letterboxed to image_size (default 320), training examples augmented
//   text                    a corpus (corpus: "wordnet" or a file, one document a line) tokenised once with a
//                           given vocab.txt or a WordPiece vocabulary learned from its training split, both cached
//                           under text_cache; fixed-length sequences of seq_len ids
//
// Errors: InvalidArgument for an unknown name or values that do not fit the data (naming the flag the CLI
// exposes it as); IoError for missing or unreadable files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ampforge/data/dataset.h"

namespace ampforge::data {

struct DatasetSpec {
  std::string name = "fashion-mnist";
  std::string data_dir;                                  // "": the data set's default place
  std::string detection_data = "fashion-mnist-detection";
  int64_t image_size = 0;                                // 0: the data set's own size
  int64_t channels = 1;                                  // the model's input channels (image data)
  bool token_ids = false;                                // the model takes token ids (synthetic: token sequences)
  std::string model = "the model";                       // how messages name the model
  int64_t synthetic_size = 2048, synthetic_classes = 10;
  uint64_t seed = 0;
  // detection: the probability of a mosaic of four (training split), none from close_mosaic_epoch on
  double mosaic = 0;
  int64_t close_mosaic_epoch = 0;
  // text
  std::string corpus, vocab, text_cache;                 // text_cache "": $AMPFORGE_CACHE_DIR/text, else
                                                         // $HOME/.cache/ampforge/text
  int64_t vocab_size = 8192;                             // learned vocabulary (no vocab file)
  int64_t seq_len = 128;                                 // tokens per sequence, [CLS] and [SEP] included
  int64_t max_positions = 512;                           // the model's position table
  bool verbose = true;                                   // say on stderr what is composed, learned, tokenised
};

// What token ids mean in a token-id data set.
struct TokenVocabulary {
  int64_t size = 0;
  int64_t pad_id = 0, cls_id = 0, sep_id = 0, mask_id = 0;
  // The training split's tokens in order (owned by the split, alive as long as it is); null for synthetic data.
  const std::vector<uint32_t>* training_stream = nullptr;
};

struct DatasetSplits {
  std::shared_ptr<Dataset> train, test;
  std::vector<std::string> class_names;    // when the data names its classes (detection data file, image folders)
  std::optional<TokenVocabulary> tokens;   // token-id data only
};

// The data sets a spec names. Writes the composed detection set and the text caches on first use.
DatasetSplits make_dataset_splits(const DatasetSpec& spec);

// The names make_dataset_splits knows, in the order `--help` lists them.
const std::vector<std::string>& dataset_names();

// Whether data set `name` is read through a detection data file (DatasetSpec::detection_data) and takes the
// mosaic options.
bool uses_detection_data(const std::string& name);

}  // namespace ampforge::data
