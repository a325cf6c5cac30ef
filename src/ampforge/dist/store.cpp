// The store's wire format (private to this file; both ends are this code):
//   request: u8 op, u32 field count, then per field u32 length + bytes (little-endian, the host's order)
//   reply:   u8 status (0 ok, 1 timeout, 2 error), u32 length, payload
// Waits are answered by the server when their keys exist, when their deadline passes (payload: the missing
// keys, one a line) or when a rank has left (payload: the message naming it).
#include "ampforge/dist/store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "ampforge/util/error.h"
#include "ampforge/util/socket.h"

namespace ampforge::dist {

namespace {

enum Op : uint8_t { kHello = 1, kSet, kGet, kAdd, kCheck, kWait, kArrive, kBye };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kFailed = 2 };

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::string encode(uint8_t op, const std::vector<std::string>& fields) {
  std::string m(1, static_cast<char>(op));
  put_u32(m, static_cast<uint32_t>(fields.size()));
  for (const std::string& f : fields) {
    put_u32(m, static_cast<uint32_t>(f.size()));
    m += f;
  }
  return m;
}

// Parses one complete request from the front of `buf`; false when more bytes are needed.
bool decode(const std::string& buf, size_t& used, uint8_t& op, std::vector<std::string>& fields) {
  if (buf.size() < 5) return false;
  op = static_cast<uint8_t>(buf[0]);
  const uint32_t n = get_u32(buf.data() + 1);
  size_t pos = 5;
  fields.clear();
  for (uint32_t i = 0; i < n; ++i) {
    if (buf.size() < pos + 4) return false;
    const uint32_t len = get_u32(buf.data() + pos);
    pos += 4;
    if (buf.size() < pos + len) return false;
    fields.emplace_back(buf.data() + pos, len);
    pos += len;
  }
  used = pos;
  return true;
}

std::string reply(uint8_t status, const std::string& payload) {
  std::string r(1, static_cast<char>(status));
  put_u32(r, static_cast<uint32_t>(payload.size()));
  return r + payload;
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string join_lines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "\n") + x;
  return s;
}

int64_t to_ms(double seconds) { return static_cast<int64_t>(seconds * 1000.0); }

}  // namespace

// ---- server (rank 0) -------------------------------------------------------------------------------------
class TcpStore::Server {
 public:
  Server(int port, int world_size) : world_(world_size) {
    // One dual-stack socket when the host has IPv6, else IPv4: clients may resolve MASTER_ADDR either way.
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1, zero = 0;
    if (listen_fd_ >= 0) {
      ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        const int err = errno;
        ::close(listen_fd_);
        listen_fd_ = -1;
        if (err == EADDRINUSE) fail_bind(port, err);
      }
    }
    if (listen_fd_ < 0) {
      listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      AF_CHECK(listen_fd_ >= 0, "store: cannot create a socket: {}", std::strerror(errno));
      ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(port));
      if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail_bind(port, errno);
    }
    AF_CHECK(::listen(listen_fd_, 128) == 0, "store: listen on port {} failed: {}", port, std::strerror(errno));
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
    port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    AF_CHECK(::pipe2(wake_, O_CLOEXEC) == 0, "store: pipe failed: {}", std::strerror(errno));
    thread_ = std::thread([this] { loop(); });
  }
  ~Server() {
    const char c = 'x';
    [[maybe_unused]] ssize_t k = ::write(wake_[1], &c, 1);
    thread_.join();
    for (Conn& c2 : conns_) ::close(c2.fd);
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  int port() const { return port_; }

 private:
  struct Conn {
    int fd;
    std::string in;
    int rank = -1;
    bool bye = false;
  };
  struct Waiter {
    int fd;
    std::vector<std::string> keys;
    int64_t deadline;
    bool get;  // reply with the value of keys[0] (else an empty ok)
  };

  [[noreturn]] void fail_bind(int port, int err) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    AF_THROW(Io, "store: rank 0 cannot listen on MASTER_PORT {}: {}{}", port, std::strerror(err),
             err == EADDRINUSE ? " (another job, or a previous run still exiting, holds it: pick another MASTER_PORT)"
                               : "");
  }

  void loop() {
    for (;;) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (const Conn& c : conns_) fds.push_back({c.fd, POLLIN, 0});
      int64_t timeout = -1;  // until the earliest deadline of a pending wait
      const int64_t now = now_ms();
      for (const Waiter& w : waiters_) {
        const int64_t left = std::max<int64_t>(0, w.deadline - now);
        timeout = timeout < 0 ? left : std::min(timeout, left);
      }
      const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(timeout, INT32_MAX)));
      if (rc < 0 && errno != EINTR) return;
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          no_delay(fd);
          conns_.push_back({fd, {}});
        }
      }
      std::vector<int> closed;
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        Conn* c = find(fds[i].fd);
        char buf[65536];
        const ssize_t k = ::recv(c->fd, buf, sizeof buf, 0);
        if (k <= 0) {
          closed.push_back(c->fd);
          continue;
        }
        c->in.append(buf, static_cast<size_t>(k));
        size_t used = 0;
        uint8_t op = 0;
        std::vector<std::string> f;
        while (decode(c->in, used, op, f)) {
          c->in.erase(0, used);
          handle(*c, op, f);
        }
      }
      for (int fd : closed) drop(fd);
      expire();
    }
  }

  Conn* find(int fd) {
    for (Conn& c : conns_)
      if (c.fd == fd) return &c;
    return nullptr;
  }

  void drop(int fd) {
    Conn* c = find(fd);
    if (c->rank >= 0 && !c->bye && departed_.empty()) {
      departed_ = fmt::format("rank {} disconnected from the store without saying goodbye (its process exited or "
                              "crashed)", c->rank);
      for (const Waiter& w : waiters_) send_all(w.fd, reply(kFailed, departed_));
      waiters_.clear();
    }
    waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(), [&](const Waiter& w) { return w.fd == fd; }),
                   waiters_.end());
    ::close(fd);
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [&](const Conn& x) { return x.fd == fd; }),
                 conns_.end());
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> m;
    for (const auto& k : keys)
      if (!data_.count(k)) m.push_back(k);
    return m;
  }

  void answer(const Waiter& w) {
    send_all(w.fd, reply(kOk, w.get ? data_.at(w.keys[0]) : std::string()));
  }

  void wake_waiters() {
    auto ready = [&](const Waiter& w) { return missing(w.keys).empty(); };
    for (const Waiter& w : waiters_)
      if (ready(w)) answer(w);
    waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(), ready), waiters_.end());
  }

  void expire() {
    const int64_t now = now_ms();
    auto late = [&](const Waiter& w) { return w.deadline <= now; };
    for (const Waiter& w : waiters_)
      if (late(w)) send_all(w.fd, reply(kTimeout, join_lines(missing(w.keys))));
    waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(), late), waiters_.end());
  }

  void wait_for(Conn& c, std::vector<std::string> keys, int64_t timeout_ms, bool get) {
    Waiter w{c.fd, std::move(keys), now_ms() + timeout_ms, get};
    if (missing(w.keys).empty()) return answer(w);
    if (!departed_.empty()) {
      send_all(c.fd, reply(kFailed, departed_));
      return;
    }
    waiters_.push_back(std::move(w));
  }

  void handle(Conn& c, uint8_t op, const std::vector<std::string>& f) {
    auto bad = [&] { send_all(c.fd, reply(kFailed, "malformed store request")); };
    switch (op) {
      case kHello: {
        if (f.size() != 2) return bad();
        const int rank = std::stoi(f[0]), world = std::stoi(f[1]);
        if (world != world_)
          return (void)send_all(c.fd, reply(kFailed, fmt::format("rank {} has WORLD_SIZE={}, rank 0 has {}: every rank "
                                                                 "of a job needs the same WORLD_SIZE", rank, world, world_)));
        for (const Conn& o : conns_)
          if (o.rank == rank)
            return (void)send_all(c.fd, reply(kFailed, fmt::format("rank {} is already connected: two processes "
                                                                   "have RANK={}", rank, rank)));
        c.rank = rank;
        send_all(c.fd, reply(kOk, ""));
        return;
      }
      case kSet:
        if (f.size() != 2) return bad();
        data_[f[0]] = f[1];
        send_all(c.fd, reply(kOk, ""));
        wake_waiters();
        return;
      case kGet:
        if (f.size() != 2) return bad();
        return wait_for(c, {f[0]}, std::stoll(f[1]), true);
      case kAdd: {
        if (f.size() != 2) return bad();
        auto it = data_.find(f[0]);
        const int64_t v = (it == data_.end() ? 0 : std::stoll(it->second)) + std::stoll(f[1]);
        data_[f[0]] = std::to_string(v);
        send_all(c.fd, reply(kOk, data_[f[0]]));
        wake_waiters();
        return;
      }
      case kCheck:
        send_all(c.fd, reply(kOk, missing(f).empty() ? "1" : "0"));
        return;
      case kWait: {
        if (f.empty()) return bad();
        return wait_for(c, std::vector<std::string>(f.begin() + 1, f.end()), std::stoll(f[0]), false);
      }
      case kArrive: {  // a barrier in one request: set this rank's key, then wait for all of them
        if (f.size() < 2) return bad();
        data_[f[1]] = std::string(1, '1');  // not `= "1"`: GCC 12 warns falsely on it (-Wrestrict, its bug 105329)
        wake_waiters();
        return wait_for(c, std::vector<std::string>(f.begin() + 2, f.end()), std::stoll(f[0]), false);
      }
      case kBye:
        c.bye = true;
        send_all(c.fd, reply(kOk, ""));
        return;
      default:
        return bad();
    }
  }

  int world_;
  int listen_fd_ = -1, port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::vector<Conn> conns_;
  std::vector<Waiter> waiters_;
  std::map<std::string, std::string> data_;
  std::string departed_;
};

// ---- client ------------------------------------------------------------------------------------------------
TcpStore::TcpStore(const StoreOptions& o) : o_(o) {
  AF_CHECK(o.world_size >= 1, "store: WORLD_SIZE must be >= 1, got {}", o.world_size);
  AF_CHECK(o.rank >= 0 && o.rank < o.world_size, "store: RANK {} is not in [0, WORLD_SIZE={})", o.rank, o.world_size);
  AF_CHECK(o.port >= 0 && o.port <= 65535 && (o.port > 0 || o.is_server), "store: MASTER_PORT must be in [1, 65535], "
           "got {}", o.port);
  AF_CHECK(o.timeout_s > 0, "store: the timeout must be positive, got {} s", o.timeout_s);
  AF_CHECK(!o.host.empty(), "store: MASTER_ADDR is empty");
  port_ = o.port;
  if (o.is_server) {
    server_ = std::make_unique<Server>(o.port, o.world_size);
    port_ = server_->port();
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(o.host.c_str(), std::to_string(port_).c_str(), &hints, &res);
  AF_CHECK(gai == 0, "store: MASTER_ADDR '{}' does not resolve: {}", o.host, gai_strerror(gai));
  const int64_t deadline = now_ms() + to_ms(o.timeout_s);
  std::string last_error = "no address";
  int64_t pause = 50;
  while (fd_ < 0) {
    for (addrinfo* a = res; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
      } else {
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    if (fd_ >= 0) break;
    if (now_ms() + pause > deadline) {
      ::freeaddrinfo(res);
      AF_THROW(Io, "rank {}: could not reach the store of rank 0 at {} within {} s (last error: {}); is rank 0 "
               "running, and do MASTER_ADDR/MASTER_PORT name its host and a free port?", o.rank, where(), o.timeout_s,
               last_error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause));
    pause = std::min<int64_t>(pause * 2, 1000);
  }
  ::freeaddrinfo(res);
  no_delay(fd_);
  request(kHello, {std::to_string(o.rank), std::to_string(o.world_size)});
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) {
    // Goodbye: leaving on purpose is not a crash for the others.
    send_all(fd_, encode(kBye, {}));
    char buf[5];
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 2000) > 0) [[maybe_unused]] ssize_t k = ::recv(fd_, buf, sizeof buf, MSG_WAITALL);
    ::close(fd_);
  }
}

std::string TcpStore::where() const { return fmt::format("{}:{}", o_.host, port_); }

std::pair<uint8_t, std::string> TcpStore::exchange(uint8_t op, const std::vector<std::string>& fields) {
  AF_CHECK(send_all(fd_, encode(op, fields)), "rank {}: lost the connection to the store at {} (rank 0's process; "
           "did it exit?)", o_.rank, where());
  // The server answers waits itself at their deadline; allow it some slack before deciding it is gone.
  const int64_t deadline = now_ms() + to_ms(o_.timeout_s) + 10000;
  std::string buf;
  size_t need = 5;
  while (buf.size() < need) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, deadline - now_ms())));
    AF_CHECK(rc != 0, "rank {}: the store at {} did not answer within {} s", o_.rank, where(), o_.timeout_s + 10);
    if (rc < 0 && errno == EINTR) continue;
    char tmp[65536];
    const ssize_t k = ::recv(fd_, tmp, std::min(sizeof tmp, need - buf.size()), 0);
    if (k <= 0)
      AF_THROW(Io, "rank {}: lost the connection to the store at {} (rank 0's process; did it exit?)", o_.rank, where());
    buf.append(tmp, static_cast<size_t>(k));
    if (buf.size() == 5) need = 5 + get_u32(buf.data() + 1);
  }
  const auto status = static_cast<uint8_t>(buf[0]);
  std::string payload = buf.substr(5);
  if (status == kFailed) AF_THROW(InvalidArgument, "rank {}: {} (store at {})", o_.rank, payload, where());
  return {status, std::move(payload)};
}

std::string TcpStore::request(uint8_t op, const std::vector<std::string>& fields) {
  auto [status, payload] = exchange(op, fields);
  AF_ASSERT(status == kOk, "store: unexpected timeout reply");
  return payload;
}

namespace {
// Splits the timeout reply's payload (missing keys, one a line).
std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    out.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}
}  // namespace

void TcpStore::set(const std::string& key, const std::string& value) { request(kSet, {key, value}); }

std::string TcpStore::get(const std::string& key) {
  auto [status, payload] = exchange(kGet, {key, std::to_string(to_ms(o_.timeout_s))});
  AF_CHECK(status == kOk, "rank {}: key '{}' was not set in the store at {} within {} s", o_.rank, key, where(),
           o_.timeout_s);
  return payload;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return std::stoll(request(kAdd, {key, std::to_string(delta)}));
}

bool TcpStore::check(const std::vector<std::string>& keys) { return request(kCheck, keys) == "1"; }

void TcpStore::wait(const std::vector<std::string>& keys) {
  std::vector<std::string> f{std::to_string(to_ms(o_.timeout_s))};
  f.insert(f.end(), keys.begin(), keys.end());
  auto [status, payload] = exchange(kWait, f);
  if (status == kOk) return;
  std::string missing;
  for (const auto& k : lines(payload)) missing += (missing.empty() ? "'" : ", '") + k + "'";
  AF_THROW(InvalidArgument, "rank {}: keys {} were not set in the store at {} within {} s", o_.rank, missing, where(),
           o_.timeout_s);
}

void TcpStore::barrier(const std::string& name) {
  // One request (arrive and wait): with a set and then a wait, the others could be released by the set and
  // rank 0 exit, taking the store with it, before this rank's wait reaches it.
  std::vector<std::string> f{std::to_string(to_ms(o_.timeout_s)), fmt::format("{}/{}", name, o_.rank)};
  for (int r = 0; r < o_.world_size; ++r) f.push_back(fmt::format("{}/{}", name, r));
  auto [status, payload] = exchange(kArrive, f);
  if (status == kOk) return;
  std::vector<std::string> ranks;
  for (const auto& k : lines(payload)) ranks.push_back(k.substr(name.size() + 1));
  std::string list;
  for (const auto& r : ranks) list += (list.empty() ? "" : ", ") + r;
  AF_THROW(InvalidArgument, "rank {}: rank{} {} did not arrive at '{}' within {} s (store at {}; WORLD_SIZE={}): did "
           "{} start, with the same MASTER_ADDR/MASTER_PORT?", o_.rank, ranks.size() > 1 ? "s" : "", list, name,
           o_.timeout_s, where(), o_.world_size, ranks.size() > 1 ? "they" : "it");
}

}  // namespace ampforge::dist
