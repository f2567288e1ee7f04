#include "transport/frame.h"

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tide/common/error.h"

#include "transport/control.h"

namespace tide::transport {
namespace {

using ::testing::HasSubstr;
// Types a layer above might send (the rpc front ends number theirs from
// kFirstUpperType too).
struct RpcType {
  enum : MessageType {
    kRequest = kFirstUpperType,
    kResponse,
    kError,
    kCancel,
    kCreate = 0x20,
  };
};

// Every type the streams here may carry: the transport's and those above.
const MessageTypes& all_types() {
  static const MessageTypes kAll = MessageTypes()
                                       .add(control_types())
                                       .add(
                                           {{RpcType::kRequest, "REQUEST"},
                                            {RpcType::kResponse, "RESPONSE"},
                                            {RpcType::kError, "ERROR"},
                                            {RpcType::kCancel, "CANCEL"},
                                            {RpcType::kCreate, "CREATE"}});
  return kAll;
}

constexpr uint64_t kGiB = uint64_t{1} << 30;

// Little-endian integers, written independently of the encoder under test.
template <typename T>
void le(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

struct RawHeader {
  uint32_t magic = kFrameMagic;
  uint8_t version = kFrameVersion;
  uint8_t type = RpcType::kRequest;
  uint16_t flags = 0;
  uint64_t id = 1;
  uint32_t metadata_len = 0;
  uint32_t buffer_count = 0;
};

std::string raw(const RawHeader& h) {
  std::string out;
  le(out, h.magic);
  le(out, h.version);
  le(out, h.type);
  le(out, h.flags);
  le(out, h.id);
  le(out, h.metadata_len);
  le(out, h.buffer_count);
  return out;
}

Frame sample(MessageType type, uint64_t id) {
  return Frame{
      .type = type,
      .flags = 0x8001,
      .id = id,
      .metadata = "fn=add;timeout_ms=5000;caller=worker3",
      .buffers = {"args", std::string(1000, '\0'), "", "tail"}};
}

// Decodes `bytes` fed in chunks of `chunk` bytes; fails the test on an error.
std::vector<Frame> decode_all(
    std::string_view bytes, size_t chunk, const FrameLimits& limits = {}) {
  FrameDecoder d(all_types(), limits);
  std::vector<Frame> out;
  for (size_t i = 0; i < bytes.size(); i += chunk) {
    std::string_view piece = bytes.substr(i, chunk);
    d.feed(piece.data(), piece.size());
    while (auto f = d.next()) {
      out.push_back(std::move(*f));
    }
  }
  EXPECT_FALSE(d.mid_frame());
  return out;
}

// The message of the ProtocolError `bytes` make next() throw, or "".
std::string error_of(std::string_view bytes, const FrameLimits& limits = {}) {
  FrameDecoder d(all_types(), limits);
  d.feed(bytes.data(), bytes.size());
  try {
    while (d.next()) {
    }
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

TEST(FrameTest, HeaderHasTheDocumentedLittleEndianLayout) {
  Frame f{
      .type = RpcType::kResponse,
      .flags = 0x0201,
      .id = 0x0807060504030201,
      .metadata = "md",
      .buffers = {"abc"}};
  std::string head = raw(
      {.type = 0x11,
       .flags = 0x0201,
       .id = 0x0807060504030201,
       .metadata_len = 2,
       .buffer_count = 1});
  ASSERT_EQ(head.size(), kFrameHeaderSize);
  EXPECT_EQ(head.substr(0, 4), "TDRP");
  le<uint64_t>(head, 3);
  EXPECT_EQ(encode(f), head + "md" + "abc");
}

TEST(FrameTest, EveryMessageTypeRoundTrips) {
  std::string stream;
  std::vector<Frame> sent;
  uint64_t id = 0;
  for (MessageType t : all_types().all()) {
    sent.push_back(sample(t, id++));
    stream += encode(sent.back());
    EXPECT_TRUE(all_types().known(t));
    EXPECT_STRNE(all_types().name(t), "UNKNOWN");
  }
  EXPECT_EQ(decode_all(stream, stream.size()), sent);
}

TEST(FrameTest, TypesOutsideTheTableAreUnknown) {
  for (int v : {0x00, 0x0b, 0x0f, 0x14, 0x23, 0x32, 0x7f, 0xff}) {
    EXPECT_FALSE(all_types().known(static_cast<MessageType>(v))) << v;
  }
  EXPECT_STREQ(all_types().name(0x7f), "UNKNOWN");
}

TEST(FrameTest, FrameWithoutMetadataOrBuffersIsJustTheHeader) {
  Frame f{.type = ControlType::kHandshakeAck, .id = 0};
  std::string bytes = encode(f);
  EXPECT_EQ(bytes.size(), kFrameHeaderSize);
  EXPECT_EQ(decode_all(bytes, 1), std::vector<Frame>{f});
}

TEST(FrameTest, EmptyBuffersKeepTheirPlace) {
  Frame f{.type = RpcType::kRequest, .id = 9, .buffers = {"", "", "x", "", ""}};
  EXPECT_EQ(decode_all(encode(f), 3), std::vector<Frame>{f});
}

TEST(FrameTest, AsManyBuffersAsTheLimitAllows) {
  Frame f{.type = RpcType::kRequest, .id = 5, .metadata = "m"};
  for (size_t i = 0; i < FrameLimits{}.max_buffers; ++i) {
    f.buffers.push_back(std::string(i % 7, static_cast<char>('a' + i % 26)));
  }
  EXPECT_EQ(decode_all(encode(f), 4096), std::vector<Frame>{f});
}

TEST(FrameTest, ByteByByteFeedingReturnsTheFrameOnlyAtItsLastByte) {
  Frame f = sample(RpcType::kError, 77);
  std::string bytes = encode(f);
  FrameDecoder d(all_types());
  EXPECT_FALSE(d.mid_frame());
  for (size_t i = 0; i + 1 < bytes.size(); ++i) {
    d.feed(&bytes[i], 1);
    ASSERT_EQ(d.next(), std::nullopt) << i;
    ASSERT_TRUE(d.mid_frame()) << i;
  }
  d.feed(&bytes.back(), 1);
  EXPECT_EQ(d.next(), f);
  EXPECT_EQ(d.next(), std::nullopt);
  EXPECT_FALSE(d.mid_frame());
}

TEST(FrameTest, SeveralFramesInOneFeedComeOutInOrder) {
  std::vector<Frame> sent = {
      sample(RpcType::kRequest, 1),
      Frame{.type = RpcType::kCancel, .id = 1},
      sample(RpcType::kResponse, 2),
      Frame{.type = ControlType::kBufferRelease}};
  std::string stream;
  for (const Frame& f : sent) {
    stream += encode(f);
  }
  stream += encode(sent[0]).substr(0, 30);  // and the start of another
  FrameDecoder d(all_types());
  d.feed(stream.data(), stream.size());
  for (const Frame& f : sent) {
    EXPECT_EQ(d.next(), f);
  }
  EXPECT_EQ(d.next(), std::nullopt);
  EXPECT_TRUE(d.mid_frame());
}

TEST(FrameTest, EncodeHeadThenTheBuffersIsTheWholeFrame) {
  Frame f = sample(RpcType::kCreate, 3);
  std::string head = encode_head(
      {.type = f.type,
       .flags = f.flags,
       .id = f.id,
       .metadata = f.metadata,
       .buffers = f.buffers});
  EXPECT_EQ(head.size(), kFrameHeaderSize + 8 * 4 + f.metadata.size());
  std::string bytes = head;
  for (const Buffer& b : f.buffers) {
    bytes += b.view();  // what writev() would send
  }
  EXPECT_EQ(bytes, encode(f));
}

TEST(FrameTest, BadMagicIsRejectedFromItsFourBytes) {
  FrameDecoder d(all_types());
  d.feed("GET ", 4);
  try {
    d.next();
    ADD_FAILURE() << "no error";
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad magic \"GET \""));
    EXPECT_THAT(e.what(), HasSubstr("TDRP"));
  }
  EXPECT_THAT(error_of(std::string(24, '\0')), HasSubstr("\\x00\\x00"));
}

TEST(FrameTest, UnknownVersionIsRejected) {
  // Version 1 sent the token itself in its handshake.
  std::string bytes = raw({.version = 1});
  EXPECT_THAT(error_of(bytes.substr(0, 5)), HasSubstr("frame version 1"));
  EXPECT_THAT(error_of(raw({.version = 0})), HasSubstr("frame version 0"));
}

TEST(FrameTest, UnknownTypesAreRejected) {
  for (auto [t, text] : std::vector<std::pair<uint8_t, std::string>>{
           {0x00, "0x00"}, {0x0b, "0x0b"}, {0x23, "0x23"}, {0xff, "0xff"}}) {
    std::string bytes = raw({.type = t});
    EXPECT_THAT(
        error_of(bytes.substr(0, 6)),
        HasSubstr("unknown message type " + text));
  }
}

TEST(FrameTest, MetadataOverTheLimitIsRejectedFromItsLength) {
  FrameLimits limits;
  std::string bytes = raw({.metadata_len = (1u << 20) + 1});
  EXPECT_THAT(
      error_of(bytes.substr(0, 20), limits),
      HasSubstr("metadata of 1048577 bytes; the limit is 1048576"));
  EXPECT_EQ(error_of(raw({.metadata_len = 1u << 20}), limits), "");
}

TEST(FrameTest, TooManyBuffersAreRejected) {
  EXPECT_THAT(
      error_of(raw({.buffer_count = 1025})),
      HasSubstr("1025 buffers; the limit is 1024"));
  EXPECT_THAT(
      error_of(raw({.buffer_count = UINT32_MAX})),
      HasSubstr("(FrameLimits::max_buffers)"));
}

TEST(FrameTest, BufferOverTheLimitIsRejectedFromItsLength) {
  std::string bytes = raw({.id = 12, .buffer_count = 2});
  le<uint64_t>(bytes, 10);
  le<uint64_t>(bytes, 4 * kGiB + 1);
  std::string msg = error_of(bytes);
  EXPECT_THAT(msg, HasSubstr("message 12 (REQUEST) declares buffer 1"));
  EXPECT_THAT(msg, HasSubstr("(FrameLimits::max_buffer)"));
}

TEST(FrameTest, FrameOverTheTotalLimitIsRejected) {
  FrameLimits limits{.max_buffer = 1000, .max_frame = 2000};
  std::string bytes = raw({.buffer_count = 3});
  le<uint64_t>(bytes, 1000);
  le<uint64_t>(bytes, 900);
  EXPECT_EQ(error_of(bytes, limits), "");  // 24 + 24 + 1900 fits
  le<uint64_t>(bytes, 53);
  EXPECT_THAT(error_of(bytes, limits), HasSubstr("(FrameLimits::max_frame)"));
  // The header alone can claim too much: 24 + 8 * 200 + 500 > 2000.
  EXPECT_THAT(
      error_of(raw({.metadata_len = 500, .buffer_count = 200}), limits),
      HasSubstr("a frame of at least 2124 bytes"));
}

TEST(FrameTest, DefaultLimitsAddUpWithoutOverflow) {
  // Every buffer at the per-buffer limit: the total trips, not a wrap.
  std::string bytes = raw({.buffer_count = 1024});
  for (int i = 0; i < 1024; ++i) {
    le<uint64_t>(bytes, 4 * kGiB);
  }
  std::string msg = error_of(bytes);
  EXPECT_THAT(msg, HasSubstr("declares more than 68719476736 bytes"));
}

TEST(FrameTest, ErrorNamesTheOffsetOfTheBadFrame) {
  std::string good = encode(sample(RpcType::kRequest, 1));
  std::string msg = error_of(good + "HTTP/1.1");
  EXPECT_THAT(
      msg,
      HasSubstr("at byte " + std::to_string(good.size()) + " of the stream"));
}

TEST(FrameTest, FramesBeforeAnErrorAreDeliveredFirst) {
  Frame f = sample(RpcType::kResponse, 4);
  std::string bytes = encode(f) + raw({.version = 9});
  FrameDecoder d(all_types());
  d.feed(bytes.data(), bytes.size());
  EXPECT_FALSE(d.mid_frame());
  EXPECT_EQ(d.next(), f);
  EXPECT_THROW(d.next(), ProtocolError);
}

TEST(FrameTest, ErrorIsStickyForFeedAndNext) {
  FrameDecoder d(all_types());
  std::string bad = raw({.type = 0x66});
  d.feed(bad.data(), bad.size());
  std::string first;
  try {
    d.next();
  } catch (const ProtocolError& e) {
    first = e.what();
  }
  ASSERT_FALSE(first.empty());
  std::string good = encode(sample(RpcType::kRequest, 1));
  for (int i = 0; i < 3; ++i) {
    try {
      d.feed(good.data(), good.size());
      ADD_FAILURE() << "feed did not throw";
    } catch (const ProtocolError& e) {
      EXPECT_EQ(e.what(), first);
    }
    try {
      d.next();
      ADD_FAILURE() << "next did not throw";
    } catch (const ProtocolError& e) {
      EXPECT_EQ(e.what(), first);
    }
  }
}

TEST(FrameTest, BytesAfterAnUnreportedErrorAreDropped) {
  FrameDecoder d(all_types());
  std::string bad = raw({.magic = 0});
  d.feed(bad.data(), bad.size());
  std::string good = encode(sample(RpcType::kRequest, 1));
  d.feed(good.data(), good.size());  // not yet reported: no throw
  EXPECT_EQ(d.bytes_reserved(), 0u);
  EXPECT_THROW(d.next(), ProtocolError);
}

TEST(FrameTest, AFailedDecoderHoldsNoMemory) {
  std::string bytes = raw({.buffer_count = 1000});
  le<uint64_t>(bytes, 10);
  le<uint64_t>(bytes, 5 * kGiB);
  FrameDecoder d(all_types());
  d.feed(bytes.data(), 24 + 8);
  EXPECT_GT(d.bytes_reserved(), 0u);
  d.feed(bytes.data() + 32, 8);
  EXPECT_EQ(d.bytes_reserved(), 0u);
  EXPECT_FALSE(d.mid_frame());
  EXPECT_THROW(d.next(), ProtocolError);
}

TEST(FrameTest, AHugeClaimCostsOnlyTheBytesThatCame) {
  std::string bytes = raw({.buffer_count = 1});
  le<uint64_t>(bytes, 4 * kGiB);
  FrameDecoder d(all_types());
  d.feed(bytes.data(), bytes.size());
  EXPECT_LE(d.bytes_reserved(), 64u);
  std::string chunk(64 * 1024, 'x');
  size_t body = 0;
  for (int i = 0; i < 16; ++i) {  // 1 MiB of the 4 GiB
    d.feed(chunk.data(), chunk.size());
    body += chunk.size();
    EXPECT_EQ(d.next(), std::nullopt);
    EXPECT_LE(d.bytes_reserved(), 2 * body + 64);
  }
  EXPECT_TRUE(d.mid_frame());
}

TEST(FrameTest, AHugeMetadataClaimCostsOnlyTheBytesThatCame) {
  std::string bytes = raw({.metadata_len = 1u << 20}) + "0123456789";
  FrameDecoder d(all_types());
  d.feed(bytes.data(), bytes.size());
  EXPECT_EQ(d.next(), std::nullopt);
  EXPECT_LE(d.bytes_reserved(), 20u + 16u);
}

TEST(FrameTest, DeclaredBuffersCostAFewDozenBytesEach) {
  std::string bytes = raw({.buffer_count = 1024});
  FrameDecoder d(all_types());
  d.feed(bytes.data(), bytes.size());
  EXPECT_GT(d.bytes_reserved(), 0u);
  EXPECT_LE(d.bytes_reserved(), 64u * 1024);
}

// A placement puts a trusted decoder's buffers where the caller wants them
// (a lane's parts in their transfer); one of the wrong size is an error.
TEST(FrameTest, APlacementReceivesBuffersWhereItSays) {
  Frame f = sample(RpcType::kResponse, 9);
  std::string wire = encode(f);
  std::vector<char> home(1000);
  FrameDecoder d(all_types());
  d.trust_lengths();
  std::vector<size_t> asked;
  d.set_placement([&](const Frame& frame, size_t index, uint64_t length) {
    EXPECT_EQ(frame.metadata, f.metadata);  // In before the buffers.
    asked.push_back(index);
    return index == 1 ? Buffer(nullptr, home.data(), length) : Buffer();
  });
  for (size_t at = 0; at < wire.size(); at += 7) {
    d.feed(wire.data() + at, std::min<size_t>(7, wire.size() - at));
  }
  auto got = d.next();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, f);
  EXPECT_EQ(got->buffers[1].data(), home.data());
  EXPECT_EQ(asked, (std::vector<size_t>{0, 1, 3}));  // Not the empty one.

  FrameDecoder wrong(all_types());
  wrong.trust_lengths();
  wrong.set_placement([&](const Frame&, size_t, uint64_t length) {
    return Buffer(nullptr, home.data(), length - 1);
  });
  EXPECT_THROW(wrong.feed(wire.data(), wire.size()), ProtocolError);
}

// A trusted decoder takes a large buffer whole and offers the rest of it as
// a window to read into; trust that comes mid-buffer applies from the next
// buffer.
TEST(FrameTest, ATrustedDecoderFillsLargeBuffersInPlace) {
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<char>(i * 7);
  }
  Frame f{
      .type = RpcType::kResponse,
      .id = 5,
      .metadata = "m",
      .buffers = {"head", big, "", big.substr(0, 70000)}};
  std::string wire = encode(f) + encode(sample(RpcType::kRequest, 6));

  FrameDecoder d(all_types());
  // Untrusted: the first 100 bytes of the large buffer grow a string.
  size_t head = wire.find(big.substr(0, 64));
  d.feed(wire.data(), head + 100);
  EXPECT_TRUE(d.window().empty());
  d.trust_lengths();
  EXPECT_TRUE(d.window().empty());  // This buffer stays as it started.
  size_t at = head + 100;
  std::vector<Frame> got;
  while (at < wire.size()) {
    std::span<char> w = d.window();
    size_t n = std::min<size_t>(wire.size() - at, 100000);
    if (!w.empty()) {
      n = std::min(n, w.size());
      std::memcpy(w.data(), wire.data() + at, n);
      d.commit(n);
    } else {
      d.feed(wire.data() + at, n);
    }
    at += n;
    while (auto frame = d.next()) {
      got.push_back(std::move(*frame));
    }
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], f);
  EXPECT_EQ(got[1], sample(RpcType::kRequest, 6));
  // The large buffers are aligned for any element type.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(got[0].buffers[3].data()) % 64, 0u);
}

TEST(FrameTest, EncoderRefusesWhatThePeerWouldReject) {
  FrameLimits limits{
      .max_metadata = 8, .max_buffers = 2, .max_buffer = 10, .max_frame = 80};
  std::string small(8, 'm');
  std::vector<Buffer> three = {"a", "b", "c"};
  std::vector<Buffer> big = {small, "0123456789a"};
  constexpr MessageType kRequest = RpcType::kRequest;
  EXPECT_THROW(
      encode_head({.type = kRequest, .metadata = "123456789"}, limits),
      InvalidArgument);
  EXPECT_THROW(
      encode_head({.type = kRequest, .buffers = three}, limits),
      InvalidArgument);
  EXPECT_THROW(
      encode_head({.type = kRequest, .buffers = big}, limits), InvalidArgument);
  std::vector<Buffer> total = {"0123456789", "0123456789"};
  // 24 + 2 * 8 + 8 + 2 * 10 = 68 bytes.
  EXPECT_EQ(
      encode_head(
          {.type = RpcType::kRequest, .metadata = small, .buffers = total},
          limits)
          .size(),
      24u + 16 + 8);
  limits.max_frame = 67;
  EXPECT_THROW(
      encode_head(
          {.type = RpcType::kRequest, .metadata = small, .buffers = total},
          limits),
      InvalidArgument);
  EXPECT_THROW(
      encode_head({.type = 0x42}, FrameLimits{}, &all_types()),
      InvalidArgument);
}

}  // namespace
}  // namespace tide::transport
