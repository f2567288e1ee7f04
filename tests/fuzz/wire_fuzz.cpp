// libFuzzer target for the store server's request decoder and the map it
// feeds. Input: one byte of options, then a byte stream as a client would
// send it. Checks, beyond "no crash, no sanitizer report":
//  - decoding in arbitrary chunks gives the same requests as decoding whole;
//  - an incomplete decode asks for more bytes than it has;
//  - only ProtocolError (bad input) or InvalidArgument (add on text) escape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tide/common/error.h"

#include "store/kv_map.h"
#include "store/wire.h"

namespace {

using tide::store::Dialect;
using tide::store::StoreLimits;
namespace wire = tide::store::wire;

void require(bool cond) {
  if (!cond) {
    std::abort();
  }
}

// Decodes `stream` as a server would, from chunks whose sizes come from
// `chunker`. Returns the decoded requests, stopping at the first error.
std::vector<wire::Request> decode_stream(
    std::string_view stream,
    const StoreLimits& limits,
    std::string_view chunker,
    bool& failed) {
  std::vector<wire::Request> out;
  std::string buffer;
  std::optional<Dialect> dialect;
  size_t fed = 0;
  size_t c = 0;
  failed = false;
  while (fed < stream.size()) {
    size_t step = chunker.empty()
                      ? stream.size()
                      : 1 + static_cast<uint8_t>(chunker[c++ % chunker.size()]);
    buffer.append(stream.substr(fed, step));
    fed += std::min(step, stream.size() - fed);
    for (;;) {
      if (buffer.empty()) {
        break;
      }
      if (!dialect) {
        dialect = wire::detect_dialect(buffer);
        if (!dialect) {
          break;
        }
      }
      wire::Request req;
      wire::Decoded d{};
      try {
        d = wire::decode_request(buffer, *dialect, limits, req);
      } catch (const tide::ProtocolError&) {
        failed = true;
        return out;
      }
      if (d.consumed == 0) {
        require(d.need > buffer.size());
        break;
      }
      require(d.consumed <= buffer.size());
      buffer.erase(0, d.consumed);
      out.push_back(std::move(req));
    }
  }
  return out;
}

bool same(const wire::Request& a, const wire::Request& b) {
  return a.op == b.op && a.keys == b.keys && a.values == b.values &&
         a.delta == b.delta && a.target == b.target && a.number == b.number;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) {
    return 0;
  }
  // Small limits so the fuzzer reaches them.
  StoreLimits limits{
      .max_key_bytes = 64,
      .max_value_bytes = 256,
      .max_keys_per_call = 16,
      .max_request_bytes = 1024,
  };
  size_t split = data[0] % 8;  // bytes of chunk sizes
  std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string_view chunker = all.substr(0, std::min(split, all.size()));
  std::string_view stream = all.substr(chunker.size());

  bool failed_whole = false;
  bool failed_chunked = false;
  auto whole = decode_stream(stream, limits, {}, failed_whole);
  auto chunked = decode_stream(stream, limits, chunker, failed_chunked);
  require(failed_whole == failed_chunked);
  require(whole.size() == chunked.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    require(same(whole[i], chunked[i]));
  }

  // Apply the requests to a map the way the server does.
  tide::store::detail::KvMap kv;
  for (const auto& r : whole) {
    try {
      switch (r.op) {
        case wire::Op::kSet:
          kv.set(r.keys[0], r.values[0]);
          require(*kv.find(r.keys[0]) == r.values[0]);
          break;
        case wire::Op::kAdd:
        case wire::Op::kAddWait:
          kv.add(r.keys[0], r.delta);
          break;
        case wire::Op::kCompareSet: {
          bool wrote = false;
          kv.compare_set(r.keys[0], r.values[0], r.values[1], wrote);
          break;
        }
        case wire::Op::kAppend:
          kv.append(r.keys[0], r.values[0]);
          break;
        case wire::Op::kDeleteKey:
          kv.erase(r.keys[0]);
          break;
        default:
          break;
      }
    } catch (const tide::InvalidArgument&) {
    }
  }
  if (kv.size() == 0) {
    require(kv.bytes() == 0);
  }
  return 0;
}
