// The ONNX graph the exporter builds, in memory, and its serialisation to a ModelProto.
//
// Only what the exporter writes is modelled: nodes with int / float / string / ints / floats attributes,
// initializers holding CPU tensors (written as raw_data, little-endian), graph inputs and outputs with a
// tensor type and a shape whose dims are fixed or named ("batch"). Field numbers: onnx/onnx.proto as quoted in
// ../shared/docs/specs/ONNX.md §E.4. Target: IR version 8, opset 17 (what Debian's python3-onnx 1.12 checks).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "ampforge/core/tensor.h"

namespace ampforge::onnx_export {

inline constexpr int64_t kIrVersion = 8;
inline constexpr int64_t kOpsetVersion = 17;

// TensorProto.DataType values.
enum class OnnxType : int32_t { Float = 1, Uint8 = 2, Int32 = 6, Int64 = 7, Bool = 9, Float16 = 10, Double = 11,
                                BFloat16 = 16 };
OnnxType onnx_type(DType d);  // throws InvalidArgument for dtypes ONNX cannot hold
const char* onnx_type_name(OnnxType t);

struct Attribute {
  std::string name;
  std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>> value;
};

struct Node {
  std::string op_type;
  std::string name;
  std::vector<std::string> inputs;  // "" = an omitted optional input
  std::vector<std::string> outputs;
  std::vector<Attribute> attributes;

  const Attribute* attr(const std::string& n) const;
};

// One dimension of a graph input/output: a fixed size, or a symbolic name (dim_param) when `param` is set.
struct Dim {
  int64_t value = 0;
  std::string param;
};

struct ValueInfo {
  std::string name;
  OnnxType type = OnnxType::Float;
  std::vector<Dim> dims;
};

struct Graph {
  std::string name = "ampforge";
  std::vector<Node> nodes;  // topologically sorted (the order ops ran in)
  // name -> contiguous CPU tensor; written in insertion order (initializer_order).
  std::map<std::string, Tensor> initializers;
  std::vector<std::string> initializer_order;
  std::vector<ValueInfo> inputs, outputs;
  std::map<std::string, std::string> metadata;  // ModelProto.metadata_props

  void add_initializer(const std::string& name, const Tensor& t);  // copies t (contiguous, CPU)
  void remove_initializer(const std::string& name);
  bool has_initializer(const std::string& n) const { return initializers.count(n) != 0; }
  // How many node inputs and graph outputs read `value`.
  int use_count(const std::string& value) const;
  // Node index producing `value`, or -1.
  int producer(const std::string& value) const;
  // Renames a value everywhere (node inputs/outputs, graph outputs).
  void rename_value(const std::string& from, const std::string& to);
};

// Serialises a ModelProto (IR 8, opset 17, producer "ampforge"). Initializers are written with the dtype
// they hold.
std::string serialize_model(const Graph& g);

// ---- passes ----------------------------------------------------------------------------------------------
// Folds BatchNormalization into the Conv before it when the conv's output feeds only that BN and every
// parameter is an initializer: W' = W * s, b' = (b - mean) * s + beta with s = gamma / sqrt(var + eps)
// (computed in double). Returns the number of folded pairs.
int fold_batch_norm(Graph& g);
// Removes nodes whose outputs nobody reads (and initializers nobody reads). Identity nodes are bypassed.
void remove_dead_code(Graph& g);
// Converts the float32 parts of the graph to float16: initializers, graph inputs/outputs, Cast targets.
// Resize's `scales` stay float32 (the operator requires it).
void convert_to_float16(Graph& g);

}  // namespace ampforge::onnx_export
