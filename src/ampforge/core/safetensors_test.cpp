// Tests of safetensors I/O: round trips of every dtype (0-d, empty, non-contiguous), metadata, every
// corruption the loader must catch (each with an Io error naming the file and the problem), and
// atomicity (a failed save leaves the previous file intact and no temporary file behind).
#include "ampforge/core/safetensors.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ampforge/autograd/functions.h"
#include "ampforge/ops/ops.h"

using namespace ampforge;
namespace fs = std::filesystem;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("af_st_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// A file built by hand (header JSON + data), for corruption cases the writer never produces.
std::string make_file(const std::string& header_json, const std::string& data) {
  uint64_t n = header_json.size();
  std::string s(reinterpret_cast<const char*>(&n), 8);
  return s + header_json + data;
}

// Expects load to throw Io with a message containing the file name and `what`.
void expect_io_error(const std::string& p, const std::string& what) {
  try {
    load_safetensors(p);
    FAIL() << "loading " << p << " should have failed with '" << what << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "expected '" << what << "' in: " << e.what();
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = ops::contiguous(a), cb = ops::contiguous(b);
  return a.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

// Whether a temporary file of a save of `target` ("<target>.tmp.<pid>.<tid>.<n>") is left beside it.
bool temporary_left(const std::string& target) {
  const fs::path t(target);
  const std::string prefix = t.filename().string() + ".tmp";
  for (const auto& e : fs::directory_iterator(t.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}
}  // namespace

TEST_F(Safetensors, RoundTripEveryDType) {
  std::vector<std::pair<std::string, Tensor>> ts;
  Tensor base = randn({3, 4}, DType::F32);
  ts.emplace_back("f32", base);
  ts.emplace_back("f16", ops::to_dtype(base, DType::F16));
  ts.emplace_back("bf16", ops::to_dtype(base, DType::BF16));
  ts.emplace_back("f64", ops::to_dtype(base, DType::F64));
  ts.emplace_back("i32", arange(-5, 7, 1, DType::I32).reshape({2, 6}));
  ts.emplace_back("i64", arange(-(1ll << 40), (1ll << 40), 1ll << 38, DType::I64));
  ts.emplace_back("u8", arange(250, 256, 1, DType::U8));
  ts.emplace_back("bool", Tensor::from_vector<bool>({true, false, true}, Shape{3}));
  ts.emplace_back("scalar", Tensor::from_vector<double>({3.25}, Shape{}));     // 0-d
  ts.emplace_back("empty", Tensor::empty({0, 5}, DType::F16));                  // no bytes
  ts.emplace_back("empty_after", Tensor::from_vector<int64_t>({42}, Shape{1}));  // shares the empty one's offset
  const std::map<std::string, std::string> md = {{"format", "pt"}, {"note", "ünïcode \"quoted\""}};
  save_safetensors(path("a.safetensors"), ts, md);

  SafetensorsFile f = load_safetensors(path("a.safetensors"));
  ASSERT_EQ(f.tensors.size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, ts[i].first) << "load keeps the saved order";
    EXPECT_TRUE(same_bytes(f.tensors[i].second, ts[i].second)) << ts[i].first;
    EXPECT_TRUE(f.tensors[i].second.is_contiguous());
  }
  EXPECT_EQ(f.at("scalar").dim(), 0);
  EXPECT_EQ(f.at("empty").shape(), (Shape{0, 5}));
  EXPECT_EQ(f.metadata, md);
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_THROW(f.at("nope"), Error);
  EXPECT_FALSE(temporary_left(path("a.safetensors")));
}

TEST_F(Safetensors, HeaderIsStandard) {
  // The header is plain safetensors: readable by other implementations, data 8-byte aligned.
  save_safetensors(path("h.safetensors"), {{"x", Tensor::from_vector<float>({1, 2, 3}, Shape{3})}}, {{"k", "v"}});
  const std::string s = read_bytes(path("h.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, s.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto j = nlohmann::json::parse(s.substr(8, n));
  EXPECT_EQ(j["x"]["dtype"], "F32");
  EXPECT_EQ(j["x"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(j["x"]["data_offsets"], nlohmann::json::array({0, 12}));
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  EXPECT_EQ(s.size(), 8 + n + 12);
  float v[3];
  std::memcpy(v, s.data() + 8 + n, 12);
  EXPECT_EQ(v[2], 3.0f);
}

TEST_F(Safetensors, NonContiguousIsWrittenContiguously) {
  Tensor x = arange(0, 24, 1, DType::F32).reshape({2, 3, 4});
  Tensor p = ops::permute(x, {2, 0, 1});                 // transposed view
  Tensor s = ops::slice(x, 2, 1, 4, 2);                  // strided view
  Tensor cl = ops::contiguous(randn({2, 3, 2, 2}), MemoryFormat::ChannelsLast);
  ASSERT_FALSE(p.is_contiguous());
  ASSERT_FALSE(s.is_contiguous());
  save_safetensors(path("v.safetensors"), {{"p", p}, {"s", s}, {"cl", cl}});
  SafetensorsFile f = load_safetensors(path("v.safetensors"));
  EXPECT_EQ(f.at("p").tolist<float>(), p.tolist<float>());
  EXPECT_EQ(f.at("s").tolist<float>(), s.tolist<float>());
  EXPECT_EQ(f.at("s").tolist<float>(), (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
  EXPECT_EQ(f.at("cl").tolist<float>(), cl.tolist<float>());
}

TEST_F(Safetensors, RejectsBadArguments) {
  float buf[2] = {1, 2};
  Tensor gpu = Tensor::from_blob(buf, {2}, DType::F32, Device::parse("cuda:0"));
  try {
    save_safetensors(path("g.safetensors"), {{"w", gpu}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only CPU tensors"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path("g.safetensors")));
  Tensor a = zeros({1});
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"a", a}, {"a", a}}), Error);
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"__metadata__", a}}), Error);
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {{"u", Tensor()}}), Error);
  EXPECT_TRUE(fs::is_empty(dir_)) << "argument errors must not leave files behind";
}

TEST_F(Safetensors, MissingFile) { expect_io_error(path("nope.safetensors"), "no such file"); }

TEST_F(Safetensors, TruncatedFiles) {
  save_safetensors(path("t.safetensors"), {{"a", randn({4, 4})}, {"b", arange(0, 10, 1, DType::I64)}});
  const std::string good = read_bytes(path("t.safetensors"));
  uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  write_bytes(path("t4.safetensors"), good.substr(0, 4));
  expect_io_error(path("t4.safetensors"), "shorter than the 8-byte header length");
  write_bytes(path("th.safetensors"), good.substr(0, 8 + hlen / 2));
  expect_io_error(path("th.safetensors"), "beyond the end of the file");
  write_bytes(path("td.safetensors"), good.substr(0, good.size() - 1));
  expect_io_error(path("td.safetensors"), "truncated: tensor 'b'");
  write_bytes(path("te.safetensors"), good.substr(0, 8 + hlen));
  expect_io_error(path("te.safetensors"), "truncated: tensor 'a'");
  write_bytes(path("tx.safetensors"), good + "xx");
  expect_io_error(path("tx.safetensors"), "unexpected bytes after the last tensor");
}

TEST_F(Safetensors, CorruptHeaderLength) {
  save_safetensors(path("c.safetensors"), {{"a", randn({2})}});
  std::string s = read_bytes(path("c.safetensors"));
  s[7] = '\x01';  // 2^56 + n: absurd
  write_bytes(path("c1.safetensors"), s);
  expect_io_error(path("c1.safetensors"), "absurd");
  s = read_bytes(path("c.safetensors"));
  uint64_t big = 50ull * 1000 * 1000;  // under the limit but beyond the file
  std::memcpy(s.data(), &big, 8);
  write_bytes(path("c2.safetensors"), s);
  expect_io_error(path("c2.safetensors"), "beyond the end of the file");
}

TEST_F(Safetensors, FlippedHeaderBytes) {
  // Flip each byte of the JSON header in turn: every variant must either throw Io or (only possible when
  // the flip lands inside a tensor name or a metadata string) load the very same tensor bytes. None may
  // crash or return different data silently.
  save_safetensors(path("f.safetensors"), {{"ab", randn({2, 3})}, {"cd", arange(0, 3, 1, DType::I32)}}, {{"k", "v"}});
  const std::string good = read_bytes(path("f.safetensors"));
  uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  const SafetensorsFile ref = load_safetensors(path("f.safetensors"));
  int errors = 0, loaded = 0;
  for (uint64_t i = 8; i < 8 + hlen; ++i) {
    std::string s = good;
    s[i] = static_cast<char>(s[i] ^ 0x5a);
    write_bytes(path("x.safetensors"), s);
    try {
      SafetensorsFile f = load_safetensors(path("x.safetensors"));
      ++loaded;
      // A flip can only survive validation where it changes a name or a metadata string.
      ASSERT_EQ(f.tensors.size(), ref.tensors.size()) << "flip at byte " << i;
      for (size_t k = 0; k < f.tensors.size(); ++k)
        EXPECT_TRUE(same_bytes(f.tensors[k].second, ref.tensors[k].second)) << "flip at byte " << i;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io) << "flip at byte " << i << ": " << e.what();
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
  EXPECT_LT(loaded, static_cast<int>(hlen) / 2) << "most flips break the JSON or the offsets";
}

TEST_F(Safetensors, EachHeaderProblemIsNamed) {
  const std::string d8(8, '\0');
  struct Bad {
    std::string header, data, what;
  };
  const std::vector<Bad> cases = {
      {"{not json", "", "not valid JSON"},
      {"[1, 2]", "", "not a JSON object"},
      {R"({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", "\0\0", "unknown dtype 'F8_E4M3'"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", d8, "needs 12 bytes"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", d8, "end before begin"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       d8, "overlap"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", d8, "hole in the data"},
      {R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", d8, "truncated: tensor 'a'"},
      {R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", d8, "not a size"},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 8]}})", d8, "no 'shape'"},
      {R"({"a": {"dtype": "F32", "shape": [2]}})", d8, "no 'data_offsets'"},
      {R"({"a": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})", "\x01\x07", "holds byte 7"},
      {R"({"a": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", d8, "absurd shape"},
      {R"({"__metadata__": {"k": 3}})", "", "not a string"},
  };
  int i = 0;
  for (const Bad& b : cases) {
    const std::string p = path(fmt::format("bad{}.safetensors", i++));
    write_bytes(p, make_file(b.header, b.data));
    expect_io_error(p, b.what);
  }
}

TEST_F(Safetensors, FailedSaveLeavesOldFileIntact) {
  const std::string p = path("ckpt.safetensors");
  Tensor old = randn({8});
  save_safetensors(p, {{"w", old}}, {{"step", "1"}});
  const std::string before = read_bytes(p);

  // 1) A write that fails half way: cap the file size below what the new file needs (RLIMIT_FSIZE; with
  //    SIGXFSZ ignored, write() returns EFBIG), as a full disk would.
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto prev_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  std::string msg;
  try {
    save_safetensors(p, {{"w", randn({1 << 16})}}, {{"step", "2"}});  // 256 KiB of data
  } catch (const Error& e) {
    threw = true;
    msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Io);
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, prev_handler);
  EXPECT_TRUE(threw);
  EXPECT_NE(msg.find("writing"), std::string::npos) << msg;
  EXPECT_EQ(read_bytes(p), before) << "the old file must be untouched";
  EXPECT_FALSE(temporary_left(p)) << "the temporary file must be removed";
  EXPECT_EQ(load_safetensors(p).metadata.at("step"), "1");

  // 2) A failing rename: the target is a non-empty directory.
  const std::string d = path("is_a_dir");
  fs::create_directories(fs::path(d) / "child");
  EXPECT_THROW(save_safetensors(d, {{"w", old}}), Error);
  EXPECT_TRUE(fs::is_directory(d));
  EXPECT_FALSE(temporary_left(d));

  // 3) A directory that does not exist: nothing is created anywhere.
  EXPECT_THROW(save_safetensors(path("no/such/dir/x.safetensors"), {{"w", old}}), Error);

  // 4) Two threads saving the same path at once: each uses its own temporary file, both succeed, and
  //    the file holds one of the two complete saves.
  {
    std::vector<std::thread> savers;
    std::atomic<int> failures{0};
    for (int t = 0; t < 2; ++t)
      savers.emplace_back([&, t] {
        try {
          for (int i = 0; i < 20; ++i) save_safetensors(p, {{"w", ops::mul_scalar(old, 10.0 + t)}}, {{"step", "9"}});
        } catch (const Error&) {
          failures.fetch_add(1);
        }
      });
    for (auto& th : savers) th.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(load_safetensors(p).metadata.at("step"), "9");
    EXPECT_FALSE(temporary_left(p));
  }

  // 5) A successful save replaces the file as a whole.
  save_safetensors(p, {{"w", ops::mul_scalar(old, 2.0)}}, {{"step", "3"}});
  SafetensorsFile f = load_safetensors(p);
  EXPECT_EQ(f.metadata.at("step"), "3");
  EXPECT_EQ(f.at("w").tolist<float>()[0], 2.0f * old.tolist<float>()[0]);
}
