// Which address a rank advertises (src/core/net_interface.h), on made-up
// machines: the one that matters is a host with no default route whose root
// is on another host, where the old choice fell back to loopback and ranks
// advertised 127.0.0.1 to each other. And a peer address nobody can reach
// fails within seconds, naming the variable to set.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "src/core/error.h"
#include "src/core/net_interface.h"
#include "src/core/socket.h"

namespace attn {
namespace {

SocketAddress ip(const std::string& text) {
  SocketAddress a;
  EXPECT_EQ(parseAddress(text, &a), attnSuccess) << text;
  setAddressPort(&a, 0);
  return a;
}

IfAddr iface(const std::string& name, const std::string& addr, const std::string& mask,
             bool loopback = false) {
  IfAddr e;
  e.name = name;
  e.addr = ip(addr);
  e.netmask = ip(mask);
  e.loopback = loopback;
  return e;
}

// A host of an emulated pair: lo and eth0 on 10.77.5.0/24, no default route.
InterfaceFacts isolatedHost() {
  InterfaceFacts f;
  f.interfaces = {iface("lo", "127.0.0.1", "255.0.0.0", true),
                  iface("eth0", "10.77.5.2", "255.255.255.0")};
  return f;
}

std::string pick(const InterfaceFacts& f, const SocketAddress* root) {
  IfAddr out;
  attnResult_t rc = chooseInterface(f, root, &out);
  if (rc != attnSuccess) return "error: " + std::string(attnGetLastError(nullptr));
  return out.name + " " + addressIp(out.addr);
}

TEST(NetInterface, NoDefaultRouteAndARemoteRootPicksTheRootsSubnet) {
  SocketAddress root = ip("10.77.5.1:29501");
  EXPECT_EQ(pick(isolatedHost(), &root), "eth0 10.77.5.2");
}

TEST(NetInterface, TheMostSpecificSubnetHoldingTheRootWins) {
  InterfaceFacts f = isolatedHost();
  f.interfaces.push_back(iface("ib0", "10.0.0.7", "255.0.0.0"));
  f.interfaces.push_back(iface("eth1", "10.1.2.7", "255.255.255.0"));
  f.defaultRoute = "ib0";
  SocketAddress root = ip("10.1.2.1:1");
  EXPECT_EQ(pick(f, &root), "eth1 10.1.2.7");
}

TEST(NetInterface, OffSubnetRootFollowsTheKernelsRouteThenTheDefaultRoute) {
  InterfaceFacts f = isolatedHost();
  f.interfaces.push_back(iface("eth1", "192.168.9.4", "255.255.255.0"));
  SocketAddress root = ip("172.16.0.1:1");
  f.routeToRoot = ip("192.168.9.4");
  EXPECT_EQ(pick(f, &root), "eth1 192.168.9.4");
  f.routeToRoot.reset();
  f.defaultRoute = "eth0";
  EXPECT_EQ(pick(f, &root), "eth0 10.77.5.2");
  f.defaultRoute.clear();  // no route at all: still a real interface, never loopback
  EXPECT_EQ(pick(f, &root).rfind("eth", 0), 0u) << pick(f, &root);
}

TEST(NetInterface, ARootOnThisHostIsReachedThroughItsOwnInterfaceOrLoopback) {
  InterfaceFacts f = isolatedHost();
  SocketAddress own = ip("10.77.5.2:29501");
  EXPECT_EQ(pick(f, &own), "eth0 10.77.5.2");
  SocketAddress lo = ip("127.0.0.1:29501");
  EXPECT_EQ(pick(f, &lo), "lo 127.0.0.1");
}

TEST(NetInterface, WithoutARootTheDefaultRouteThenARealNicThenLoopback) {
  InterfaceFacts f = isolatedHost();
  f.interfaces.insert(f.interfaces.begin() + 1, iface("docker0", "172.17.0.1", "255.255.0.0"));
  EXPECT_EQ(pick(f, nullptr), "eth0 10.77.5.2");  // a real NIC before a container bridge
  f.defaultRoute = "docker0";
  EXPECT_EQ(pick(f, nullptr), "docker0 172.17.0.1");
  f.interfaces = {iface("lo", "127.0.0.1", "255.0.0.0", true)};
  f.defaultRoute.clear();
  EXPECT_EQ(pick(f, nullptr), "lo 127.0.0.1");
}

TEST(NetInterface, LoopbackIsNeverAdvertisedToARootOnAnotherHost) {
  InterfaceFacts f;
  f.interfaces = {iface("lo", "127.0.0.1", "255.0.0.0", true)};
  SocketAddress root = ip("10.77.5.1:29501");
  std::string got = pick(f, &root);
  EXPECT_NE(got.find("error"), std::string::npos) << got;
  EXPECT_NE(got.find("ATTN_SOCKET_IFNAME"), std::string::npos) << got;
  EXPECT_NE(got.find("10.77.5.1"), std::string::npos) << got;

  f = isolatedHost();
  f.spec = "lo";
  got = pick(f, &root);
  EXPECT_NE(got.find("selects loopback"), std::string::npos) << got;
  SocketAddress local = ip("127.0.0.1:29501");
  EXPECT_EQ(pick(f, &local), "lo 127.0.0.1");  // fine when the root is local
}

TEST(NetInterface, TheVariableWinsAndMustMatchSomething) {
  InterfaceFacts f = isolatedHost();
  f.interfaces.push_back(iface("eth1", "192.168.9.4", "255.255.255.0"));
  f.spec = "eth1";
  SocketAddress root = ip("10.77.5.1:1");
  EXPECT_EQ(pick(f, &root), "eth1 192.168.9.4");
  f.spec = "^eth0,lo";
  EXPECT_EQ(pick(f, &root), "eth1 192.168.9.4");
  f.spec = "ib";
  std::string got = pick(f, &root);
  EXPECT_NE(got.find("matches no interface"), std::string::npos) << got;
}

TEST(NetInterface, SubnetMatchNeedsTheSameFamilyAndAMask) {
  IfAddr e = iface("eth0", "10.77.5.2", "255.255.255.0");
  EXPECT_TRUE(onSubnet(e, ip("10.77.5.200")));
  EXPECT_FALSE(onSubnet(e, ip("10.77.6.1")));
  EXPECT_FALSE(onSubnet(e, ip("::1")));
  e.netmask = SocketAddress{};  // unknown mask: no claim
  EXPECT_FALSE(onSubnet(e, ip("10.77.5.200")));
  IfAddr v6 = iface("eth0", "fd00:1::2", "ffff:ffff:ffff:ffff::");
  EXPECT_TRUE(onSubnet(v6, ip("fd00:1::99")));
  EXPECT_FALSE(onSubnet(v6, ip("fd00:2::99")));
}

// The machine's own answer for a loopback root is a loopback address.
TEST(NetInterface, FindInterfaceOnThisMachine) {
  SocketAddress root = ip("127.0.0.1:1");
  SocketAddress got;
  std::string name;
  ASSERT_EQ(findInterface(&root, &name, &got), attnSuccess);
  EXPECT_TRUE(isLoopback(got)) << name;
}

// A peer's advertised address that refuses connections fails well before
// the communicator's timeout, naming the address and the variable.
TEST(NetInterface, AnUnreachablePeerAddressFailsWithinSeconds) {
  // A port nobody listens on: bind one, note it, close it.
  SocketAddress any = ip("127.0.0.1:0"), bound;
  int lfd = -1;
  ASSERT_EQ(socketListen(any, false, &lfd, &bound), attnSuccess);
  closeSocket(&lfd);
  int fd = -1;
  attnResult_t rc = socketConnect(bound, Deadline::afterMs(120000), Cancel{},
                                  "bootstrap rank 1: connect to peer 3", &fd, ConnectTarget::kPeer);
  EXPECT_EQ(rc, attnRemoteError);  // not attnTimeout after the whole 120 s
  std::string msg = attnGetLastError(nullptr);
  EXPECT_NE(msg.find("peer 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find(formatAddress(bound)), std::string::npos) << msg;
  EXPECT_NE(msg.find("ATTN_SOCKET_IFNAME"), std::string::npos) << msg;
  EXPECT_EQ(fd, -1);
}

}  // namespace
}  // namespace attn
