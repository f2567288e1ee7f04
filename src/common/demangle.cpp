#include "common/demangle.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

namespace tide {

std::string demangle(const char* mangled) {
  int status = 0;
  // __cxa_demangle returns a malloc'ed string the caller frees.
  std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), &std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(mangled);
}

std::string type_name(const std::exception& e) {
  return demangle(typeid(e).name());
}

}  // namespace tide
