#pragma once

#include <exception>
#include <string>

namespace tide {

// The readable name of a mangled type name ("std::runtime_error" for
// typeid(e).name()); the name as given when it does not demangle.
std::string demangle(const char* mangled);

// The dynamic type's readable name of an exception.
std::string type_name(const std::exception& e);

}  // namespace tide
