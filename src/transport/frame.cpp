#include "transport/frame.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "tide/common/error.h"

namespace tide::transport {

namespace {

// Header field offsets.
constexpr size_t kVersionAt = 4;
constexpr size_t kTypeAt = 5;
constexpr size_t kFlagsAt = 6;
constexpr size_t kIdAt = 8;
constexpr size_t kMetadataLenAt = 16;
constexpr size_t kBufferCountAt = 20;
constexpr size_t kLengthSize = 8;

template <typename T>
void put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>(static_cast<uint8_t>(v >> (8 * i))));
  }
}

template <typename T>
T get(const char* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<T>(static_cast<uint8_t>(p[i])) << (8 * i));
  }
  return v;
}

// Bytes as text a log can hold: printable ASCII kept, the rest as \xNN.
std::string printable(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    auto u = static_cast<uint8_t>(c);
    if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
      out.push_back(c);
    } else {
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xf]);
    }
  }
  return out;
}

std::string hex(uint8_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  return std::string("0x") + kHex[v >> 4] + kHex[v & 0xf];
}

std::string describe(
    uint64_t id, MessageType type, const MessageTypes* types = nullptr) {
  return "message " + std::to_string(id) + " (" +
         (types != nullptr && types->known(type) ? types->name(type)
                                                 : "type " + hex(type)) +
         ")";
}

// Heap bytes held by a string (none while it fits in the object itself).
size_t heap_bytes(const std::string& s) {
  static const size_t kInline = std::string().capacity();
  return s.capacity() > kInline ? s.capacity() : 0;
}

}  // namespace

std::string encode_head(
    const FrameHeaderView& frame,
    const FrameLimits& limits,
    const MessageTypes* types) {
  auto type = static_cast<uint8_t>(frame.type);
  if (type == 0 || (types != nullptr && !types->known(type))) {
    throw InvalidArgument(
        "cannot encode message type " + hex(type) + ": not a known type");
  }
  auto what = [&] { return describe(frame.id, frame.type, types); };
  size_t max_metadata = std::min<size_t>(limits.max_metadata, UINT32_MAX);
  if (frame.metadata.size() > max_metadata) {
    throw InvalidArgument(
        "cannot send " + what() + ": its metadata is " +
        std::to_string(frame.metadata.size()) + " bytes, over the limit of " +
        std::to_string(max_metadata) +
        " (FrameLimits::max_metadata); put payloads in buffers");
  }
  size_t count = frame.buffers.size();
  size_t max_buffers = std::min<size_t>(limits.max_buffers, UINT32_MAX);
  if (count > max_buffers) {
    throw InvalidArgument(
        "cannot send " + what() + ": it has " + std::to_string(count) +
        " buffers, over the limit of " + std::to_string(max_buffers) +
        " (FrameLimits::max_buffers)");
  }
  size_t head_size =
      kFrameHeaderSize + kLengthSize * count + frame.metadata.size();
  auto over_total = [&] {
    return InvalidArgument(
        "cannot send " + what() + ": it is more than the limit of " +
        std::to_string(limits.max_frame) + " bytes (FrameLimits::max_frame)");
  };
  if (head_size > limits.max_frame) {
    throw over_total();
  }
  uint64_t total = head_size;  // <= max_frame, so the checks cannot wrap
  for (size_t i = 0; i < count; ++i) {
    uint64_t len = frame.buffers[i].size();
    if (len > limits.max_buffer) {
      throw InvalidArgument(
          "cannot send " + what() + ": buffer " + std::to_string(i) + " is " +
          std::to_string(len) + " bytes, over the limit of " +
          std::to_string(limits.max_buffer) + " (FrameLimits::max_buffer)");
    }
    if (len > limits.max_frame - total) {
      throw over_total();
    }
    total += len;
  }

  std::string out;
  out.reserve(head_size);
  put<uint32_t>(out, kFrameMagic);
  put<uint8_t>(out, kFrameVersion);
  put<uint8_t>(out, type);
  put<uint16_t>(out, frame.flags);
  put<uint64_t>(out, frame.id);
  put<uint32_t>(out, static_cast<uint32_t>(frame.metadata.size()));
  put<uint32_t>(out, static_cast<uint32_t>(count));
  for (const Buffer& b : frame.buffers) {
    put<uint64_t>(out, b.size());
  }
  out.append(frame.metadata);
  return out;
}

std::string encode(const Frame& frame, const FrameLimits& limits) {
  std::string out = encode_head(
      {.type = frame.type,
       .flags = frame.flags,
       .id = frame.id,
       .metadata = frame.metadata,
       .buffers = frame.buffers},
      limits);
  size_t total = out.size();
  for (const Buffer& b : frame.buffers) {
    total += b.size();
  }
  out.reserve(total);
  for (const Buffer& b : frame.buffers) {
    out.append(b.view());
  }
  return out;
}

FrameDecoder::FrameDecoder(const MessageTypes& types, const FrameLimits& limits)
    : types_(&types), limits_(limits), rest_(limits) {}

FrameDecoder::FrameDecoder(
    const MessageTypes& types,
    const FrameLimits& limits,
    const FrameLimits& handshake)
    : types_(&types),
      limits_(handshake),
      rest_(handshake),
      gate_(Gate::kOne),
      open_limits_(limits) {}

void FrameDecoder::admit_one() {
  if (gate_ == Gate::kShut) {
    gate_ = Gate::kOne;
    std::string held = std::exchange(held_, {});
    feed(held.data(), held.size());
  }
}

void FrameDecoder::open() {
  if (gate_ == Gate::kOpen) {
    return;
  }
  // Between frames (the gate shuts only there): the next starts under these.
  gate_ = Gate::kOpen;
  limits_ = rest_ = open_limits_;
  std::string held = std::exchange(held_, {});
  feed(held.data(), held.size());
}

void FrameDecoder::feed(const char* data, size_t n) {
  if (error_) {
    if (reported_) {
      std::rethrow_exception(error_);
    }
    return;  // after a malformed field: nothing more is a frame
  }
  if (n == 0) {
    return;  // a part with no bytes already ended with the bytes before it
  }
  for (;;) {
    if (gate_ == Gate::kShut) {
      if (held_.size() + n > limits_.max_frame) {
        fail(
            "more than " + std::to_string(limits_.max_frame) +
            " bytes sent before the handshake was answered");
        return;
      }
      held_.append(data, n);
      return;
    }
    bool done = false;
    switch (state_) {
      case State::kHeader:
        done = read_header(data, n);
        break;
      case State::kLengths:
        done = read_lengths(data, n);
        break;
      case State::kMetadata:
        done = read_metadata(data, n);
        break;
      case State::kBuffers:
        done = read_buffers(data, n);
        break;
    }
    // A part ends even when no bytes are left: empty metadata, empty buffers.
    if (!done || error_) {
      return;
    }
  }
}

std::optional<Frame> FrameDecoder::next() {
  if (!ready_.empty()) {
    Frame f = std::move(ready_.front());
    ready_.pop_front();
    return f;
  }
  if (error_) {
    reported_ = true;
    std::rethrow_exception(error_);
  }
  return std::nullopt;
}

bool FrameDecoder::mid_frame() const {
  return !error_ &&
         (state_ != State::kHeader || header_have_ > 0 || !held_.empty());
}

size_t FrameDecoder::bytes_reserved() const {
  size_t total = lengths_.capacity() * sizeof(uint64_t) +
                 frame_.buffers.capacity() * sizeof(Buffer) +
                 heap_bytes(frame_.metadata) + heap_bytes(growing_) +
                 heap_bytes(held_) + block_.size();
  for (const Buffer& b : frame_.buffers) {
    total += b.size();
  }
  return total;
}

bool FrameDecoder::read_header(const char*& data, size_t& n) {
  size_t take = std::min(n, kFrameHeaderSize - header_have_);
  if (take == 0) {
    return false;
  }
  if (header_have_ == 0) {
    frame_start_ = offset_;
  }
  std::memcpy(header_.data() + header_have_, data, take);
  size_t before = header_have_;
  header_have_ += take;
  data += take;
  n -= take;
  offset_ += take;
  check_header_fields(before, header_have_);
  if (error_ || header_have_ < kFrameHeaderSize) {
    return false;
  }
  start_frame();
  return true;
}

void FrameDecoder::check_header_fields(size_t before, size_t after) {
  // Each field is checked once, when its last byte arrives.
  auto arrived = [&](size_t end) { return before < end && after >= end; };
  if (arrived(kVersionAt)) {
    uint32_t magic = get<uint32_t>(header_.data());
    if (magic != kFrameMagic) {
      fail(
          "bad magic \"" + printable({header_.data(), 4}) +
          "\"; expected \"TDRP\": the peer does not speak tide RPC");
      return;
    }
  }
  if (arrived(kTypeAt)) {
    auto version = static_cast<uint8_t>(header_[kVersionAt]);
    if (version != kFrameVersion) {
      fail(
          "frame version " + std::to_string(version) +
          "; this build speaks version " + std::to_string(kFrameVersion) +
          ": the peer runs an incompatible tide");
      return;
    }
  }
  if (arrived(kFlagsAt)) {
    auto type = static_cast<uint8_t>(header_[kTypeAt]);
    if (!types_->known(type)) {
      fail(
          "unknown message type " + hex(type) +
          ": the peer runs a newer or incompatible tide");
      return;
    }
  }
  if (arrived(kBufferCountAt)) {
    uint32_t len = get<uint32_t>(header_.data() + kMetadataLenAt);
    if (len > limits_.max_metadata) {
      fail(
          "metadata of " + std::to_string(len) + " bytes; the limit is " +
          std::to_string(limits_.max_metadata) +
          " (FrameLimits::max_metadata)");
      return;
    }
  }
  if (arrived(kFrameHeaderSize)) {
    uint32_t count = get<uint32_t>(header_.data() + kBufferCountAt);
    if (count > limits_.max_buffers) {
      fail(
          std::to_string(count) + " buffers; the limit is " +
          std::to_string(limits_.max_buffers) + " (FrameLimits::max_buffers)");
      return;
    }
    uint64_t size = kFrameHeaderSize + kLengthSize * uint64_t{count} +
                    get<uint32_t>(header_.data() + kMetadataLenAt);
    if (size > limits_.max_frame) {
      fail(
          "a frame of at least " + std::to_string(size) +
          " bytes; the limit is " + std::to_string(limits_.max_frame) +
          " (FrameLimits::max_frame)");
      return;
    }
    declared_size_ = size;
  }
}

void FrameDecoder::start_frame() {
  frame_.type = static_cast<MessageType>(header_[kTypeAt]);
  frame_.flags = get<uint16_t>(header_.data() + kFlagsAt);
  frame_.id = get<uint64_t>(header_.data() + kIdAt);
  metadata_len_ = get<uint32_t>(header_.data() + kMetadataLenAt);
  buffer_count_ = get<uint32_t>(header_.data() + kBufferCountAt);
  // Bounded by max_buffers, which the header was checked against.
  lengths_.reserve(buffer_count_);
  frame_.buffers.reserve(buffer_count_);
  state_ = State::kLengths;
}

bool FrameDecoder::read_lengths(const char*& data, size_t& n) {
  while (lengths_.size() < buffer_count_) {
    size_t take = std::min(n, kLengthSize - length_have_);
    if (take == 0) {
      return false;
    }
    std::memcpy(length_bytes_.data() + length_have_, data, take);
    length_have_ += take;
    data += take;
    n -= take;
    offset_ += take;
    if (length_have_ < kLengthSize) {
      return false;
    }
    length_have_ = 0;
    uint64_t len = get<uint64_t>(length_bytes_.data());
    auto what = [this] { return describe(frame_.id, frame_.type, types_); };
    if (len > limits_.max_buffer) {
      fail(
          what() + " declares buffer " + std::to_string(lengths_.size()) +
          " of " + std::to_string(len) + " bytes; the limit is " +
          std::to_string(limits_.max_buffer) + " (FrameLimits::max_buffer)");
      return false;
    }
    // declared_size_ <= max_frame here, so the subtraction cannot wrap.
    if (len > limits_.max_frame - declared_size_) {
      fail(
          what() + " declares more than " + std::to_string(limits_.max_frame) +
          " bytes in all, the limit (FrameLimits::max_frame)");
      return false;
    }
    declared_size_ += len;
    lengths_.push_back(len);
    frame_.buffers.emplace_back();
  }
  state_ = State::kMetadata;
  return true;
}

bool FrameDecoder::read_metadata(const char*& data, size_t& n) {
  size_t take = std::min<size_t>(n, metadata_len_ - frame_.metadata.size());
  // Grows with the bytes that came, not with the length the header claims.
  frame_.metadata.append(data, take);
  data += take;
  n -= take;
  offset_ += take;
  if (frame_.metadata.size() < metadata_len_) {
    return false;
  }
  state_ = State::kBuffers;
  buffer_index_ = 0;
  return true;
}

// Huge pages for a large buffer: a 64 MiB tensor takes 32 page faults, not
// 16384. A small one is one allocation with its owner.
Buffer allocate_buffer(uint64_t n) {
  constexpr size_t kSmall = 4096;
  if (n <= kSmall) {
    constexpr size_t kWord = sizeof(std::max_align_t);
    auto words = std::make_shared_for_overwrite<std::max_align_t[]>(
        std::max<size_t>(1, (n + kWord - 1) / kWord));
    void* p = words.get();
    return Buffer(std::move(words), p, n);
  }
  constexpr size_t kHuge = size_t{2} << 20;
  size_t align = n >= kHuge ? kHuge : 64;
  size_t size = (n + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (p == nullptr) {
    throw ProtocolError(
        "cannot allocate " + std::to_string(n) +
        " bytes for a received buffer");
  }
  if (align == kHuge) {
    ::madvise(p, size, MADV_HUGEPAGE);
  }
  return Buffer(std::shared_ptr<void>(p, std::free), p, n);
}

Buffer FrameDecoder::place(uint64_t length) {
  if (placement_) {
    Buffer b = placement_(frame_, buffer_index_, length);
    if (b.size() == length && b.data() != nullptr) {
      return b;
    }
    if (b.size() != 0) {
      throw ProtocolError(
          "placement of " + std::to_string(b.size()) +
          " bytes for a buffer of " + std::to_string(length));
    }
  }
  return allocate_buffer(length);
}

bool FrameDecoder::read_buffers(const char*& data, size_t& n) {
  while (buffer_index_ < buffer_count_) {
    uint64_t length = lengths_[buffer_index_];
    // Whole or growing is decided as a buffer starts (trust may come while
    // one is half in).
    bool whole = block_.size() > 0;
    if (!whole && growing_.empty() && trusted_ && length > 0) {
      block_ = place(length);
      filled_ = 0;
      whole = true;
    }
    uint64_t have = whole ? filled_ : growing_.size();
    uint64_t want = length - have;
    if (want == 0) {
      frame_.buffers[buffer_index_] = whole
                                          ? std::exchange(block_, Buffer())
                                          : Buffer(std::exchange(growing_, {}));
      ++buffer_index_;
      continue;
    }
    if (n == 0) {
      return false;
    }
    size_t take = std::min<uint64_t>(n, want);
    if (whole) {
      std::memcpy(block_.data() + filled_, data, take);
      filled_ += take;
    } else {
      // Grows with the bytes that came, not with the length claimed.
      growing_.append(data, take);
    }
    data += take;
    n -= take;
    offset_ += take;
  }
  ready_.push_back(take_frame());
  if (gate_ == Gate::kOne) {
    gate_ = Gate::kShut;
  }
  return true;
}

std::span<char> FrameDecoder::window() {
  constexpr uint64_t kDirectFrom = uint64_t{64} << 10;
  if (!trusted_ || error_ || state_ != State::kBuffers ||
      buffer_index_ >= buffer_count_ || lengths_[buffer_index_] < kDirectFrom ||
      !growing_.empty()) {
    return {};
  }
  if (block_.size() == 0) {
    block_ = place(lengths_[buffer_index_]);
    filled_ = 0;
  }
  return {block_.data() + filled_, block_.size() - filled_};
}

void FrameDecoder::commit(size_t k) {
  filled_ += k;
  offset_ += k;
  const char* none = nullptr;
  size_t zero = 0;
  // Completes the buffer, and the frame, when these were the last bytes.
  read_buffers(none, zero);
}

Frame FrameDecoder::take_frame() {
  // Exchanged, not assigned: assigning an empty value keeps the capacity.
  std::exchange(lengths_, std::vector<uint64_t>());
  std::exchange(growing_, std::string());
  block_ = Buffer();
  filled_ = 0;
  header_have_ = 0;
  length_have_ = 0;
  state_ = State::kHeader;
  limits_ = rest_;
  return std::exchange(frame_, Frame{});
}

void FrameDecoder::fail(std::string message) {
  error_ = std::make_exception_ptr(ProtocolError(
      "malformed RPC frame at byte " + std::to_string(frame_start_) +
      " of the stream: " + message));
  take_frame();
}

}  // namespace tide::transport
