// Which local address a rank listens on and advertises to its peers.
//
// Chosen as NCCL chooses its bootstrap interface: ATTN_SOCKET_IFNAME when
// set; else, knowing the root's address, the interface on the root's subnet,
// then the one the kernel routes to the root by, then the default route's,
// then any non-loopback interface. A loopback address is never advertised
// to a root on another host: peers there would dial themselves.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attncomm.h"
#include "src/core/socket.h"

namespace attn {

// One address of an up interface.
struct IfAddr {
  std::string name;
  SocketAddress addr;     // port 0
  SocketAddress netmask;  // same family as addr; len 0 when unknown
  bool loopback = false;
};

// What the choice depends on, gathered from the machine (or made up by a
// test).
struct InterfaceFacts {
  std::vector<IfAddr> interfaces;
  std::string defaultRoute;            // interface of the default route, "" if none
  std::optional<std::string> spec;     // ATTN_SOCKET_IFNAME
  std::optional<SocketAddress> routeToRoot;  // source address the kernel picks for the root
};

// The pure part of findInterface. `root` is the root's address, or null
// when this process is creating the root. Fails (attnInvalidArgument, with
// the reason and the variable to set) when nothing suitable exists.
attnResult_t chooseInterface(const InterfaceFacts& facts, const SocketAddress* root, IfAddr* out);

// True when `a` is on the subnet of `e` (same family, masked bits equal).
bool onSubnet(const IfAddr& e, const SocketAddress& a);

// Up interfaces of this machine with a usable address.
std::vector<IfAddr> listInterfaces();

}  // namespace attn
