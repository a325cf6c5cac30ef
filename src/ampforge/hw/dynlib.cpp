#include "ampforge/hw/dynlib.h"

#include <dlfcn.h>
#include <link.h>

#include <utility>

namespace ampforge::hw {

DynLib::~DynLib() {
  // Driver libraries are left mapped: closing libcudart/libnvidia-ml while their own exit handlers are still
  // registered crashes some driver versions at process exit. The handle is a reference count; dropping it at
  // exit costs nothing.
  handle_ = nullptr;
}

DynLib::DynLib(DynLib&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), name_(std::move(other.name_)), error_(std::move(other.error_)) {}

DynLib& DynLib::operator=(DynLib&& other) noexcept {
  if (this != &other) {
    handle_ = std::exchange(other.handle_, nullptr);
    name_ = std::move(other.name_);
    error_ = std::move(other.error_);
  }
  return *this;
}

DynLib DynLib::open_first(const std::vector<std::string>& names) {
  DynLib lib;
  for (const auto& n : names) {
    dlerror();
    void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      lib.handle_ = h;
      lib.name_ = n;
      lib.error_.clear();
      return lib;
    }
    const char* e = dlerror();
    if (!lib.error_.empty()) lib.error_ += "; ";
    lib.error_ += e ? e : (n + ": cannot open");
  }
  return lib;
}

std::string DynLib::path() const {
  if (!handle_) return {};
  link_map* map = nullptr;
  if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0]) return map->l_name;
  return name_;
}

void* DynLib::symbol(const char* sym) const {
  if (!handle_) return nullptr;
  return dlsym(handle_, sym);
}

}  // namespace ampforge::hw
