// The graph builder: runs a model's eval forward once with a dispatch observer installed and turns every
// kernel call into ONNX nodes. Nothing per model: a model built from existing layers and functions exports
// as soon as its forward runs, because what is recorded is what ran (conv2d, batch_norm, add, matmul, ...),
// including the functional code between modules (residual adds, flatten, cat, attention masks).
//
// How values are followed (docs/ARCHITECTURE.md, "ONNX export"):
//   - every kernel output that depends on a graph input is a graph value, keyed by its storage;
//   - a kernel input that is a view of such a value (reshape, permute, slice, chunk, expand, select, the
//     3-D folding matmul does) is rewritten as Reshape / Transpose / Slice / Expand nodes computed from its
//     strides and offset relative to the value, so views need no hook of their own;
//   - copies into parts of a fresh buffer (cat, stack) become one Concat when the buffer is read;
//   - anything else a kernel reads (parameters, buffers, constants computed in the forward: arange,
//     anchors, masks) becomes an initializer with its current values; a parameter keeps its state-dict
//     name ("layer1.0.conv1.weight"). Kernels whose inputs are all constant are not recorded (constant
//     folding: their outputs become initializers where they are read).
// Kernels that only run in training (dropout, batch_norm with batch statistics) and kernels without an
// ONNX emitter (losses, optimizer steps) throw InvalidArgument naming the op.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ampforge/export/onnx_graph.h"
#include "ampforge/nn/module.h"

namespace ampforge::onnx_export {

struct TraceInput {
  std::string name;  // "images", "input_ids", ...
  Tensor value;      // CPU, contiguous; dim 0 is the batch
};

struct TraceOptions {
  // Dim 0 of every input and output is written as dim_param "batch"; Reshape targets use -1 for a dim 0
  // that scales with the batch, Slice ends along it are open. A constant that depends on the batch size
  // cannot follow it: such graphs fail to trace with a message (or, if not detectable, in the runtime).
  bool dynamic_batch = false;
  int64_t batch_size = 1;  // the batch of the traced inputs (used to tell batch-scaled dims apart)
};

// Runs `forward` (which must read exactly `inputs` and return the outputs) with the tracer installed, under
// no-grad, and returns the graph: inputs and outputs named as given, initializers, nodes in execution order.
// `model` supplies the state-dict names of parameters and buffers. The model must be in eval mode.
Graph trace_graph(const nn::Module& model, const std::vector<TraceInput>& inputs,
                  const std::function<std::vector<Tensor>()>& forward, const std::vector<std::string>& output_names,
                  const TraceOptions& options = {});

}  // namespace ampforge::onnx_export
