// `ampforge train --model bert-tiny --dataset text` as a user runs it: a corpus file, a learned vocabulary
// cached in --text-cache's stand-in (AMPFORGE_CACHE_DIR), the masked-LM metrics and the unigram bound in --json,
// and the errors for a missing corpus, a missing vocabulary and a sequence longer than the position table.
#include <gtest/gtest.h>

#include "ampforge/cli/cli_test_util.h"
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {
using ampforge::cli::testing::CmdResult;

fs::path dir() { return ampforge::cli::testing::scratch_dir("ampforge_bert_cli_"); }

CmdResult run(const std::string& args) {
  return ampforge::cli::testing::run_ampforge(args, true, "AMPFORGE_CACHE_DIR=" + (dir() / "cache").string());
}

std::string corpus() {
  const fs::path p = dir() / "corpus.txt";
  std::ofstream out(p);
  for (int i = 0; i < 60; ++i)
    out << "the quick brown fox jumps over the lazy dog number " << i % 7 << " and the cat sleeps\n";
  return p.string();
}
}  // namespace

TEST(TrainBertCli, TinyRunOnACorpusFileReportsMaskedMetrics) {
  const std::string base = "train --model bert-tiny --dataset text --corpus " + corpus() +
                           " --vocab-size 80 --seq-len 24 --batch 4 --epochs 1 --max-steps 4 --threads 2 "
                           "--no-progress --json";
  const CmdResult r = run(base);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("vocab: learned"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  EXPECT_EQ(j.at("task"), "masked_lm");
  EXPECT_EQ(j.at("steps"), 4);
  for (const char* k : {"masked_loss", "masked_accuracy", "perplexity", "unigram_cross_entropy"})
    EXPECT_TRUE(j.at("eval").contains(k)) << k << " in " << j.at("eval").dump();
  EXPECT_EQ(j.at("primary_metric"), "masked_accuracy");
  // The second run reuses the cached vocabulary and token file.
  const CmdResult again = run(base);
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(again.out.find("vocab: learned"), std::string::npos) << again.out;
}

TEST(TrainBertCli, BadInputsAreUsageErrors) {
  CmdResult r = run("train --model bert-tiny --dataset text --corpus /nonexistent/c.txt --no-progress");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/c.txt"), std::string::npos) << r.out;
  r = run("train --model bert-tiny --dataset text --corpus " + corpus() + " --vocab /nonexistent/vocab.txt");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/vocab.txt"), std::string::npos) << r.out;
  r = run("train --model bert-tiny --dataset text --corpus " + corpus() + " --seq-len 513");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("position table"), std::string::npos) << r.out;
  r = run("train --model bert-tiny --dataset fashion-mnist");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("masked language model"), std::string::npos) << r.out;
}
