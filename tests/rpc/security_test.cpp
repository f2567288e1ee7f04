// The transport against peers that do not belong: the secret proved and
// never sent, nothing sent to a callee that has not proved itself, handshakes
// that do not replay, identities held to the peer table, other users kept off
// the Unix socket, and bounds on what strangers and non-readers can make a
// worker hold. Each test plays the hostile side by hand (support/raw_rpc.h)
// against a real Transport on 127.0.0.1.
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include "tide/common/error.h"
#include "tide/common/fd_limit.h"
#include "tide/common/logging.h"
#include "tide/rpc/rpc.h"
#include "tide/rpc/serialize.h"
#include "tide/store/tcp_store.h"

#include "support/eventually.h"
#include "support/netns.h"
#include "support/peak_memory.h"
#include "support/raw_client.h"
#include "support/raw_rpc.h"
#include "support/rpc_child.h"
#include "support/rpc_entry.h"
#include "support/stranger_flood.h"
#include "support/subprocess.h"
#include "support/temp_dir.h"
#include "transport/auth.h"
#include "transport/control.h"
#include "transport/fields.h"
#include "transport/frame.h"
#include "transport/transport.h"

namespace tide::transport {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr MessageType kRequest = kFirstUpperType;
constexpr uint64_t kMiB = 1 << 20;
const std::string kToken = "correct-horse-battery-staple";

// A transport whose messages and closed connections the test can wait for.
struct Node {
  explicit Node(TransportOptions o) {
    o.message_types = MessageTypes{{kRequest, "REQUEST"}};
    transport = std::make_unique<Transport>(
        std::move(o),
        TransportHandlers{
            .on_message =
                [this](const Pipe&, Message m) {
                  std::lock_guard lock(mutex);
                  messages.push_back(std::move(m.metadata));
                },
            .on_closed =
                [this](const Pipe& p, const std::string& reason) {
                  if (p.outgoing()) {
                    std::lock_guard lock(mutex);
                    if (!closed_set) {
                      closed_set = true;
                      closed.set_value(reason);
                    }
                  }
                }});
  }

  std::mutex mutex;
  std::vector<std::string> messages;
  bool closed_set = false;
  std::promise<std::string> closed;
  // Last: it goes first, while what its handlers touch is still there.
  std::unique_ptr<Transport> transport;
};

// A listening TCP socket on 127.0.0.1 that plays worker 1.
class RawListener {
 public:
  RawListener() {
    fd_ = test::listen_on_loopback(&port_);
  }
  ~RawListener() {
    ::close(fd_);
  }
  uint16_t port() const {
    return port_;
  }
  // The next connection, within 10 s.
  int accept() {
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 10'000) != 1) {
      throw std::runtime_error("RawListener: nobody connected");
    }
    return ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Everything fd delivers until the peer closes (within 10 s).
std::string read_to_close(int fd) {
  std::string all;
  char buf[4096];
  for (;;) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 10'000) != 1) {
      throw std::runtime_error("read_to_close: the peer did not close");
    }
    ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k <= 0) {
      return all;
    }
    all.append(buf, static_cast<size_t>(k));
  }
}

TransportOptions node(int id, const std::string& name) {
  TransportOptions o;
  o.self_id = id;
  o.self_name = name;
  o.shared_memory = false;
  o.token = kToken;
  return o;
}

// Worker a (id 0, a Node) and worker 1 (the test's RawListener).
void meet_raw(Node& a, const RawListener& raw) {
  a.transport->set_peers(
      {{0, "a", "127.0.0.1", a.transport->port(), "", ""},
       {1, "b", "127.0.0.1", raw.port(), "elsewhere", ""}});
}

TEST(
    TransportSecurityTest,
    TheTokenNeverTravelsAndNothingGoesToAnUnprovedCallee) {
  Node a(node(0, "a"));
  RawListener raw;
  meet_raw(a, raw);
  a.transport->pipe_to(1).send(Message{kRequest, 1, "the-request", {}});

  // An impostor at b's address, without the token: it learns nothing.
  int fd = raw.accept();
  auto hello = test::read_control_frame(fd);
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->type, ControlType::kHandshake);
  EXPECT_EQ(hello->metadata.find(kToken), std::string::npos);
  FieldReader r(hello->metadata, "a handshake");
  auth::Session s{.caller_id = r.i32()};
  r.str();
  r.u32();
  s.caller_nonce = r.str();
  s.callee_nonce = auth::nonce();
  s.callee_id = 1;
  std::string ack = encode(
      {.type = ControlType::kHandshakeAck,
       .metadata = FieldWriter()
                       .i32(1)
                       .str("b")
                       .u32(0)
                       .str(s.callee_nonce)
                       .str(auth::proof("a-guess", auth::Role::kCallee, s))
                       .take()});
  ASSERT_EQ(
      ::send(fd, ack.data(), ack.size(), MSG_NOSIGNAL),
      static_cast<ssize_t>(ack.size()));
  EXPECT_EQ(read_to_close(fd), "");  // no PROOF, no request: a closed
  ::close(fd);
  auto reason = a.closed.get_future();
  ASSERT_EQ(reason.wait_for(10s), std::future_status::ready);
  EXPECT_THAT(
      reason.get(),
      HasSubstr("could not prove that it holds the group's token"));

  // The real b: the request comes after the caller's proof, and neither
  // carries the token.
  a.transport->pipe_to(1).send(Message{kRequest, 2, "the-request", {}});
  fd = raw.accept();
  test::handshake_as_callee(fd, 1, kToken);
  MessageTypes types;
  types.add(control_types()).add(kRequest, "REQUEST");
  FrameDecoder d(types);
  std::optional<Frame> request;
  while (!request) {
    char c = 0;
    ASSERT_EQ(::recv(fd, &c, 1, 0), 1);
    d.feed(&c, 1);
    request = d.next();
  }
  EXPECT_EQ(request->type, kRequest);
  EXPECT_EQ(request->metadata, "the-request");
  ::close(fd);
}

TEST(TransportSecurityTest, ACallerWithoutTheTokenIsRefusedAtItsHello) {
  Node b(node(1, "b"));
  test::RawClient raw(b.transport->port());
  try {
    test::handshake_as_caller(
        raw.fd(), [&](const std::string& s) { raw.send(s); }, 0, "a", "");
    FAIL() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("none was presented"));
  }
}

TEST(TransportSecurityTest, ARecordedHandshakeDoesNotReplay) {
  Node b(node(1, "b"));
  std::vector<std::string> sent;
  {
    test::RawClient first(b.transport->port());
    test::handshake_as_caller(
        first.fd(),
        [&](const std::string& s) {
          sent.push_back(s);
          first.send(s);
        },
        0,
        "a",
        kToken);
  }
  ASSERT_EQ(sent.size(), 2u);  // HANDSHAKE, PROOF
  test::RawClient replay(b.transport->port());
  ASSERT_TRUE(replay.send(sent[0]));
  auto ack = test::read_control_frame(replay.fd());
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->type, ControlType::kHandshakeAck);
  ASSERT_TRUE(replay.send(sent[1]));  // a proof of the first session
  auto refusal = test::read_control_frame(replay.fd());
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->type, ControlType::kRefused);
  EXPECT_THAT(refusal->metadata, HasSubstr("this one is wrong"));
  EXPECT_TRUE(replay.closed_within(10s));
}

// python3 connects to an abstract Unix socket ("unix NAME") or over TCP
// ("tcp HOST PORT"), sends hex bytes and prints "got <hex>" of what came
// back before the close (a refused user's connection closes at once).
const char* kProbe = R"(
import binascii, socket, sys
if sys.argv[1] == "unix":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + sys.argv[2])
else:
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])))
s.settimeout(10)
data = b""
try:
    s.sendall(binascii.unhexlify(sys.argv[-1]))
    while True:
        c = s.recv(65536)
        if not c:
            break
        data += c
except ConnectionError:
    pass
print("got", binascii.hexlify(data).decode(), flush=True)
)";

// What a probe of `address` (the probe's first arguments) got back for
// `bytes`, run as user nobody when `as_nobody`, behind `prefix` (e.g. `ip
// netns exec`).
std::string probe(
    std::vector<std::string> address,
    const std::string& bytes,
    bool as_nobody,
    std::vector<std::string> prefix = {}) {
  std::vector<std::string> argv = std::move(prefix);
  if (as_nobody) {
    for (const char* a :
         {"/usr/bin/setpriv",
          "--reuid=65534",
          "--regid=65534",
          "--clear-groups"}) {
      argv.emplace_back(a);
    }
  }
  for (const char* a : {"/usr/bin/python3", "-c", kProbe}) {
    argv.emplace_back(a);
  }
  argv.insert(argv.end(), address.begin(), address.end());
  argv.push_back(test::hex(bytes));
  test::Subprocess child(argv, {.merge_stderr = true});
  auto line = child.read_line(20s);
  if (!line || line->rfind("got ", 0) != 0) {
    throw std::runtime_error("the probe said: " + line.value_or("nothing"));
  }
  std::string out;
  for (size_t i = 4; i + 1 < line->size(); i += 2) {
    out += static_cast<char>(std::stoi(line->substr(i, 2), nullptr, 16));
  }
  return out;
}

// What a probe of abstract Unix socket `name` got back, as bytes.
std::string probe_unix(
    const std::string& name, const std::string& bytes, bool as_nobody) {
  return probe({"unix", name}, bytes, as_nobody);
}

TEST(TransportSecurityTest, OtherUsersCannotSpeakOnTheUnixSocket) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "runs a probe as user nobody: needs root";
  }
  TransportOptions o = node(1, "b");
  o.shared_memory = true;
  o.handshake_timeout = 2s;
  Node b(o);
  ASSERT_FALSE(b.transport->local_name().empty());
  std::string hello = test::hello_frame(0, "a", auth::nonce(), true);
  // The same hello: from this user it is answered, from nobody the socket
  // closes before a byte comes back.
  EXPECT_NE(probe_unix(b.transport->local_name(), hello, false), "");
  EXPECT_EQ(probe_unix(b.transport->local_name(), hello, true), "");

  o.allowed_uids = {65534};
  Node c(o);
  EXPECT_NE(probe_unix(c.transport->local_name(), hello, true), "");
}

TEST(TransportSecurityTest, APeerCannotClaimAnotherWorkersId) {
  TransportOptions o = node(1, "b");
  o.shared_memory = true;
  Node b(o);
  // Worker a is this process (its socket name says so).
  b.transport->set_peers(
      {{0,
        "a",
        "127.0.0.1",
        1,
        local_host_key(),
        "tide-rpc-" + std::to_string(::getpid()) + "-x"},
       {1, "b", "127.0.0.1", b.transport->port(), "", ""}});
  auto refused = [&](int id, const std::string& name) -> std::string {
    test::RawClient raw(b.transport->port());
    try {
      test::handshake_as_caller(
          raw.fd(),
          [&](const std::string& s) { raw.send(s); },
          id,
          name,
          kToken);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(refused(7, "a"), HasSubstr("no worker of the group has id 7"));
  EXPECT_THAT(refused(0, "mallory"), HasSubstr("is 'a', not 'mallory'"));
  EXPECT_EQ(refused(0, "a"), "");
  // Another process of this user, on the Unix socket, claiming to be a.
  std::string answer = probe_unix(
      b.transport->local_name(),
      test::hello_frame(0, "a", auth::nonce(), true),
      false);
  FrameDecoder d(control_types());
  d.feed(answer.data(), answer.size());
  auto f = d.next();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->type, ControlType::kRefused);
  EXPECT_THAT(f->metadata, HasSubstr("this connection comes from process"));
}

TEST(TransportSecurityTest, StrangersHoldLittleMemoryAndNotForLong) {
  TransportOptions o = node(1, "b");
  o.handshake_timeout = 3s;
  o.max_unauthenticated = 64;
  Node b(o);
  test::PeakMemory peak;
  // 400 connections that never say a word.
  std::vector<std::unique_ptr<test::RawClient>> idle;
  for (int i = 0; i < 400; ++i) {
    idle.push_back(std::make_unique<test::RawClient>(b.transport->port()));
  }
  // Past the cap they are closed at once; the others at the deadline.
  for (auto& c : idle) {
    EXPECT_TRUE(c->closed_within(20s));
  }
  // Each held one costs a small read buffer, not 256 KiB (400 of those
  // were +104 MB).
  EXPECT_LT(peak.growth(), 16 * kMiB);
  idle.clear();
  // b still takes a worker that proves itself.
  test::RawClient good(b.transport->port());
  EXPECT_NO_THROW(test::handshake_as_caller(
      good.fd(), [&](const std::string& s) { good.send(s); }, 0, "a", kToken));
}

// The first frame a TCP probe got back from host:port for `bytes`.
std::optional<Frame> probe_tcp(
    const std::string& host,
    uint16_t port,
    const std::string& bytes,
    bool as_nobody,
    std::vector<std::string> prefix = {}) {
  std::string out = probe(
      {"tcp", host, std::to_string(port)}, bytes, as_nobody, std::move(prefix));
  FrameDecoder d(control_types());
  d.feed(out.data(), out.size());
  return d.next();
}

// A refusal's message ("" for any other frame).
std::string refusal_of(const std::optional<Frame>& f) {
  if (!f || f->type != ControlType::kRefused) {
    return "";
  }
  FieldReader r(f->metadata, "a refusal");
  r.str();
  return r.str();
}

// A worker without a token; a probe it acked is closed soon after, when
// its proof does not come.
TransportOptions tokenless(int id, const std::string& name) {
  TransportOptions o = node(id, name);
  o.token.clear();
  o.handshake_timeout = 2s;
  return o;
}

TEST(TransportSecurityTest, ATokenlessWorkerAdmitsOnlyItsOwnUserOverTcp) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "runs a probe as user nobody: needs root";
  }
  Node b(tokenless(1, "b"));
  std::string hello = test::hello_frame(0, "a", auth::nonce(), false);
  // This user's process is answered with an ack.
  auto mine = probe_tcp("127.0.0.1", b.transport->port(), hello, false);
  ASSERT_TRUE(mine);
  EXPECT_EQ(mine->type, ControlType::kHandshakeAck);
  // Another user's, over TCP loopback, is refused and told why and how.
  std::string why =
      refusal_of(probe_tcp("127.0.0.1", b.transport->port(), hello, true));
  EXPECT_THAT(why, HasSubstr("worker 'b' has no secret"));
  EXPECT_THAT(why, HasSubstr("user 65534's"));
  EXPECT_THAT(why, HasSubstr("TIDE_RPC_TOKEN"));
  // The Unix socket too, before a word.
  TransportOptions o = tokenless(2, "c");
  o.shared_memory = true;
  Node c(o);
  EXPECT_NE(probe_unix(c.transport->local_name(), hello, false), "");
  EXPECT_EQ(probe_unix(c.transport->local_name(), hello, true), "");
  // TIDE_RPC_ALLOW_UIDS' users are let in.
  o = tokenless(3, "d");
  o.allowed_uids = {65534};
  Node d(o);
  auto allowed = probe_tcp("127.0.0.1", d.transport->port(), hello, true);
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->type, ControlType::kHandshakeAck);
}

TEST(TransportSecurityTest, NoConnectionMayClaimTheWorkersOwnId) {
  for (const std::string& token : {std::string(), kToken}) {
    TransportOptions o = node(1, "b");
    o.token = token;
    Node b(o);
    b.transport->set_peers(
        {{0, "a", "127.0.0.1", 1, "", ""},
         {1, "b", "127.0.0.1", b.transport->port(), "", ""}});
    // A process of this user, holding the group's token, claims to be b.
    test::RawClient raw(b.transport->port());
    auth::Session s{auth::nonce(), "", 1, 1};
    ASSERT_TRUE(
        raw.send(test::hello_frame(1, "b", s.caller_nonce, !token.empty())));
    auto ack = test::read_control_frame(raw.fd());
    ASSERT_TRUE(ack);
    ASSERT_EQ(ack->type, ControlType::kHandshakeAck);
    FieldReader r(ack->metadata, "an ack");
    r.i32();
    r.str();
    r.u32();
    s.callee_nonce = r.str();
    // b's proof is keyed by a key of its own process: not the token's.
    EXPECT_FALSE(auth::verify(token, auth::Role::kCallee, s, r.str()));
    ASSERT_TRUE(raw.send(
        test::proof_frame(auth::proof(token, auth::Role::kCaller, s))));
    EXPECT_THAT(
        refusal_of(test::read_control_frame(raw.fd())),
        HasSubstr("this one is wrong"))
        << "token '" << token << "'";
  }
}

TEST(TransportSecurityTest, AWorkerStillCallsItselfOverTcp) {
  for (const std::string& token : {std::string(), kToken}) {
    TransportOptions o = node(0, "a");
    o.token = token;
    Node a(o);
    a.transport->set_peers(
        {{0, "a", "127.0.0.1", a.transport->port(), "", ""}});
    a.transport->pipe_to(0).send(Message{kRequest, 1, "to-myself", {}});
    ASSERT_TRUE(test::eventually([&] {
      std::lock_guard lock(a.mutex);
      return !a.messages.empty();
    })) << "the message to itself never came (token '"
        << token << "')";
    std::lock_guard lock(a.mutex);
    EXPECT_EQ(a.messages[0], "to-myself");
  }
}

TEST(
    TransportSecurityTest, ATokenlessWorkerRefusesAnotherHostSayingHowToFixIt) {
  std::string why;
  if (!test::NetnsHosts::available(&why)) {
    GTEST_SKIP() << "network namespaces are not available here (" << why << ")";
  }
  test::NetnsHosts hosts(2);
  // Worker b lives on host 0: its sockets are made in that namespace, by a
  // thread that entered it (its loop thread inherits it).
  std::unique_ptr<Node> b;
  std::thread([&] {
    int ns = ::open(("/run/netns/" + hosts.name(0)).c_str(), O_RDONLY);
    ASSERT_GE(ns, 0);
    ASSERT_EQ(::setns(ns, CLONE_NEWNET), 0) << std::strerror(errno);
    ::close(ns);
    TransportOptions o = tokenless(1, "b");
    o.listen_host = hosts.addr(0);
    b = std::make_unique<Node>(o);
  }).join();
  ASSERT_TRUE(b);
  std::string hello = test::hello_frame(0, "a", auth::nonce(), false);
  // A process of this user on host 1 is another host's: refused, and told
  // how to give the group a secret.
  std::string told = refusal_of(probe_tcp(
      hosts.addr(0), b->transport->port(), hello, false, hosts.exec_prefix(1)));
  EXPECT_THAT(told, HasSubstr("worker 'b' has no secret"));
  EXPECT_THAT(told, HasSubstr("another host"));
  EXPECT_THAT(told, HasSubstr("TIDE_RPC_TOKEN"));
  EXPECT_THAT(told, HasSubstr("tiderun"));
  // The same process on host 0 is b's own host's, and answered.
  auto local = probe_tcp(
      hosts.addr(0), b->transport->port(), hello, false, hosts.exec_prefix(0));
  ASSERT_TRUE(local);
  EXPECT_EQ(local->type, ControlType::kHandshakeAck);
  b.reset();
}

TEST(
    TransportSecurityTest, AThousandIdleAndAHundredSlowStrangersKeepNoPeerOut) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "runs the strangers as user nobody: needs root";
  }
  raise_fd_limit();  // b accepts more than 1,024 connections
  for (const std::string& token : {std::string(), kToken}) {
    TransportOptions o = node(1, "b");
    o.token = token;
    o.handshake_timeout = 60s;
    Node b(o);
    auto strangers = test::flood(
        b.transport->port(),
        1000,
        100,
        test::hello_frame(0, "a", auth::nonce(), !token.empty()));
    o = node(0, "a");
    o.token = token;
    Node a(o);
    std::vector<PeerAddress> peers{
        {0, "a", "127.0.0.1", a.transport->port(), "", ""},
        {1, "b", "127.0.0.1", b.transport->port(), "", ""}};
    a.transport->set_peers(peers);
    b.transport->set_peers(peers);
    auto start = std::chrono::steady_clock::now();
    a.transport->pipe_to(1).send(Message{kRequest, 1, "let-me-in", {}});
    for (;;) {
      {
        std::lock_guard lock(b.mutex);
        if (!b.messages.empty()) {
          break;
        }
      }
      ASSERT_LT(std::chrono::steady_clock::now() - start, test::kAdmittedWithin)
          << "a's message never reached b through the strangers (token '"
          << token << "')";
      std::this_thread::sleep_for(1ms);
    }
    std::printf(
        "token '%s': admitted in %.1f ms past 1,100 strangers\n",
        token.c_str(),
        std::chrono::duration<double, std::milli>(
            std::chrono::steady_clock::now() - start)
            .count());
    strangers->close_stdin();
    ASSERT_TRUE(strangers->wait(30s));
  }
}

// CPU seconds this process has used.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

TEST(TransportSecurityTest, OutOfDescriptorsTheAcceptLoopBacksOff) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' runtimes need descriptors of their own "
                  "(out of them, UBSan reports a false vptr error)";
#endif
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  tide::logger().sinks().push_back(sink);
  {
    Node b(node(1, "b"));
    // Sockets made while descriptors are left, connected once none are:
    // b's accept fails with EMFILE for each.
    std::vector<int> clients;
    for (int i = 0; i < 20; ++i) {
      clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    }
    rlimit was{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
    // New descriptors take the lowest free number: none below it is left.
    int lowest_free = ::dup(0);
    ::close(lowest_free);
    rlimit low = was;
    low.rlim_cur = static_cast<rlim_t>(lowest_free);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(b.transport->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int c : clients) {
      ::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    }
    // A measured second: the loop waits out its backoff instead of spinning
    // on the failing accept (that was a whole core, and a log line each).
    double before = cpu_seconds();
    std::this_thread::sleep_for(1s);
    double used = cpu_seconds() - before;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &was), 0);
    EXPECT_LT(used, 0.3);
    // Descriptors again: the waiting connections are taken, and one that
    // proves itself is served.
    EXPECT_NO_THROW(test::handshake_as_caller(
        clients[0],
        [&](const std::string& s) {
          ::send(clients[0], s.data(), s.size(), MSG_NOSIGNAL);
        },
        0,
        "a",
        kToken));
    for (int c : clients) {
      ::close(c);
    }
  }
  std::erase(tide::logger().sinks(), sink);
  std::string log = captured.str();
  size_t warnings = 0;
  for (size_t at = 0; (at = log.find("accept on the TCP port failed", at)) !=
                      std::string::npos;
       ++at) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << log;
}

TEST(TransportSecurityTest, APeerThatDoesNotReadCannotGrowTheSender) {
  TransportOptions o = node(0, "a");
  o.max_queued_bytes = 32 * kMiB;
  Node a(o);
  RawListener raw;
  meet_raw(a, raw);
  Pipe pipe = a.transport->pipe_to(1);
  int fd = raw.accept();
  test::handshake_as_callee(fd, 1, kToken);  // then never reads again
  test::PeakMemory peak;
  int refused = 0;
  std::string why;
  // A new 4 MiB buffer for each message that was taken (the one refused
  // is offered again), so memory grows with what the connection holds.
  Buffer next(std::string(4 * kMiB, 'x'));
  for (uint64_t id = 1; id <= 100; ++id) {
    try {
      pipe.send(Message{kRequest, id, "", {next}});
      next = Buffer(std::string(4 * kMiB, 'x'));
    } catch (const NetworkError& e) {
      ++refused;
      why = e.what();
    }
  }
  // 100 requests of 4 MiB never read were +412 MB.
  EXPECT_GT(refused, 80);
  EXPECT_THAT(why, HasSubstr("the peer is not reading"));
  EXPECT_LT(peak.growth(), test::memory_bound(64 * kMiB));
  // Calls that time out take their frames back: there is room again.
  for (uint64_t id = 1; id <= 100; ++id) {
    pipe.cancel(id);
  }
  EXPECT_NO_THROW(pipe.send(
      Message{kRequest, 101, "", {Buffer(std::string(4 * kMiB, 'x'))}}));
  ::close(fd);
}

// A worker of the C++ rpc under tiderun with its default flags: it says
// where it listens, and it refuses a caller that lacks the job's secret.
TEST(
    TransportSecurityTiderunTest,
    AWorkerUnderTiderunRefusesCallersWithoutTheJobsSecret) {
  test::TempDir tmp;
  std::string fifo = (tmp.path() / "done").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  test::Subprocess run(
      {TIDERUN_BIN,
       "--standalone",
       "--nproc-per-node=2",
       "--log-dir",
       (tmp.path() / "logs").string(),
       "--no-python",
       std::filesystem::read_symlink("/proc/self/exe").string()},
      {.env = {{"TIDE_SECURITY_TIDERUN_CHILD", fifo}}, .merge_stderr = true});
  std::optional<uint16_t> port;
  std::string seen;
  while (!port) {
    auto line = run.read_line(60s);
    ASSERT_TRUE(line) << seen;
    seen += *line + "\n";
    if (auto at = line->find("listening on "); at != std::string::npos) {
      port = static_cast<uint16_t>(std::stoi(line->substr(at + 13)));
    }
  }
  EXPECT_THAT(seen, HasSubstr("with a token"));
  auto refusal = [&](const std::string& token) -> std::string {
    test::RawClient raw(*port);
    try {
      test::handshake_as_caller(
          raw.fd(), [&](const std::string& b) { raw.send(b); }, 0, "w0", token);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(refusal(""), HasSubstr("none was presented"));
  EXPECT_THAT(
      refusal("a-guess"), HasSubstr("the callee's proof does not hold"));
  {
    int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ::close(fd);  // the workers may end
  }
  auto status = run.wait(60s);
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, 0) << run.read_all(1s);
}

}  // namespace
}  // namespace tide::transport

namespace tide::test {

void run_security_child_if_requested() {
  const char* fifo = std::getenv("TIDE_SECURITY_TIDERUN_CHILD");
  if (fifo == nullptr) {
    return;
  }
  int rank = std::atoi(std::getenv("RANK"));
  int world = std::atoi(std::getenv("WORLD_SIZE"));
  const char* token = std::getenv("TIDE_RPC_TOKEN");
  // The agent serves MASTER_ADDR:MASTER_PORT (tiderun's default).
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  auto store = std::make_shared<store::TcpStore>(store::TcpStoreOptions{
      .host = std::getenv("MASTER_ADDR"),
      .port = static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT"))),
      .is_server =
          rank == 0 && std::string(agent_store ? agent_store : "") != "True",
      .timeout = std::chrono::seconds(60)});
  rpc::RpcAgent agent("w" + std::to_string(rank), rank, world, {}, store);
  if (rank == 0) {
    transport::PeerAddress me = test::published_entry(*store, 0);
    std::printf(
        "w0 %s, listening on %d\n",
        token != nullptr && *token != '\0' ? "with a token" : "without a token",
        me.port);
    std::fflush(stdout);
    int fd = ::open(fifo, O_RDONLY | O_CLOEXEC);
    char c = 0;
    while (fd >= 0 && ::read(fd, &c, 1) > 0) {
    }
    ::close(fd);
  }
  agent.shutdown(true);
  std::_Exit(0);
}

}  // namespace tide::test
