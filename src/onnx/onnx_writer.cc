#include "onnx/onnx_writer.h"

#include <fstream>

#include "base/strings.h"

namespace nibble {

namespace {

constexpr int64_t kAlign = 4096;

void SetType(onnx::ValueInfoProto* v, int32_t elem_type, const std::vector<std::string>& dims) {
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem_type);
  for (const std::string& d : dims) {
    onnx::TensorShapeProto_Dimension* dim = t->mutable_shape()->add_dim();
    if (!d.empty() && d.find_first_not_of("0123456789") == std::string::npos)
      dim->set_dim_value(std::stoll(d));
    else if (!d.empty())
      dim->set_dim_param(d);
  }
}

}  // namespace

Result<OnnxWriter> OnnxWriter::Create(const std::string& dir, const std::string& data_name) {
  OnnxWriter w;
  w.dir_ = dir;
  w.data_name_ = data_name;
  const std::string path = dir + "/" + data_name;
  w.data_.reset(std::fopen(path.c_str(), "wb"));
  if (!w.data_) return MakeErrorCode(ErrorCode::kIo, "cannot create ", path, ": ", ErrnoText());
  return w;
}

OnnxWriter::~OnnxWriter() = default;

Status OnnxWriter::AddInitializer(const std::string& name, int32_t elem_type, const std::vector<int64_t>& shape,
                                  std::span<const uint8_t> bytes) {
  NIBBLE_RETURN_IF_ERROR(BeginInitializer(name, elem_type, shape));
  NIBBLE_RETURN_IF_ERROR(Append(bytes));
  return EndInitializer();
}

Status OnnxWriter::BeginInitializer(const std::string& name, int32_t elem_type, const std::vector<int64_t>& shape) {
  static const uint8_t kZeros[kAlign] = {};
  const int64_t pad = (kAlign - offset_ % kAlign) % kAlign;
  NIBBLE_RETURN_IF_ERROR(Append(std::span<const uint8_t>(kZeros, static_cast<size_t>(pad))));
  open_ = graph().add_initializer();
  open_->set_name(name);
  open_->set_data_type(elem_type);
  for (int64_t d : shape) open_->add_dims(d);
  open_->set_data_location(onnx::TensorProto_DataLocation_EXTERNAL);
  open_start_ = offset_;
  return Status::Ok();
}

Status OnnxWriter::Append(std::span<const uint8_t> bytes) {
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), data_.get()) != bytes.size())
    return MakeErrorCode(ErrorCode::kIo, "cannot write ", dir_, "/", data_name_, ": ", ErrnoText());
  offset_ += static_cast<int64_t>(bytes.size());
  return Status::Ok();
}

Status OnnxWriter::EndInitializer() {
  auto entry = [this](const std::string& key, const std::string& value) {
    onnx::StringStringEntryProto* e = open_->add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  entry("location", data_name_);
  entry("offset", std::to_string(open_start_));
  entry("length", std::to_string(offset_ - open_start_));
  open_ = nullptr;
  return Status::Ok();
}

void OnnxWriter::AddInlineInt64(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<int64_t>& values) {
  onnx::TensorProto* t = graph().add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto_DataType_INT64);
  for (int64_t d : shape) t->add_dims(d);
  for (int64_t v : values) t->add_int64_data(v);
}

onnx::NodeProto& OnnxWriter::AddNode(const std::string& op_type, const std::string& name,
                                     const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                                     const std::string& domain) {
  onnx::NodeProto* n = graph().add_node();
  n->set_op_type(op_type);
  n->set_name(name);
  if (!domain.empty()) n->set_domain(domain);
  for (const std::string& i : inputs) n->add_input(i);
  for (const std::string& o : outputs) n->add_output(o);
  return *n;
}

void OnnxWriter::AddInput(const std::string& name, int32_t elem_type, const std::vector<std::string>& dims) {
  onnx::ValueInfoProto* v = graph().add_input();
  v->set_name(name);
  SetType(v, elem_type, dims);
}

void OnnxWriter::AddOutput(const std::string& name, int32_t elem_type, const std::vector<std::string>& dims) {
  onnx::ValueInfoProto* v = graph().add_output();
  v->set_name(name);
  SetType(v, elem_type, dims);
}

Status OnnxWriter::Finish(const std::string& model_name) {
  const std::string data_path = dir_ + "/" + data_name_;
  std::FILE* f = data_.release();
  if (std::fflush(f) != 0 || std::fclose(f) != 0)
    return MakeErrorCode(ErrorCode::kIo, "cannot write ", data_path, ": ", ErrnoText());
  const std::string path = dir_ + "/" + model_name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !model_.SerializeToOstream(&out) || !out.flush())
    return MakeErrorCode(ErrorCode::kIo, "cannot write ", path);
  return Status::Ok();
}

void AttrInt(onnx::NodeProto& n, const std::string& name, int64_t v) {
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto_AttributeType_INT);
  a->set_i(v);
}

void AttrFloat(onnx::NodeProto& n, const std::string& name, float v) {
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto_AttributeType_FLOAT);
  a->set_f(v);
}

}  // namespace nibble
