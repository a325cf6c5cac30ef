// Sending on a socket (or a socket pair) whose other end may be gone.
#pragma once

#include <string_view>

namespace ampforge {

// Sends all of `bytes` on `fd`, retrying after a signal interrupts the call and after a partial send; MSG_NOSIGNAL, so
// a peer that closed its end gives EPIPE (false) instead of killing the process with SIGPIPE. false: the connection
// is gone (or another send error); how much was sent before is unknown to the caller.
bool send_all(int fd, std::string_view bytes);

}  // namespace ampforge
