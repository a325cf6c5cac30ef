#include "ampforge/hw/prometheus.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "ampforge/util/error.h"
#include "ampforge/util/socket.h"
#include "ampforge/util/timer.h"

namespace ampforge::hw {

MetricsServer::MetricsServer(const std::string& address) {
  std::string host = "127.0.0.1", port_text = address;
  if (const auto colon = address.rfind(':'); colon != std::string::npos) {
    if (colon > 0) host = address.substr(0, colon);
    port_text = address.substr(colon + 1);
  }
  if (host == "localhost") host = "127.0.0.1";
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  AF_CHECK(!port_text.empty() && end && *end == '\0' && port >= 0 && port <= 65535,
           "--prometheus: expected [ADDR:]PORT with PORT in 0..65535, got '{}'", address);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  AF_CHECK(inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1,
           "--prometheus: '{}' is not an IPv4 address (use e.g. 127.0.0.1:9400 or 0.0.0.0:9400)", host);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) AF_THROW(Io, "--prometheus: socket: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(listen_fd_, 8) != 0) {
    const std::string e = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    AF_THROW(Io, "--prometheus: cannot listen on {}:{}: {}", host, port, e);
  }
  socklen_t len = sizeof(sa);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  host_ = host;
  thread_ = std::thread([this] { serve(); });
}

MetricsServer::~MetricsServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void MetricsServer::publish(std::string text) {
  std::lock_guard<std::mutex> lock(mu_);
  text_ = std::move(text);
}

void MetricsServer::serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int n = ::poll(&p, 1, 100);
    if (n <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    answer(fd);
    ::close(fd);
  }
}

void MetricsServer::answer(int fd) {
  // Read the request head (up to a blank line), at most 8 KiB and 2 s: enough for any scraper.
  std::string req;
  const Stopwatch sw;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos && req.size() < 8192 &&
         sw.seconds() < 2.0 && !stop_.load()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) break;
    req.append(buf, static_cast<size_t>(got));
  }
  const auto line_end = req.find_first_of("\r\n");
  const std::string line = req.substr(0, line_end);
  std::string status = "200 OK", body, type = "text/plain; version=0.0.4; charset=utf-8";
  const bool is_get = line.rfind("GET ", 0) == 0;
  const std::string path = is_get ? line.substr(4, line.find(' ', 4) - 4) : "";
  if (!is_get) {
    status = "405 Method Not Allowed";
    body = "only GET is served\n";
  } else if (path == "/metrics" || path.rfind("/metrics?", 0) == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    body = text_;
    ++scrapes_;
  } else {
    status = "404 Not Found";
    body = "ampforge monitor serves /metrics\n";
  }
  const std::string resp = fmt::format("HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                                       status, type, body.size(), body);
  send_all(fd, resp);  // a scraper that hung up gets nothing more; the server goes on
}

}  // namespace ampforge::hw
