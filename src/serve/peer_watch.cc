// PeerWatch (peer_watch.h).
#include "serve/peer_watch.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace nibble::serve {

namespace {

// The numeric host and port of a socket address (getnameinfo NI_NUMERICHOST, as httplib fills
// Request::remote_addr / local_addr).
bool HostPort(const sockaddr_storage& addr, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *host = h;
  *port = std::atoi(p);
  return true;
}

bool Matches(int fd, const httplib::Request& req) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;  // not a socket
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;   // a listener
  std::string local_host, peer_host;
  int local_port = 0, peer_port = 0;
  return HostPort(local, local_len, &local_host, &local_port) && HostPort(peer, peer_len, &peer_host, &peer_port) &&
         peer_port == req.remote_port && local_port == req.local_port && peer_host == req.remote_addr &&
         local_host == req.local_addr;
}

}  // namespace

PeerWatch::PeerWatch(const httplib::Request& req) {
  if (req.remote_port <= 0) return;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = entry.path().filename().string();
    int fd = -1;
    const auto [end, err] = std::from_chars(name.data(), name.data() + name.size(), fd);
    if (err != std::errc{} || end != name.data() + name.size()) continue;
    if (Matches(fd, req)) {
      fd_ = fd;
      return;
    }
  }
}

bool PeerWatch::Closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace nibble::serve
