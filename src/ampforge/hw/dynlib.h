// A shared library opened at run time (dlopen), so that ampforge never links against NVIDIA libraries:
// the binary starts on machines without a driver and reports what is missing instead of failing to load.
// Move-only. Handles are deliberately never dlclose()d (see dynlib.cpp).
#pragma once

#include <string>
#include <vector>

namespace ampforge::hw {

class DynLib {
 public:
  DynLib() = default;
  ~DynLib();
  DynLib(DynLib&& other) noexcept;
  DynLib& operator=(DynLib&& other) noexcept;
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;

  // Tries each name in order (a bare soname goes through the loader's search path); the first that opens
  // wins. When none opens, error() holds the loader's message for each name tried.
  static DynLib open_first(const std::vector<std::string>& names);

  bool loaded() const { return handle_ != nullptr; }
  const std::string& name() const { return name_; }    // the name that opened
  std::string path() const;                            // the file it resolved to, when the loader says
  const std::string& error() const { return error_; }  // why nothing opened

  // The address of an exported symbol, or nullptr when this library does not export it.
  void* symbol(const char* sym) const;
  template <class Fn>
  Fn function(const char* sym) const {
    return reinterpret_cast<Fn>(symbol(sym));
  }

 private:
  void* handle_ = nullptr;
  std::string name_;
  std::string error_;
};

}  // namespace ampforge::hw
