// A minimal HTTP server for Prometheus scrapes: GET /metrics answers the latest published text; anything
// else is 404. One background thread, one connection at a time (a scraper every few seconds). Binds to
// loopback unless an address is given: "9400" and ":9400" mean 127.0.0.1:9400; "0.0.0.0:9400" all interfaces.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

namespace ampforge::hw {

class MetricsServer {
 public:
  // Throws ampforge::Error (InvalidArgument) for an address that does not parse, (Io) when binding fails.
  explicit MetricsServer(const std::string& address);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }              // the bound port (useful with port 0)
  const std::string& host() const { return host_; }
  void publish(std::string text);
  int scrapes() const { return scrapes_.load(); }

 private:
  void serve();
  void answer(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::string host_;
  std::mutex mu_;
  std::string text_;
  std::atomic<bool> stop_{false};
  std::atomic<int> scrapes_{0};
  std::thread thread_;
};

}  // namespace ampforge::hw
