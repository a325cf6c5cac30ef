#include "ampforge/export/protobuf.h"

#include <cstring>

namespace ampforge::onnx_export {

void ProtoWriter::append_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void ProtoWriter::varint_field(int field, uint64_t v) {
  tag(field, 0);
  append_varint(buf_, v);
}

void ProtoWriter::float_field(int field, float v) {
  tag(field, 5);
  char b[4];
  std::memcpy(b, &v, 4);  // little-endian hosts only (x86-64, aarch64): the format is little-endian
  buf_.append(b, 4);
}

void ProtoWriter::bytes_field(int field, std::string_view bytes) {
  tag(field, 2);
  append_varint(buf_, bytes.size());
  buf_.append(bytes.data(), bytes.size());
}

void ProtoWriter::packed_int64_field(int field, std::span<const int64_t> v) {
  std::string payload;
  for (int64_t x : v) append_varint(payload, static_cast<uint64_t>(x));
  bytes_field(field, payload);
}

void ProtoWriter::packed_float_field(int field, std::span<const float> v) {
  std::string payload(v.size() * 4, '\0');
  if (!v.empty()) std::memcpy(payload.data(), v.data(), payload.size());
  bytes_field(field, payload);
}

}  // namespace ampforge::onnx_export
