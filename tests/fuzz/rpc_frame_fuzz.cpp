// libFuzzer target for the RPC frame decoder and encoder. Input: one byte of
// options, up to seven bytes of chunk sizes, then a byte stream as a peer
// would send it. Checks, beyond "no crash, no sanitizer report":
//  - decoding in arbitrary chunks gives the same frames and the same error
//    as decoding the stream whole;
//  - decoded frames re-encode to exactly the bytes they came from;
//  - after every feed the decoder holds no more memory than its bound;
//  - once failed, feed() and next() throw the same error;
//  - only ProtocolError escapes the decoder.
// Option bit 6 also decodes the stream gated, as a connection before its
// handshake does (admit_one() after the first frame, open() after the
// second): it must give what the ungated decoder gives, unless the bytes
// held behind the gate pass the handshake's frame limit.
// Option bit 3 also builds a frame from the stream's bytes and requires it to
// encode and decode back unchanged, or the encoder to refuse it exactly when
// it is over the limits, so the valid path is always exercised.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tide/common/error.h"

#include "rpc/messages.h"
#include "transport/control.h"
#include "transport/frame.h"

namespace {

namespace wire = tide::transport;

// Every type tide's streams carry: the transport's and rpc's.
const wire::MessageTypes& types() {
  static const wire::MessageTypes kAll =
      wire::MessageTypes()
          .add(wire::control_types())
          .add(tide::rpc::detail::rpc_message_types());
  return kAll;
}

void require(bool cond) {
  if (!cond) {
    std::abort();
  }
}

struct Decoded {
  std::vector<wire::Frame> frames;
  std::optional<std::string> error;
};

// The memory bound FrameDecoder documents: twice the bytes of the frame in
// progress plus a few dozen bytes per declared buffer.
void require_bounded(
    const wire::FrameDecoder& d,
    uint64_t in_progress,
    const wire::FrameLimits& limits) {
  require(
      d.bytes_reserved() <= 2 * in_progress + 64 * (limits.max_buffers + 1));
}

void require_sticky(wire::FrameDecoder& d, const std::string& error) {
  for (int i = 0; i < 2; ++i) {
    try {
      d.feed("TDRP", 4);
      require(false);
    } catch (const tide::ProtocolError& e) {
      require(e.what() == error);
    }
    try {
      d.next();
      require(false);
    } catch (const tide::ProtocolError& e) {
      require(e.what() == error);
    }
  }
}

// `stream` in pieces whose sizes come from `chunker` (whole when it is
// empty).
struct Chunks {
  std::string_view stream;
  std::string_view chunker;
  uint64_t fed = 0;  // bytes handed out so far
  size_t c = 0;

  bool done() const {
    return fed >= stream.size();
  }
  std::string_view next() {
    size_t step = chunker.empty()
                      ? stream.size()
                      : 1 + static_cast<uint8_t>(chunker[c++ % chunker.size()]);
    std::string_view piece = stream.substr(fed, step);
    fed += piece.size();
    return piece;
  }
};

// Decodes `stream` from chunks whose sizes come from `chunker` (whole when
// it is empty), checking the per-feed invariants. A trusted decoder
// allocates buffers whole (no memory bound to check) and is fed through its
// window() where it offers one.
Decoded decode_stream(
    std::string_view stream,
    std::string_view chunker,
    const wire::FrameLimits& limits,
    bool trusted = false) {
  Decoded out;
  wire::FrameDecoder d(types(), limits);
  if (trusted) {
    d.trust_lengths();
  }
  Chunks chunks{stream, chunker};
  uint64_t consumed = 0;  // bytes of the frames returned so far
  while (!chunks.done()) {
    std::string_view piece = chunks.next();
    uint64_t fed = chunks.fed;
    if (auto w = d.window(); !w.empty()) {
      size_t k = std::min(w.size(), piece.size());
      std::memcpy(w.data(), piece.data(), k);
      d.commit(k);
      piece.remove_prefix(k);
    }
    d.feed(piece.data(), piece.size());
    try {
      while (auto f = d.next()) {
        std::string bytes = wire::encode(*f, limits);
        require(stream.substr(consumed, bytes.size()) == bytes);
        consumed += bytes.size();
        out.frames.push_back(std::move(*f));
      }
    } catch (const tide::ProtocolError& e) {
      out.error = e.what();
      require(!d.mid_frame());
      require(d.bytes_reserved() == 0);
      require_sticky(d, *out.error);
      return out;
    }
    require(consumed <= fed);
    if (!trusted) {
      require_bounded(d, fed - consumed, limits);
    }
  }
  // Without an error, what is left is the start of a frame.
  require(d.mid_frame() == (consumed < stream.size()));
  return out;
}

// The stream through a gated decoder, in `chunker`'s chunks.
Decoded decode_gated(
    std::string_view stream,
    std::string_view chunker,
    const wire::FrameLimits& limits) {
  Decoded out;
  wire::FrameDecoder d(types(), limits, limits);
  Chunks chunks{stream, chunker};
  while (!chunks.done()) {
    std::string_view piece = chunks.next();
    size_t fed = chunks.fed;
    d.feed(piece.data(), piece.size());
    try {
      while (auto f = d.next()) {
        out.frames.push_back(std::move(*f));
        // The gate holds at most one frame's limit of bytes.
        require(d.bytes_reserved() <= 2 * fed + limits.max_frame + 64 * 9);
        if (out.frames.size() == 1) {
          d.admit_one();
        } else {
          d.open();
        }
      }
    } catch (const tide::ProtocolError& e) {
      out.error = e.what();
      return out;
    }
  }
  return out;
}

// A valid frame made from the stream's bytes, within `limits`.
wire::Frame build_frame(std::string_view in, const wire::FrameLimits& limits) {
  auto byte = [&]() -> uint8_t {
    if (in.empty()) {
      return 0;
    }
    auto b = static_cast<uint8_t>(in[0]);
    in.remove_prefix(1);
    return b;
  };
  auto bytes = [&](size_t n) {
    std::string_view s = in.substr(0, n);
    in.remove_prefix(s.size());
    return std::string(s);
  };
  wire::Frame f;
  static const std::vector<wire::MessageType> kTypes = types().all();
  f.type = kTypes[byte() % kTypes.size()];
  f.flags = static_cast<uint16_t>(byte() | byte() << 8);
  for (int i = 0; i < 8; ++i) {
    f.id = f.id << 8 | byte();
  }
  f.metadata = bytes(byte() % (std::min<size_t>(limits.max_metadata, 64) + 1));
  size_t count = byte() % (std::min<size_t>(limits.max_buffers, 8) + 1);
  for (size_t i = 0; i < count; ++i) {
    f.buffers.push_back(bytes(byte() % 64));
  }
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) {
    return 0;
  }
  uint8_t options = data[0];
  // Small limits so the fuzzer reaches them (bit 5: a total so tight that
  // a header alone can exceed it); bit 4: the defaults, to test the memory
  // bound against huge claims.
  wire::FrameLimits limits{
      .max_metadata = 64,
      .max_buffers = 8,
      .max_buffer = 256,
      .max_frame = (options & 0x20) ? 120u : 1024u,
  };
  if (options & 0x10) {
    limits = wire::FrameLimits{};
  }
  std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string_view chunker =
      all.substr(0, std::min<size_t>(options & 7, all.size()));
  std::string_view stream = all.substr(chunker.size());

  Decoded whole = decode_stream(stream, {}, limits);
  Decoded chunked = decode_stream(stream, chunker, limits);
  require(whole.frames == chunked.frames);
  require(whole.error == chunked.error);
  if (!(options & 0x10)) {
    // Whole allocations only within the small limits: a trusted decoder
    // would take a 4 GiB claim at its word.
    Decoded trusted = decode_stream(stream, chunker, limits, true);
    require(whole.frames == trusted.frames);
    require(whole.error == trusted.error);
  }

  if (options & 0x40) {
    Decoded gated = decode_gated(stream, chunker, limits);
    if (!gated.error ||
        gated.error->find("before the handshake was answered") ==
            std::string::npos) {
      require(whole.frames == gated.frames);
      require(whole.error == gated.error);
    }
  }

  if (options & 0x08) {
    wire::Frame f = build_frame(stream, limits);
    uint64_t wire_size =
        wire::kFrameHeaderSize + 8 * f.buffers.size() + f.metadata.size();
    for (const tide::Buffer& b : f.buffers) {
      wire_size += b.size();
    }
    std::string bytes;
    try {
      bytes = wire::encode(f, limits);
    } catch (const tide::InvalidArgument&) {
      // max_frame is the only limit build_frame() can break.
      require(wire_size > limits.max_frame);
      return 0;
    }
    require(bytes.size() == wire_size);
    Decoded back = decode_stream(bytes, chunker, limits);
    require(!back.error);
    require(back.frames.size() == 1 && back.frames[0] == f);
  }
  return 0;
}
