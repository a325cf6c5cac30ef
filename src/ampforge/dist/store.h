// dist::TcpStore: a small key-value store over TCP for the rendezvous of a torchrun-style job (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 serves it on MASTER_PORT, every rank (rank 0 included)
// is a client. It carries bytes for bootstrapping only (the NCCL unique id, barriers, start-up checks),
// never tensors: collectives go through MPI or NCCL.
//
// Semantics (those of c10d's TCPStore, reduced to what the bootstrap needs):
//  - set(key, value) stores; get(key) waits until the key exists; add(key, delta) is an atomic counter
//    (decimal text); check(keys) tells without waiting; wait(keys) waits for all of them.
//  - Every wait has a deadline (StoreOptions::timeout_s), counted by the server; on expiry the error names
//    what is missing. barrier(name) is set("<name>/<rank>") + wait for every rank's key, so its timeout
//    names the ranks that did not arrive.
//  - Each client says who it is (rank, world size) when it connects. When a client's connection closes
//    without the goodbye its destructor sends (the process exited or crashed), the server fails every
//    pending and later wait at once with a message naming that rank, instead of letting the others run
//    into the timeout. A second client with the same rank, or a different world size, is refused.
//  - Connecting retries until the deadline (rank 0 may start later than the others); the error names
//    MASTER_ADDR:MASTER_PORT and the last socket error.
// Thread-safety: one TcpStore object is used by one thread at a time; the server runs on its own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ampforge::dist {

struct StoreOptions {
  std::string host = "127.0.0.1";  // MASTER_ADDR: where rank 0 serves (name or address)
  int port = 29500;                // MASTER_PORT; 0 with is_server: any free port (see TcpStore::port())
  int rank = 0;
  int world_size = 1;
  bool is_server = false;          // rank 0: serve the store in this process
  double timeout_s = 300;          // connect and every wait
};

class TcpStore {
 public:
  // Starts the server when is_server, then connects and introduces this rank. Throws InvalidArgument for
  // bad options, Io when the port cannot be bound or the server cannot be reached before the deadline.
  explicit TcpStore(const StoreOptions& options);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys);
  // Every rank arrives at `name` before any leaves; names the ranks that did not arrive on timeout.
  void barrier(const std::string& name);

  int port() const { return port_; }  // the port in use (the bound one when options.port was 0)
  const StoreOptions& options() const { return o_; }

 private:
  class Server;
  // One request and its reply (status, payload); a failure reply throws with the server's message.
  std::pair<uint8_t, std::string> exchange(uint8_t op, const std::vector<std::string>& fields);
  std::string request(uint8_t op, const std::vector<std::string>& fields);  // ok replies only
  std::string where() const;

  StoreOptions o_;
  int port_ = 0;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
};

}  // namespace ampforge::dist
