// Data sets by name (data/dataset_factory.h): what each name gives and the errors a user meets.
#include <gtest/gtest.h>

#include "ampforge/data/dataset_factory.h"
#include "ampforge/util/error.h"

using namespace ampforge;

TEST(DatasetFactory, SyntheticImagesFollowTheModel) {
  data::DatasetSpec s;
  s.name = "synthetic";
  s.channels = 3;
  s.image_size = 32;
  s.synthetic_size = 40;
  s.synthetic_classes = 7;
  const data::DatasetSplits d = data::make_dataset_splits(s);
  EXPECT_EQ(d.train->size(), 40);
  EXPECT_EQ(d.test->size(), 10);
  EXPECT_EQ(d.train->example_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(d.train->num_classes(), 7);
  EXPECT_FALSE(d.tokens.has_value());
}

TEST(DatasetFactory, SyntheticTokensSayWhatTheirIdsMean) {
  data::DatasetSpec s;
  s.name = "synthetic";
  s.token_ids = true;
  s.seq_len = 16;
  s.synthetic_size = 8;
  const data::DatasetSplits d = data::make_dataset_splits(s);
  EXPECT_EQ(d.train->example_shape(), (Shape{16}));
  ASSERT_TRUE(d.tokens.has_value());
  EXPECT_EQ(d.tokens->size, 30522);
  EXPECT_EQ(d.tokens->training_stream, nullptr);
  // [CLS] first, [SEP] last, as the ids say.
  std::vector<float> x(16);
  d.train->get(0, x.data());
  EXPECT_EQ(x.front(), static_cast<float>(d.tokens->cls_id));
  EXPECT_EQ(x.back(), static_cast<float>(d.tokens->sep_id));
  s.seq_len = 600;
  s.max_positions = 512;
  try {
    data::make_dataset_splits(s);
    FAIL() << "a sequence longer than the position table must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position table (512 positions"), std::string::npos) << e.what();
  }
}

TEST(DatasetFactory, NamesAndErrors) {
  const auto& names = data::dataset_names();
  EXPECT_EQ(names.front(), "fashion-mnist");
  EXPECT_TRUE(data::uses_detection_data("detection"));
  EXPECT_FALSE(data::uses_detection_data("mnist"));
  data::DatasetSpec s;
  s.name = "cifar10";
  try {
    data::make_dataset_splits(s);
    FAIL() << "an unknown name must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--dataset 'cifar10' gives no image data (data sets: fashion-mnist, mnist"),
              std::string::npos)
        << e.what();
  }
  s.name = "text";  // token data for an image model
  EXPECT_THROW(data::make_dataset_splits(s), Error);
  s.name = "image-folder";  // no directory
  try {
    data::make_dataset_splits(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs --data-dir"), std::string::npos) << e.what();
  }
  s = {};
  s.name = "text";
  s.token_ids = true;  // no corpus
  try {
    data::make_dataset_splits(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--corpus"), std::string::npos) << e.what();
  }
}
