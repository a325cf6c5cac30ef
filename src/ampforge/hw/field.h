// Field<T>: one hardware reading that may be missing. Every hardware field is optional: a function the
// library does not export, or one that answers NOT_SUPPORTED (fanless boards have no fan speed), gives a
// Field without a value and a short reason, printed as "n/a (reason)". Nothing stops the program.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace ampforge::hw {

template <class T>
struct Field {
  std::optional<T> value;
  std::string na;  // why there is no value (empty when there is one)

  static Field of(T v) { return Field{std::move(v), {}}; }
  static Field missing(std::string why) { return Field{std::nullopt, std::move(why)}; }
  bool ok() const { return value.has_value(); }
  const T& operator*() const { return *value; }
  const T* operator->() const { return &*value; }
};

}  // namespace ampforge::hw
