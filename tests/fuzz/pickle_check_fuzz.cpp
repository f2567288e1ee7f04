// libFuzzer target for the check of a peer's pickle (torch_rpc/
// pickle_check.h): beyond "no crash, no sanitizer report", only ProtocolError
// escapes it, and a pickle it accepts ends in STOP.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tide/common/error.h"

#include "torch_rpc/pickle_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view pickle(reinterpret_cast<const char*>(data), size);
  try {
    tide::torch_rpc::check_pickle(pickle);
  } catch (const tide::ProtocolError&) {
    return 0;
  }
  if (pickle.empty() || pickle.back() != '.') {
    std::abort();
  }
  return 0;
}
