// A minimal protocol-buffers encoder: just what writing ONNX's messages needs (varint, 64-bit and 32-bit
// scalars, length-delimited strings/bytes/sub-messages, packed repeated numbers).
//
// Wire format (https://protobuf.dev/programming-guides/encoding/): each field is a varint tag
// (field_number << 3 | wire_type) followed by its payload; wire types 0 VARINT, 1 I64, 2 LEN, 5 I32.
// Varints are little-endian 7-bit groups with the high bit as continuation. Negative int64 values are written
// as their two's-complement 64-bit pattern (10 bytes), not zigzag: ONNX's fields are int64, not sint64.
// Sub-messages are written bottom-up: the child is encoded into its own buffer first, so its length is known.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ampforge::onnx_export {

class ProtoWriter {
 public:
  void varint_field(int field, uint64_t v);            // int32/int64/bool/enum (wire type 0)
  void int_field(int field, int64_t v) { varint_field(field, static_cast<uint64_t>(v)); }
  void float_field(int field, float v);                // wire type 5
  void bytes_field(int field, std::string_view bytes);  // string, bytes, sub-message (wire type 2)
  void message_field(int field, const ProtoWriter& m) { bytes_field(field, m.buf_); }
  void packed_int64_field(int field, std::span<const int64_t> v);
  void packed_float_field(int field, std::span<const float> v);

  const std::string& bytes() const { return buf_; }
  std::string take() { return std::move(buf_); }

  static void append_varint(std::string& out, uint64_t v);

 private:
  void tag(int field, int wire_type) { append_varint(buf_, (static_cast<uint64_t>(field) << 3) | wire_type); }
  std::string buf_;
};

}  // namespace ampforge::onnx_export
