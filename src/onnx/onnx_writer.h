// An ONNX ModelProto under construction (Debian's libonnx protobuf classes) whose initializers
// are streamed to one external data file beside model.onnx as they are added, so the graph in
// memory holds only names, shapes and offsets (protobuf's 2 GB limit; bounded memory for 7B).
// Each tensor starts at a 4096-byte aligned offset, so ONNX Runtime can memory-map it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "base/result.h"

namespace nibble {

class OnnxWriter {
 public:
  /// A model whose external data goes to `dir/data_name` (created, truncated).
  static Result<OnnxWriter> Create(const std::string& dir, const std::string& data_name);

  OnnxWriter() = default;
  OnnxWriter(OnnxWriter&&) noexcept = default;
  OnnxWriter& operator=(OnnxWriter&&) noexcept = default;
  ~OnnxWriter();

  onnx::GraphProto& graph() { return *model_.mutable_graph(); }
  onnx::ModelProto& model() { return model_; }

  /// Appends `bytes` to the data file as initializer `name` of `elem_type` and `shape`.
  Status AddInitializer(const std::string& name, int32_t elem_type, const std::vector<int64_t>& shape,
                        std::span<const uint8_t> bytes);
  /// The same, written in pieces: Begin, then Append until `bytes` bytes were given, then End.
  Status BeginInitializer(const std::string& name, int32_t elem_type, const std::vector<int64_t>& shape);
  Status Append(std::span<const uint8_t> bytes);
  Status EndInitializer();
  /// A small initializer stored inside model.onnx (constants such as int64 axes).
  void AddInlineInt64(const std::string& name, const std::vector<int64_t>& shape, const std::vector<int64_t>& values);

  /// A node; attributes are added on the returned proto with the Attr helpers below.
  onnx::NodeProto& AddNode(const std::string& op_type, const std::string& name, const std::vector<std::string>& inputs,
                           const std::vector<std::string>& outputs, const std::string& domain = "");
  /// A graph input or output with a symbolic or fixed shape (a dim "" is left unnamed).
  void AddInput(const std::string& name, int32_t elem_type, const std::vector<std::string>& dims);
  void AddOutput(const std::string& name, int32_t elem_type, const std::vector<std::string>& dims);

  /// Flushes and closes the data file, and writes the model to `dir/model_name`.
  Status Finish(const std::string& model_name);
  int64_t data_bytes() const { return offset_; }

 private:
  std::string dir_, data_name_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> data_{nullptr, &std::fclose};
  int64_t offset_ = 0;
  onnx::TensorProto* open_ = nullptr;  // the initializer being appended to
  int64_t open_start_ = 0;
  onnx::ModelProto model_;
};

void AttrInt(onnx::NodeProto& n, const std::string& name, int64_t v);
void AttrFloat(onnx::NodeProto& n, const std::string& name, float v);

}  // namespace nibble
