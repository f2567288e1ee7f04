#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tide {

// Bytes and what keeps them alive: a string moved in, a tensor's storage, a
// shared-memory segment received from a peer. Copies share the bytes (a
// reference count), so a buffer can leave the stream (Encoder::add_buffer),
// cross the transport without being copied, and become a tensor's storage
// on the other side.
//
// A buffer a receiver decoded is the message's own: it may write to it (a
// received tensor is writable). A buffer made from a sender's tensor points
// at that tensor's storage until the transport has written it.
class Buffer {
 public:
  Buffer() = default;
  // Takes the string's bytes; no copy.
  Buffer(std::string bytes) {  // NOLINT(google-explicit-constructor)
    auto s = std::make_shared<std::string>(std::move(bytes));
    data_ = s->data();
    size_ = s->size();
    owner_ = std::move(s);
  }
  Buffer(const char* text)  // NOLINT(google-explicit-constructor)
      : Buffer(std::string(text)) {}
  // `size` bytes at `data`, valid while `owner` lives.
  Buffer(std::shared_ptr<void> owner, void* data, size_t size)
      : owner_(std::move(owner)),
        data_(static_cast<char*>(data)),
        size_(size) {}

  char* data() const {
    return data_;
  }
  size_t size() const {
    return size_;
  }
  std::string_view view() const {
    return {data_, size_};
  }
  operator std::string_view() const {  // NOLINT(google-explicit-constructor)
    return view();
  }
  // Equal bytes.
  bool operator==(const Buffer& other) const {
    return view() == other.view();
  }
  // What keeps data() valid; shared by every copy.
  const std::shared_ptr<void>& owner() const {
    return owner_;
  }

 private:
  std::shared_ptr<void> owner_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

// A message's body as the transport moves it: an encoded stream and the
// buffers that travel beside it, out of band (tensors' storage).
struct Payload {
  Buffer data;
  std::vector<Buffer> buffers;
};

}  // namespace tide
