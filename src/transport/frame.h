#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tide/common/buffer.h"

// The frame layer of tide's transport (docs/rpc-protocol.md): pure encoding and
// decoding, no I/O. A frame is a message type, a message id, opaque per-call
// metadata and a list of buffers. Buffers travel after the metadata and are
// never copied into it, so a sender can writev() tensors straight from their
// storage and a receiver can place them without re-parsing.
//
// On the wire, all integers little-endian:
//   u32 magic "TDRP" | u8 version (2) | u8 type | u16 flags | u64 message_id
//   | u32 metadata_len | u32 buffer_count          (24 bytes)
//   buffer_count x u64 buffer length
//   metadata_len bytes of metadata
//   the buffers, in order
namespace tide::transport {

static_assert(sizeof(size_t) == 8, "the RPC frame layer needs a 64-bit host");

// The bytes 'T' 'D' 'R' 'P', read as a little-endian u32.
constexpr uint32_t kFrameMagic = 0x50524454;
constexpr uint8_t kFrameVersion = 2;
constexpr size_t kFrameHeaderSize = 24;

// What a frame is for: one byte. The frame layer checks only that a
// stream's types are among those its reader knows (a MessageTypes table);
// what the id, metadata and buffers mean is the message layer's. The
// transport's own messages are 0x01-0x0f (transport/control.h); the layer
// above numbers its own from 0x10 (rpc/messages.h) and gives its table to
// the transport. 0 is never valid: a zeroed header is malformed. A type the
// reader does not know is a ProtocolError, so a new type needs a new
// version or a feature agreed in the handshake before it is sent.
using MessageType = uint8_t;
constexpr MessageType kFirstUpperType = 0x10;

// The types a reader accepts, with their names for messages ("REQUEST").
class MessageTypes {
 public:
  MessageTypes() = default;
  MessageTypes(std::initializer_list<std::pair<MessageType, const char*>> t) {
    for (const auto& [type, name] : t) {
      add(type, name);
    }
  }
  MessageTypes& add(MessageType type, const char* name) {
    if (type != 0) {
      names_[type] = name;
    }
    return *this;
  }
  MessageTypes& add(const MessageTypes& other) {
    for (size_t t = 1; t < names_.size(); ++t) {
      if (other.names_[t] != nullptr) {
        names_[t] = other.names_[t];
      }
    }
    return *this;
  }
  bool known(MessageType type) const {
    return names_[type] != nullptr;
  }
  // "UNKNOWN" for a type not in the table.
  const char* name(MessageType type) const {
    return known(type) ? names_[type] : "UNKNOWN";
  }
  // Every known type, in wire order.
  std::vector<MessageType> all() const {
    std::vector<MessageType> out;
    for (size_t t = 1; t < names_.size(); ++t) {
      if (names_[t] != nullptr) {
        out.push_back(static_cast<MessageType>(t));
      }
    }
    return out;
  }

 private:
  std::array<const char*, 256> names_{};
};

// Storage for a received buffer of n bytes: aligned for any element type,
// in huge pages when large. Throws ProtocolError when it cannot be had.
Buffer allocate_buffer(uint64_t n);

// Limits a receiver enforces and a sender checks before encoding. Both sides
// use the defaults unless told otherwise; a frame over a limit is a
// ProtocolError for the receiver and an InvalidArgument for the sender.
struct FrameLimits {
  // Per-call metadata only (names, ids, timeouts); payloads go in buffers.
  size_t max_metadata = size_t{1} << 20;  // 1 MiB
  size_t max_buffers = 1024;
  uint64_t max_buffer = uint64_t{4} << 30;  // 4 GiB, one buffer
  // Header, lengths, metadata and buffers together.
  uint64_t max_frame = uint64_t{64} << 30;  // 64 GiB
};

// A decoded frame, owning its bytes.
struct Frame {
  MessageType type = 0;
  // Bits for the message layer, carried unchanged by the frame layer:
  // kFlagSharedMemory (the transport's, see transport/transport.h).
  uint16_t flags = 0;
  uint64_t id = 0;
  std::string metadata;
  std::vector<Buffer> buffers;

  bool operator==(const Frame&) const = default;
};

// A frame to send, borrowing its bytes from the caller.
struct FrameHeaderView {
  MessageType type = 0;
  uint16_t flags = 0;
  uint64_t id = 0;
  std::string_view metadata;
  // Only their sizes are encoded by encode_head(); the caller writes the
  // buffers themselves after the head, in this order.
  std::span<const Buffer> buffers;
};

// The 24-byte header, the buffer lengths and the metadata of `frame`: the
// bytes to write before its buffers. Throws InvalidArgument when the type is
// 0 or not in `types` (when given), or the frame is over `limits` (the peer
// would drop the connection on it). Pure; thread-safe.
std::string encode_head(
    const FrameHeaderView& frame,
    const FrameLimits& limits = {},
    const MessageTypes* types = nullptr);

// The whole frame in one string: encode_head() then the buffers. For small
// frames and tests; throws as encode_head().
std::string encode(const Frame& frame, const FrameLimits& limits = {});

// Splits a byte stream into frames. Incremental: bytes may arrive in any
// chunks, and a frame is returned as soon as its last byte is fed.
//
// Errors: a malformed frame (bad magic, unknown version or type, a count or
// length over `limits`) is a ProtocolError, detected as soon as the bytes of
// the offending field arrive, never after waiting for a body that could not
// be accepted anyway. next() reports it after the frames that precede it in
// the stream. From then on the decoder is failed: every call to feed() or
// next() throws the same error. Bytes fed after the bad field are dropped.
//
// Memory: a length is only a claim. The decoder holds at most twice the bytes
// it has received for the frame in progress, plus a few dozen bytes per
// buffer the header declares (bounded by max_buffers); a header that claims a
// 4 GiB buffer costs nothing until the 4 GiB come. Completed frames waiting
// in next() hold exactly their bytes.
//
// Not thread-safe: one reader owns a decoder.
class FrameDecoder {
 public:
  // `types`: those the stream may carry (anything else is malformed); the
  // table must outlive the decoder.
  explicit FrameDecoder(
      const MessageTypes& types, const FrameLimits& limits = {});
  // Gated, for a stream whose peer is not known yet: frames are held to
  // `handshake` limits, and after each one the decoder parses nothing more
  // (it keeps the bytes) until admit_one() lets one more frame in or open()
  // moves it to `limits` for good. So a stranger's bytes after its
  // handshake are never parsed under the limits of a peer that proved
  // itself.
  FrameDecoder(
      const MessageTypes& types,
      const FrameLimits& limits,
      const FrameLimits& handshake);

  // Gated decoders: one more frame under the handshake limits, then the
  // gate closes again; or no gate from now on. Both parse the bytes kept
  // meanwhile (their frames come out of next()).
  void admit_one();
  void open();

  // Consumes n bytes of the stream. Does not block and keeps no pointer into
  // `data`. Throws the decoder's error once next() has reported it.
  void feed(const char* data, size_t n);

  // The next complete frame, or nullopt when more bytes are needed. Throws
  // ProtocolError when the next thing in the stream is malformed, and on
  // every later call.
  std::optional<Frame> next();

  // True when some bytes of an unfinished frame have been fed: a peer that
  // closes now has cut a frame short. False once the decoder has failed.
  bool mid_frame() const;

  // Bytes the decoder holds allocated for the frame in progress; for tests
  // of the memory bound above.
  size_t bytes_reserved() const;

  // From now on, a buffer's whole declared length is allocated when it
  // starts (address space: pages are touched only as bytes come; large ones
  // in huge pages), instead of growing with the bytes, which copies a large
  // buffer several times; and window() offers it. For a peer that passed
  // the handshake (and its token check).
  void trust_lengths() {
    trusted_ = true;
  }

  // Where the next bytes of the stream may be written directly, without
  // feed(): the unfilled part of the large buffer in progress (trusted
  // decoders only). Empty when the next bytes must be fed. After writing k
  // bytes at its start, call commit(k).
  std::span<char> window();
  void commit(size_t k);

  // Where a trusted decoder puts buffer `index` of `length` bytes of
  // `frame` (header and metadata in, buffers not yet), decided as the
  // buffer starts: a Buffer of exactly `length` bytes to read into, or an
  // empty one for the decoder's own allocation. What it throws (and a
  // Buffer of another size) leaves feed(), window() or commit() as a
  // ProtocolError, and the decoder unusable.
  using Placement =
      std::function<Buffer(const Frame& frame, size_t index, uint64_t length)>;
  void set_placement(Placement placement) {
    placement_ = std::move(placement);
  }

 private:
  enum class State { kHeader, kLengths, kMetadata, kBuffers };

  // Each consumes from data/n and returns false when it needs more bytes.
  bool read_header(const char*& data, size_t& n);
  bool read_lengths(const char*& data, size_t& n);
  bool read_metadata(const char*& data, size_t& n);
  bool read_buffers(const char*& data, size_t& n);
  // Storage for the buffer that starts: the placement's, or new.
  Buffer place(uint64_t length);
  void check_header_fields(size_t before, size_t after);
  void start_frame();
  // The frame in progress, leaving the decoder ready for a header and
  // holding no memory.
  Frame take_frame();
  void fail(std::string message);

  const MessageTypes* types_;
  FrameLimits limits_;  // Those of the frame in progress.
  FrameLimits rest_;    // Those of the frames after it.

  // The frame in progress.
  State state_ = State::kHeader;
  std::array<char, kFrameHeaderSize> header_{};
  size_t header_have_ = 0;
  uint32_t metadata_len_ = 0;
  uint32_t buffer_count_ = 0;
  std::array<char, 8> length_bytes_{};
  size_t length_have_ = 0;
  std::vector<uint64_t> lengths_;
  // Header, lengths, metadata and buffers declared so far.
  uint64_t declared_size_ = 0;
  size_t buffer_index_ = 0;
  // The buffer in progress: growing with the bytes (untrusted), or
  // allocated whole and filled (trusted).
  std::string growing_;
  Buffer block_;
  uint64_t filled_ = 0;
  Frame frame_;
  Placement placement_;

  // Stream offsets, for error messages: bytes consumed, start of frame_.
  uint64_t offset_ = 0;
  uint64_t frame_start_ = 0;
  std::deque<Frame> ready_;
  // Set once the stream is malformed; reported_ once next() has thrown it.
  std::exception_ptr error_;
  bool reported_ = false;
  bool trusted_ = false;

  // The gate (admit_one(), open()): kOne parses one more frame, kShut
  // keeps what comes in `held_`.
  enum class Gate { kOpen, kOne, kShut };
  Gate gate_ = Gate::kOpen;
  FrameLimits open_limits_;
  std::string held_;
};

}  // namespace tide::transport
