// What --cuda-graphs refuses before training starts (graph_step.h, cuda_graph_obstacle): checked on the CPU, where
// the models and tasks are the same as on a GPU; the capture itself is in train_gpu_test.cpp.
#include "ampforge/train/graph_step.h"

#include <gtest/gtest.h>

#include "ampforge/nn/layers.h"
#include "ampforge/train/workload.h"

namespace ampforge::train {
namespace {

Workload small(const std::string& model) {
  WorkloadOptions o;
  o.batch = 2;
  o.seq_len = 16;
  o.image_size = model.starts_with("yolo") ? 64 : 0;
  return make_workload(model, o);
}

TEST(CudaGraphObstacle, ModelsWithoutDropoutOrHostReadsCanBeCaptured) {
  for (const char* m : {"cnn", "resnet-small"}) {
    const Workload w = small(m);
    EXPECT_EQ(cuda_graph_obstacle(*w.module, *w.task), "") << m;
  }
}

TEST(CudaGraphObstacle, DropoutIsNamedByItsPath) {
  const Workload w = small("bert-tiny");
  const std::string why = cuda_graph_obstacle(*w.module, *w.task);
  EXPECT_NE(why.find("is a Dropout (p > 0)"), std::string::npos) << why;
  EXPECT_NE(why.find("dropout"), std::string::npos) << why;  // the module's path, e.g. "embeddings.dropout"
  // With every dropout at 0 nothing is left to refuse.
  std::vector<nn::Module*> stack{w.module.get()};
  while (!stack.empty()) {
    nn::Module* m = stack.back();
    stack.pop_back();
    if (auto* d = dynamic_cast<nn::Dropout*>(m)) d->p = 0;
    for (const auto& [name, child] : m->children()) stack.push_back(child.get());
  }
  EXPECT_EQ(cuda_graph_obstacle(*w.module, *w.task), "");
}

TEST(CudaGraphObstacle, TheDetectionLossReadsOnTheHost) {
  const Workload w = small("yolov8n");
  EXPECT_NE(cuda_graph_obstacle(*w.module, *w.task).find("assigns targets to anchors on the host"), std::string::npos);
}

}  // namespace
}  // namespace ampforge::train
