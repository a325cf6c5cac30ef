// YOLOv8 (see yolo.h for the facts kept). Modules are registered in Ultralytics' order so state_dict() lists
// the same keys in the same order. Shapes in comments are for yolov8n at 640x640: (N, C, H, W).
#include "ampforge/models/yolo.h"

#include <cmath>

#include "ampforge/autograd/node.h"
#include "ampforge/nn/init.h"
#include "ampforge/ops/ops.h"

namespace ampforge::models {

using namespace ampforge::nn;

namespace {

// Ultralytics' make_divisible(x, 8): the smallest multiple of 8 that is >= x.
int64_t make_divisible8(double x) { return static_cast<int64_t>(std::ceil(x / 8.0)) * 8; }

// Layers without parameters, present so the layer indices (and hence the state-dict names) match the yaml.
class Upsample : public Module {
 public:
  Upsample() : Module("Upsample") {}
  Tensor forward(const Tensor& x) override { return upsample_nearest2d(x, 2, 2); }
};
class Concat : public Module {
 public:
  Concat() : Module("Concat") {}
};

}  // namespace

YoloOptions yolov8_scale(char scale, int64_t num_classes, int64_t in_channels) {
  YoloOptions o;
  o.num_classes = num_classes;
  o.in_channels = in_channels;
  switch (scale) {
    case 'n': o.depth = 0.33, o.width = 0.25, o.max_channels = 1024; break;
    case 's': o.depth = 0.33, o.width = 0.50, o.max_channels = 1024; break;
    case 'm': o.depth = 0.67, o.width = 0.75, o.max_channels = 768; break;
    case 'l': o.depth = 1.00, o.width = 1.00, o.max_channels = 512; break;
    case 'x': o.depth = 1.00, o.width = 1.25, o.max_channels = 512; break;
    default: AF_THROW(InvalidArgument, "yolov8: unknown scale '{}' (expected one of n, s, m, l, x)", scale);
  }
  return o;
}

// ---- Conv -------------------------------------------------------------------------------------------------
YoloConv::YoloConv(int64_t c_in, int64_t c_out, int64_t k, int64_t stride) : Module("Conv") {
  Conv2dOptions o;
  o.stride = stride;
  o.padding = k / 2;  // autopad for dilation 1
  o.bias = false;
  conv = register_module("conv", std::make_shared<Conv2d>(c_in, c_out, k, o));
  BatchNormOptions b;
  b.eps = 1e-3, b.momentum = 0.03;  // initialize_weights() sets these on every BatchNorm2d
  bn = register_module("bn", std::make_shared<BatchNorm2d>(c_out, b));
}
Tensor YoloConv::forward(const Tensor& x) { return bn->forward_act((*conv)(x), NormAct::SiLU); }

// ---- Bottleneck ---------------------------------------------------------------------------------------------
YoloBottleneck::YoloBottleneck(int64_t c_in, int64_t c_out, bool shortcut, double e)
    : Module("Bottleneck"), add(shortcut && c_in == c_out) {
  const auto hidden = static_cast<int64_t>(static_cast<double>(c_out) * e);
  cv1 = register_module("cv1", std::make_shared<YoloConv>(c_in, hidden, 3));
  cv2 = register_module("cv2", std::make_shared<YoloConv>(hidden, c_out, 3));
}
Tensor YoloBottleneck::forward(const Tensor& x) {
  Tensor y = (*cv2)((*cv1)(x));
  return add ? ampforge::add(x, y) : y;
}

// ---- C2f: cv1 -> (y0, y1); y_{k+1} = m_k(y_k); cv2(cat(y0, y1, ..., y_{n+1})) ----------------------------------
C2f::C2f(int64_t c_in, int64_t c_out, int64_t n, bool shortcut, double e)
    : Module("C2f"), c(static_cast<int64_t>(static_cast<double>(c_out) * e)) {
  AF_CHECK(n >= 1, "C2f: needs at least one bottleneck, got {}", n);
  cv1 = register_module("cv1", std::make_shared<YoloConv>(c_in, 2 * c, 1));
  cv2 = register_module("cv2", std::make_shared<YoloConv>((2 + n) * c, c_out, 1));
  m = register_module("m", std::make_shared<Sequential>());
  for (int64_t i = 0; i < n; ++i) m->push_back(std::make_shared<YoloBottleneck>(c, c, shortcut, 1.0));
}
Tensor C2f::forward(const Tensor& x) {                   // (N, c_in, H, W)
  std::vector<Tensor> y = chunk((*cv1)(x), 2, 1);        // 2 x (N, c, H, W)
  for (auto& [name, block] : m->children()) y.push_back((*block)(y.back()));
  return (*cv2)(cat(y, 1));                              // (N, (2 + n) c, H, W) -> (N, c_out, H, W)
}

// ---- SPPF ------------------------------------------------------------------------------------------------------
SPPF::SPPF(int64_t c_in, int64_t c_out, int64_t k) : Module("SPPF") {
  const int64_t hidden = c_in / 2;
  cv1 = register_module("cv1", std::make_shared<YoloConv>(c_in, hidden, 1));
  cv2 = register_module("cv2", std::make_shared<YoloConv>(hidden * 4, c_out, 1));
  m = register_module("m", std::make_shared<MaxPool2d>(k, 1, k / 2));
}
Tensor SPPF::forward(const Tensor& x) {
  Tensor y0 = (*cv1)(x);
  Tensor y1 = (*m)(y0), y2 = (*m)(y1), y3 = (*m)(y2);
  return (*cv2)(cat({y0, y1, y2, y3}, 1));
}

// ---- DFL ---------------------------------------------------------------------------------------------------------
DFL::DFL(int64_t b) : Module("DFL"), bins(b) {
  Conv2dOptions o;
  o.bias = false;
  conv = register_module("conv", std::make_shared<Conv2d>(b, 1, 1, o));
  autograd::NoGradGuard ng;
  ops::copy_(conv->weight, ops::reshape(ops::arange(0, static_cast<double>(b), 1, DType::F32), {1, b, 1, 1}));
  conv->weight.requires_grad_(false);  // frozen: requires_grad_(False) in Ultralytics
}
Tensor DFL::forward(const Tensor& x) {  // (B, 4 bins, A)
  const int64_t B = x.shape()[0], A = x.shape()[2];
  Tensor p = softmax(contiguous(transpose(reshape(x, {B, 4, bins, A}), 2, 1)), 1);  // (B, bins, 4, A)
  return reshape((*conv)(p), {B, 4, A});                                            // expected bin per side
}

// ---- Detect --------------------------------------------------------------------------------------------------------
Detect::Detect(int64_t nc, const std::vector<int64_t>& ch)
    : Module("Detect"), num_classes(nc), num_outputs(nc + 4 * kRegMax) {
  AF_CHECK(nc >= 1, "Detect: num_classes must be positive, got {}", nc);
  AF_CHECK(!ch.empty(), "Detect: needs at least one input level");
  const int64_t c2 = std::max<int64_t>({16, ch[0] / 4, 4 * kRegMax});
  const int64_t c3 = std::max<int64_t>(ch[0], std::min<int64_t>(nc, 100));
  auto cv2 = register_module("cv2", std::make_shared<Sequential>());
  auto cv3 = register_module("cv3", std::make_shared<Sequential>());
  for (int64_t x : ch) {
    auto box = std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
        std::make_shared<YoloConv>(x, c2, 3), std::make_shared<YoloConv>(c2, c2, 3),
        std::make_shared<Conv2d>(c2, 4 * kRegMax, 1)});
    cv2->push_back(box);
    box_branches.push_back(box);
  }
  for (int64_t x : ch) {
    auto cls = std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
        std::make_shared<YoloConv>(x, c3, 3), std::make_shared<YoloConv>(c3, c3, 3), std::make_shared<Conv2d>(c3, nc, 1)});
    cv3->push_back(cls);
    cls_branches.push_back(cls);
  }
  dfl = register_module("dfl", std::make_shared<DFL>(kRegMax));
}

std::vector<Tensor> Detect::forward_levels(const std::vector<Tensor>& feats) {
  AF_CHECK(feats.size() == box_branches.size(), "Detect: expected {} feature maps, got {}", box_branches.size(),
           feats.size());
  std::vector<Tensor> out;
  for (size_t i = 0; i < feats.size(); ++i)
    out.push_back(cat({(*box_branches[i])(feats[i]), (*cls_branches[i])(feats[i])}, 1));  // (B, no, H_i, W_i)
  return out;
}

Tensor Detect::decode(const Tensor& raw, const std::vector<std::pair<int64_t, int64_t>>& sizes) {
  AF_CHECK(strides.size() == sizes.size(), "Detect::decode: {} level sizes for {} strides", sizes.size(), strides.size());
  auto [points, stride_t] = make_anchors(sizes, strides, 0.5);                  // (A, 2), (A, 1)
  AF_CHECK(raw.dim() == 3 && raw.shape()[1] == num_outputs && raw.shape()[2] == points.shape()[0],
           "Detect::decode: expected raw outputs (B, {}, {}), got {}", num_outputs, points.shape()[0], raw.shape().str());
  const Tensor anchors = ampforge::to(transpose(points, 0, 1), raw.device());             // (2, A)
  const Tensor st = ampforge::to(transpose(stride_t, 0, 1), raw.device());                // (1, A)
  const Tensor dist = (*dfl)(narrow(raw, 1, 0, 4 * kRegMax));                   // (B, 4, A) ltrb in stride units
  const Tensor x1y1 = sub(anchors, narrow(dist, 1, 0, 2)), x2y2 = add(anchors, narrow(dist, 1, 2, 2));
  const Tensor box = mul(cat({mul(add(x1y1, x2y2), 0.5), sub(x2y2, x1y1)}, 1), st);  // (B, 4, A) cxcywh pixels
  return cat({box, sigmoid(narrow(raw, 1, 4 * kRegMax, num_classes))}, 1);
}

void Detect::bias_init() {
  AF_CHECK(strides.size() == box_branches.size(), "Detect::bias_init: strides are not known yet");
  autograd::NoGradGuard ng;
  for (size_t i = 0; i < strides.size(); ++i) {
    auto* box = dynamic_cast<Conv2d*>(box_branches[i]->children().back().second.get());
    auto* cls = dynamic_cast<Conv2d*>(cls_branches[i]->children().back().second.get());
    AF_ASSERT(box && cls, "Detect: the last layer of a branch must be a Conv2d");
    ops::fill_(box->bias, 2.0);  // Ultralytics 8.4 (1.0 before)
    // "0.01 objects, 80 classes, 640 img" (Ultralytics' comment): 5 / nc / (640 / s)^2.
    const double cells = 640.0 / strides[i];
    ops::fill_(cls->bias, std::log(5.0 / static_cast<double>(num_classes) / (cells * cells)));
  }
}

// ---- the model ---------------------------------------------------------------------------------------------------
DetectionModel::DetectionModel(const YoloOptions& opt) : Detector("DetectionModel"), opt_(opt) {
  AF_CHECK(opt.num_classes >= 1 && opt.in_channels >= 1, "yolov8: num_classes and in_channels must be positive, got {} "
           "and {}", opt.num_classes, opt.in_channels);
  AF_CHECK(opt.depth > 0 && opt.width > 0 && opt.max_channels > 0, "yolov8: depth, width and max_channels must be "
           "positive, got {}, {}, {}", opt.depth, opt.width, opt.max_channels);
  auto ch = [&](int64_t c) { return make_divisible8(static_cast<double>(std::min(c, opt.max_channels)) * opt.width); };
  auto rep = [&](int64_t n) {
    return n > 1 ? std::max<int64_t>(static_cast<int64_t>(std::llround(static_cast<double>(n) * opt.depth)), 1) : n;
  };
  model = register_module("model", std::make_shared<Sequential>());
  std::vector<int64_t> c(23, 0);  // output channels per layer
  auto conv = [&](int i, int64_t in, int64_t out) { model->push_back(std::make_shared<YoloConv>(in, out, 3, 2)); c[i] = out; };
  auto c2f = [&](int i, int64_t in, int64_t out, int64_t n, bool sc) {
    model->push_back(std::make_shared<C2f>(in, out, rep(n), sc));
    c[i] = out;
  };
  // backbone
  conv(0, opt.in_channels, ch(64));  // P1/2
  conv(1, c[0], ch(128));            // P2/4
  c2f(2, c[1], ch(128), 3, true);
  conv(3, c[2], ch(256));            // P3/8
  c2f(4, c[3], ch(256), 6, true);
  conv(5, c[4], ch(512));            // P4/16
  c2f(6, c[5], ch(512), 6, true);
  conv(7, c[6], ch(1024));           // P5/32
  c2f(8, c[7], ch(1024), 3, true);
  model->push_back(std::make_shared<SPPF>(c[8], ch(1024), 5));
  c[9] = ch(1024);
  // head
  model->push_back(std::make_shared<Upsample>()), c[10] = c[9];
  model->push_back(std::make_shared<Concat>()), c[11] = c[10] + c[6];
  c2f(12, c[11], ch(512), 3, false);
  model->push_back(std::make_shared<Upsample>()), c[13] = c[12];
  model->push_back(std::make_shared<Concat>()), c[14] = c[13] + c[4];
  c2f(15, c[14], ch(256), 3, false);  // P3 out
  conv(16, c[15], ch(256));
  model->push_back(std::make_shared<Concat>()), c[17] = c[16] + c[12];
  c2f(18, c[17], ch(512), 3, false);  // P4 out
  conv(19, c[18], ch(512));
  model->push_back(std::make_shared<Concat>()), c[20] = c[19] + c[9];
  c2f(21, c[20], ch(1024), 3, false);  // P5 out
  detect = std::make_shared<Detect>(opt.num_classes, std::vector<int64_t>{c[15], c[18], c[21]});
  model->push_back(detect);
  for (auto& [name, m] : model->children()) layers_.push_back(m.get());

  // Strides, measured as DetectionModel.__init__ does (input height / feature-map height). Ultralytics runs a
  // 256x256 zeros batch in training mode; here a 64x64 one in eval mode under no-grad gives the same ratios
  // without touching the BN running statistics (and costs 1/16 of the work when `ampforge models` counts).
  {
    autograd::NoGradGuard ng;
    const bool was_training = is_training();
    eval();
    const int64_t s = 64;
    const auto levels = forward_levels(ops::zeros({1, opt.in_channels, s, s}));
    train(was_training);
    for (const Tensor& l : levels) detect->strides.push_back(static_cast<double>(s) / static_cast<double>(l.shape()[2]));
  }
  detect->bias_init();
}

std::vector<Tensor> DetectionModel::forward_levels(const Tensor& x) {
  AF_CHECK(x.dim() == 4 && x.shape()[1] == opt_.in_channels, "yolov8: expected input (N, {}, H, W), got {}",
           opt_.in_channels, x.shape().str());
  std::vector<Tensor> y(23);
  Tensor h = x;
  for (int i = 0; i <= 9; ++i) h = y[i] = (*layers_[i])(h);                       // backbone, P5 (N, 256, 20, 20)
  y[10] = (*layers_[10])(y[9]);                                                   // (N, 256, 40, 40)
  y[12] = (*layers_[12])(cat({y[10], y[6]}, 1));                                  // (N, 128, 40, 40)
  y[13] = (*layers_[13])(y[12]);                                                  // (N, 128, 80, 80)
  y[15] = (*layers_[15])(cat({y[13], y[4]}, 1));                                  // P3 (N, 64, 80, 80)
  y[16] = (*layers_[16])(y[15]);                                                  // (N, 64, 40, 40)
  y[18] = (*layers_[18])(cat({y[16], y[12]}, 1));                                 // P4 (N, 128, 40, 40)
  y[19] = (*layers_[19])(y[18]);                                                  // (N, 128, 20, 20)
  y[21] = (*layers_[21])(cat({y[19], y[9]}, 1));                                  // P5 (N, 256, 20, 20)
  return detect->forward_levels({y[15], y[18], y[21]});
}

Tensor DetectionModel::forward_raw(const Tensor& x) { return concat_levels(forward_levels(x)); }

Tensor DetectionModel::forward(const Tensor& x) {
  const std::vector<Tensor> levels = forward_levels(x);
  Tensor raw = concat_levels(levels);
  if (is_training()) return raw;
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const Tensor& l : levels) sizes.emplace_back(l.shape()[2], l.shape()[3]);
  return detect->decode(raw, sizes);
}

std::vector<std::pair<int64_t, int64_t>> DetectionModel::level_sizes(int64_t h, int64_t w) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int k = 1; k <= 5; ++k) {  // five stride-2 3x3 convs (pad 1): ceil(x / 2) each
    h = (h + 1) / 2, w = (w + 1) / 2;
    if (k >= 3) out.emplace_back(h, w);
  }
  return out;
}

std::shared_ptr<DetectionModel> yolov8(char scale, int64_t num_classes, int64_t in_channels) {
  return std::make_shared<DetectionModel>(yolov8_scale(scale, num_classes, in_channels));
}

Tensor concat_levels(const std::vector<Tensor>& levels) {
  std::vector<Tensor> flat;
  for (const Tensor& l : levels) flat.push_back(flatten(l, 2));  // (B, no, H_i W_i)
  return cat(flat, 2);
}

std::pair<Tensor, Tensor> make_anchors(const std::vector<std::pair<int64_t, int64_t>>& sizes,
                                       const std::vector<double>& strides, double offset) {
  AF_CHECK(sizes.size() == strides.size(), "make_anchors: {} sizes for {} strides", sizes.size(), strides.size());
  std::vector<float> pts, st;
  for (size_t l = 0; l < sizes.size(); ++l)
    for (int64_t y = 0; y < sizes[l].first; ++y)
      for (int64_t x = 0; x < sizes[l].second; ++x) {
        pts.push_back(static_cast<float>(static_cast<double>(x) + offset));
        pts.push_back(static_cast<float>(static_cast<double>(y) + offset));
        st.push_back(static_cast<float>(strides[l]));
      }
  const auto a = static_cast<int64_t>(st.size());
  return {Tensor::from_vector(pts, {a, 2}), Tensor::from_vector(st, {a, 1})};
}

}  // namespace ampforge::models
