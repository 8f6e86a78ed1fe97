// Whether the client of a request being answered has closed its connection, for a whole
// (non-streamed) response, which writes nothing until the end and so would notice only at
// --timeout. cpp-httplib 0.11 (Debian 12) gives a handler neither its socket nor
// req.is_connection_closed (0.14 on): the connection is found among the process's sockets by
// its four-tuple (local and remote address and port, unique to one TCP connection), and polled
// for the peer's close, as later httplib versions test is_socket_alive.
#pragma once

#include <httplib.h>

namespace nibble::serve {

class PeerWatch {
 public:
  /// Finds the request's socket (the handler's thread holds it open until it returns).
  explicit PeerWatch(const httplib::Request& req);
  /// The peer closed (or reset) the connection; false while open or when the socket was not found.
  bool Closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace nibble::serve
