#include "torch_rpc/wire.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>

#include <ATen/ops/_validate_sparse_coo_tensor_args.h>
#include <torch/csrc/distributed/rpc/utils.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include "tide/common/error.h"

#include "torch_rpc/pickle_check.h"

namespace tide::torch_rpc {

namespace tr = torch::distributed::rpc;

namespace {

constexpr size_t kTypeBytes = 4;

void delete_buffer(void* p) {
  delete static_cast<Buffer*>(p);
}

using ReceivedSizes = std::unordered_map<const void*, size_t>;

// Throws ProtocolError unless every element `t` can reach lies inside the
// bytes its storage came with (`received`, by address): the pickle's sizes
// are only claims.
void check_fits(const at::Tensor& t, const ReceivedSizes& received) {
  if (t.layout() == at::kSparse) {
    check_fits(t._indices(), received);
    check_fits(t._values(), received);
    try {
      at::_validate_sparse_coo_tensor_args(
          t._indices(), t._values(), t.sizes());
    } catch (const std::exception& e) {
      throw ProtocolError(
          std::string("a received sparse tensor is inconsistent: ") + e.what());
    }
    return;
  }
  if (t.layout() != at::kStrided) {
    throw ProtocolError(
        "a received tensor has a layout the TIDE backend does not carry "
        "(strided and sparse COO only)");
  }
  if (!t.has_storage()) {
    return;
  }
  auto it = received.find(t.storage().data());
  if (it != received.end() && t.storage().nbytes() > it->second) {
    throw ProtocolError(
        "a received tensor's storage claims " +
        std::to_string(t.storage().nbytes()) + " bytes; " +
        std::to_string(it->second) + " came");
  }
  // The last element's byte, computed without overflow: the sizes, strides
  // and offset are the peer's claims.
  bool empty = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) < 0 || t.stride(d) < 0) {
      throw ProtocolError("a received tensor has a negative size or stride");
    }
    empty = empty || t.size(d) == 0;
  }
  if (empty) {
    return;
  }
  int64_t last = t.storage_offset();
  bool overflow = last < 0;
  for (int64_t d = 0; d < t.dim() && !overflow; ++d) {
    int64_t reach = 0;
    overflow = __builtin_mul_overflow(t.size(d) - 1, t.stride(d), &reach) ||
               __builtin_add_overflow(last, reach, &last);
  }
  int64_t need = 0;
  overflow = overflow || __builtin_add_overflow(last, 1, &need) ||
             __builtin_mul_overflow(
                 need, static_cast<int64_t>(t.element_size()), &need);
  if (overflow || static_cast<uint64_t>(need) > t.storage().nbytes()) {
    throw ProtocolError(
        "a received tensor reaches past its storage of " +
        std::to_string(t.storage().nbytes()) + " bytes");
  }
}

}  // namespace

transport::Message to_wire(const c10::intrusive_ptr<tr::Message>& message) {
  transport::Message out;
  out.type = message->isRequest() ? kTorchRequest : kTorchResponse;
  out.id = static_cast<uint64_t>(message->id());
  auto type = static_cast<uint32_t>(message->type());
  out.metadata.resize(kTypeBytes);
  std::memcpy(out.metadata.data(), &type, kTypeBytes);
  // The payload stays in the message, which the buffer keeps alive: a
  // message may be sent again (RpcAgent::sendWithRetries).
  auto keep = std::make_shared<c10::intrusive_ptr<tr::Message>>(message);
  auto& payload = message->payload();
  out.buffers.emplace_back(keep, payload.data(), payload.size());
  const auto& tensors = message->tensors();
  if (tensors.empty()) {
    return out;
  }
  for (const auto& t : tensors) {
    TORCH_CHECK(
        t.device().is_cpu(),
        "the TIDE rpc backend carries CPU tensors only; found a tensor on ",
        t.device(),
        ". Move it to the CPU before sending it over RPC.");
  }
  torch::jit::Pickler pickler(
      [&out](const char* p, size_t n) { out.metadata.append(p, n); },
      nullptr,
      nullptr,
      nullptr);
  pickler.protocol();
  // Views of a small part of a large storage travel as copies of that part,
  // as torch's agents do.
  pickler.pushIValue(tr::cloneSparseTensors(tensors));
  pickler.stop();
  for (const at::Tensor& t : pickler.tensorData()) {
    auto data = torch::jit::getWriteableTensorData(t, false);
    out.buffers.emplace_back(
        std::make_shared<at::Tensor>(t),
        const_cast<char*>(data.data()),
        data.sizeInBytes());
  }
  return out;
}

c10::intrusive_ptr<tr::Message> from_wire(transport::Message m) {
  if (m.metadata.size() < kTypeBytes || m.buffers.empty()) {
    throw ProtocolError(
        "a torch rpc message needs a 4-byte type and a payload; got " +
        std::to_string(m.metadata.size()) + " bytes of metadata and " +
        std::to_string(m.buffers.size()) + " buffers");
  }
  uint32_t raw = 0;
  std::memcpy(&raw, m.metadata.data(), kTypeBytes);
  auto type = static_cast<tr::MessageType>(raw);
  bool request = (raw & tr::MessageTypeFlags::REQUEST_TYPE) != 0;
  bool response = (raw & tr::MessageTypeFlags::RESPONSE_TYPE) != 0;
  if (request == response || request != (m.type == kTorchRequest)) {
    throw ProtocolError(
        "torch message type " + std::to_string(raw) + " came in a " +
        (m.type == kTorchRequest ? "request" : "response"));
  }
  const Buffer& body = m.buffers[0];
  std::vector<char> payload(body.data(), body.data() + body.size());
  std::vector<at::Tensor> tensors;
  if (m.metadata.size() > kTypeBytes) {
    size_t at = kTypeBytes;
    const std::string& meta = m.metadata;
    check_pickle(std::string_view(meta).substr(kTypeBytes));
    ReceivedSizes received;
    try {
      torch::jit::Unpickler unpickler(
          [&](char* out, size_t n) {
            size_t k = std::min(n, meta.size() - at);
            std::memcpy(out, meta.data() + at, k);
            at += k;
            return k;
          },
          nullptr,
          nullptr,
          [&m, &received](const std::string& name) -> at::DataPtr {
            size_t i = 0;
            for (char c : name) {
              if (c < '0' || c > '9' || i > m.buffers.size()) {
                i = m.buffers.size();  // not a storage that came
                break;
              }
              i = i * 10 + static_cast<size_t>(c - '0');
            }
            i += 1;
            if (name.empty() || i >= m.buffers.size()) {
              throw ProtocolError(
                  "tensor storage " + name + " is not among the " +
                  std::to_string(m.buffers.size() - 1) + " that came");
            }
            auto* b = new Buffer(m.buffers[i]);
            received[b->data()] = b->size();
            return {b->data(), b, &delete_buffer, at::Device(at::kCPU)};
          },
          c10::nullopt);
      tensors = unpickler.parse_ivalue().toTensorVector();
    } catch (const ProtocolError&) {
      throw;
    } catch (const std::exception& e) {
      throw ProtocolError(
          std::string("the tensors of a torch rpc message do not parse: ") +
          e.what());
    }
    for (const auto& t : tensors) {
      check_fits(t, received);
    }
  }
  return c10::make_intrusive<tr::Message>(
      std::move(payload), std::move(tensors), type, static_cast<int64_t>(m.id));
}

}  // namespace tide::torch_rpc
