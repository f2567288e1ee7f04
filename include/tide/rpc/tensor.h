#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include "tide/rpc/serialize.h"

// at::Tensor as an RPC argument or result. Include this header only where
// tensors are sent or received (it pulls ATen's core headers: about 3 s of
// compile time per file) and link libtorch there; the rest of tide never
// sees libtorch.
//
//   agent.register_function("scale", [](at::Tensor t, double k) {
//     return t * k;
//   });
//   at::Tensor r = agent.rpc_sync<at::Tensor>("ps", "scale", t, 2.0);
//
// What travels: dtype, shape, strides, requires_grad and the bytes. The
// bytes leave the stream as an out-of-band Buffer that points at the
// tensor's storage, so the transport writes them from there (TCP) or copies
// them once into shared memory (one host); the receiver's tensor is made on
// the received bytes without another copy. A view sends only the bytes it
// covers, not its whole storage: a dense tensor (contiguous, or a
// permutation of contiguous, e.g. a transpose) keeps its strides; any other
// view (a slice with steps, an expanded tensor) is made contiguous first and
// arrives so. Autograd history does not travel: a received tensor is a
// leaf, requires_grad as sent, except inside a distributed autograd
// context (tide/autograd/dist_autograd.h), which links the two sides'
// graphs.
//
// Only CPU tensors of strided layout and of the dtypes below travel; others
// are an InvalidArgument on the sender. An undefined at::Tensor travels as
// one. The sender must not write to a tensor until its call (or reply) has
// been sent; rpc_async returns at once, so wait for the call first.
//
// Wire (docs/rpc-serialization.md): kTensor, u8 defined; when defined:
// dtype name (string), u8 requires_grad, varint dim, dim varint sizes, dim
// varint strides (in elements), varint buffer index.
namespace tide::rpc {

namespace detail {

// What the tensor codec tells distributed autograd of a call made inside a
// context (tide/autograd/dist_autograd.h makes these).
class TensorGrads : public GradRecorder {
 public:
  using GradRecorder::GradRecorder;
  // A tensor requiring grad is written into the call's message.
  virtual void sent(const at::Tensor& t) = 0;
  // One was read from it: its gradient goes back to the sender.
  virtual void received(at::Tensor& t) = 0;
};

struct DtypeName {
  at::ScalarType type;
  std::string_view name;
};

inline constexpr std::array<DtypeName, 12> kDtypeNames = {{
    {at::kFloat, "float32"},
    {at::kDouble, "float64"},
    {at::kHalf, "float16"},
    {at::kBFloat16, "bfloat16"},
    {at::kComplexFloat, "complex64"},
    {at::kComplexDouble, "complex128"},
    {at::kByte, "uint8"},
    {at::kChar, "int8"},
    {at::kShort, "int16"},
    {at::kInt, "int32"},
    {at::kLong, "int64"},
    {at::kBool, "bool"},
}};

inline std::string_view dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypeNames) {
    if (d.type == t) {
      return d.name;
    }
  }
  return {};
}

}  // namespace detail

template <>
struct Codec<at::Tensor> {
  static void write(Encoder& e, const at::Tensor& t) {
    e.write_tag(Tag::kTensor);
    e.write_fixed<uint8_t>(t.defined() ? 1 : 0);
    if (!t.defined()) {
      return;
    }
    if (!t.device().is_cpu() || t.layout() != at::kStrided) {
      throw InvalidArgument(
          "only CPU tensors of strided layout travel by rpc; got one on " +
          t.device().str() + " with layout " + c10::toString(t.layout()));
    }
    std::string_view name = detail::dtype_name(t.scalar_type());
    if (name.empty()) {
      throw InvalidArgument(
          std::string("tensors of dtype ") + c10::toString(t.scalar_type()) +
          " do not travel by rpc");
    }
    // Dense: its elements fill [data_ptr, data_ptr + numel) whatever the
    // order; the bytes go as they are.
    at::Tensor src = t.is_non_overlapping_and_dense() ? t : t.contiguous();
    size_t bytes = static_cast<size_t>(src.numel()) * src.element_size();
    void* data = src.data_ptr();
    auto keep = std::make_shared<at::Tensor>(src.detach());
    size_t index = e.add_buffer(Buffer(std::move(keep), data, bytes));
    detail::write_string(e, name);
    e.write_fixed<uint8_t>(t.requires_grad() ? 1 : 0);
    e.write_varint(static_cast<uint64_t>(src.dim()));
    for (int64_t s : src.sizes()) {
      e.write_varint(static_cast<uint64_t>(s));
    }
    for (int64_t s : src.strides()) {
      e.write_varint(static_cast<uint64_t>(s));
    }
    e.write_varint(index);
    if (t.requires_grad() && e.grads() != nullptr) {
      static_cast<detail::TensorGrads*>(e.grads())->sent(t);
    }
  }

  static at::Tensor read(Decoder& d) {
    Tag tag = d.read_tag();
    if (tag != Tag::kTensor) {
      d.mismatch("tensor", tag);
    }
    if (d.read_fixed<uint8_t>() == 0) {
      return {};
    }
    if (d.peek_tag() != Tag::kString) {
      d.fail("tensor without its dtype");
    }
    std::string name = Codec<std::string>::read(d);
    const detail::DtypeName* dtype = nullptr;
    for (const auto& n : detail::kDtypeNames) {
      if (n.name == name) {
        dtype = &n;
      }
    }
    if (dtype == nullptr) {
      d.fail("tensor of unknown dtype '" + name + "'");
    }
    bool requires_grad = d.read_fixed<uint8_t>() != 0;
    uint64_t dim = d.read_count("tensor shape", 2);
    std::vector<int64_t> sizes(dim);
    std::vector<int64_t> strides(dim);
    constexpr uint64_t kMaxExtent = uint64_t{1} << 62;
    // The elements the strides reach, and the elements there are.
    uint64_t reach = 1;
    uint64_t numel = 1;
    for (auto* v : {&sizes, &strides}) {
      for (auto& x : *v) {
        uint64_t u = d.read_varint();
        if (u >= kMaxExtent) {
          d.fail("tensor size or stride " + std::to_string(u) + " too large");
        }
        x = static_cast<int64_t>(u);
      }
    }
    for (size_t i = 0; i < dim; ++i) {
      auto size = static_cast<uint64_t>(sizes[i]);
      auto stride = static_cast<uint64_t>(strides[i]);
      if (size == 0) {
        numel = 0;
        continue;
      }
      if (__builtin_mul_overflow(numel, size, &numel) ||
          (size > 1 && stride > kMaxExtent / (size - 1)) ||
          __builtin_add_overflow(reach, (size - 1) * stride, &reach) ||
          numel >= kMaxExtent) {
        d.fail("tensor shape overflows");
      }
    }
    const Buffer& buffer = d.buffer(d.read_varint());
    auto item = static_cast<uint64_t>(c10::elementSize(dtype->type));
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, item, &bytes)) {
      d.fail("tensor shape overflows");
    }
    if (buffer.size() != bytes || (numel > 0 && reach > numel)) {
      d.fail(
          "tensor of " + std::to_string(numel) + " " + name +
          " elements (strides reaching " + std::to_string(reach) +
          ") does not match its buffer of " + std::to_string(buffer.size()) +
          " bytes");
    }
    if (requires_grad && !at::isFloatingType(dtype->type) &&
        !at::isComplexType(dtype->type)) {
      d.fail("a " + name + " tensor cannot require grad");
    }
    auto options = at::TensorOptions().dtype(dtype->type);
    at::Tensor out;
    if (reinterpret_cast<uintptr_t>(buffer.data()) % item == 0) {
      out = at::from_blob(
          buffer.data(),
          sizes,
          strides,
          [owner = buffer.owner()](void*) mutable { owner.reset(); },
          options);
    } else {
      // Misaligned for the dtype: copied once into storage of its own.
      out = at::from_blob(buffer.data(), sizes, strides, options).clone();
    }
    out.set_requires_grad(requires_grad);
    if (requires_grad && d.grads() != nullptr) {
      static_cast<detail::TensorGrads*>(d.grads())->received(out);
    }
    return out;
  }
};

}  // namespace tide::rpc
