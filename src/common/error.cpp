#include "tide/common/error.h"

#include <string>

namespace tide::detail {

void check_failed(const char* cond, const char* file, int line) {
  throw InternalError(
      std::string("internal check failed: ") + cond + " at " + file + ":" +
      std::to_string(line) + "; this is a bug in tide, please report it");
}

}  // namespace tide::detail
