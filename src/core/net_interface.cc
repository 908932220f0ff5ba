#include "src/core/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "src/core/settings.h"
#include "src/core/error.h"
#include "src/core/log.h"

namespace attn {
namespace {

const uint8_t* ipBytes(const SocketAddress& a, size_t* n) {
  if (a.family() == AF_INET) {
    *n = 4;
    return reinterpret_cast<const uint8_t*>(
        &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr);
  }
  if (a.family() == AF_INET6) {
    *n = 16;
    return reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr.s6_addr;
  }
  *n = 0;
  return nullptr;
}

bool sameIp(const SocketAddress& a, const SocketAddress& b) {
  size_t na = 0, nb = 0;
  const uint8_t* pa = ipBytes(a, &na);
  const uint8_t* pb = ipBytes(b, &nb);
  return pa && na == nb && a.family() == b.family() && std::memcmp(pa, pb, na) == 0;
}

int prefixLength(const IfAddr& e) {
  size_t n = 0;
  const uint8_t* m = ipBytes(e.netmask, &n);
  int bits = 0;
  for (size_t i = 0; m && i < n; ++i) bits += __builtin_popcount(m[i]);
  return bits;
}

// Bridges of containers and VMs: reachable from this host only, so chosen
// after real NICs (NCCL skips docker* the same way).
bool virtualBridge(const std::string& name) {
  return name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0;
}

// The first address matching `want`, IPv4 before IPv6 (and `family` first
// when given).
template <class Want>
const IfAddr* firstWhere(const std::vector<IfAddr>& ifs, int family, Want want) {
  for (int fam : {family, AF_INET, AF_INET6})
    for (const IfAddr& e : ifs)
      if (fam != 0 && e.addr.family() == fam && want(e)) return &e;
  return nullptr;
}

// With no usable root address: the default route's interface, a real
// NIC, a bridge, and loopback last.
const IfAddr* pickWithoutRoot(const InterfaceFacts& f) {
  if (!f.defaultRoute.empty())
    if (auto* e = firstWhere(f.interfaces, 0, [&](const IfAddr& x) {
          return !x.loopback && x.name == f.defaultRoute;
        }))
      return e;
  if (auto* e = firstWhere(f.interfaces, 0, [](const IfAddr& x) {
        return !x.loopback && !virtualBridge(x.name);
      }))
    return e;
  return firstWhere(f.interfaces, 0, [](const IfAddr& x) { return !x.loopback; });
}

}  // namespace

bool onSubnet(const IfAddr& e, const SocketAddress& a) {
  size_t n = 0, na = 0, nm = 0;
  const uint8_t* ip = ipBytes(e.addr, &n);
  const uint8_t* other = ipBytes(a, &na);
  const uint8_t* mask = ipBytes(e.netmask, &nm);
  if (!ip || !other || !mask || n != na || n != nm || e.addr.family() != a.family() ||
      e.netmask.family() != a.family())
    return false;
  for (size_t i = 0; i < n; ++i)
    if ((ip[i] & mask[i]) != (other[i] & mask[i])) return false;
  return true;
}

attnResult_t chooseInterface(const InterfaceFacts& f, const SocketAddress* root, IfAddr* out) {
  const auto& ifs = f.interfaces;
  // The root is on this host when its address is loopback or one of ours;
  // then every address of this host reaches it.
  const bool rootLocal =
      root && (isLoopback(*root) ||
               firstWhere(ifs, 0, [&](const IfAddr& e) { return sameIp(e.addr, *root); }));
  if (f.spec) {
    const IfAddr* e = firstWhere(ifs, root ? root->family() : 0, [&](const IfAddr& x) {
      return !x.loopback && interfaceMatches(*f.spec, x.name);
    });
    if (!e) e = firstWhere(ifs, 0, [&](const IfAddr& x) { return interfaceMatches(*f.spec, x.name); });
    if (!e)
      return setError(attnInvalidArgument,
                      "ATTN_SOCKET_IFNAME=\"%s\" matches no interface with an address",
                      f.spec->c_str());
    if (e->loopback && root && !rootLocal)
      return setError(attnInvalidArgument,
                      "ATTN_SOCKET_IFNAME=\"%s\" selects loopback (%s), but the root %s is on "
                      "another host: its peers could not reach this rank there; name the "
                      "interface that reaches the root",
                      f.spec->c_str(), e->name.c_str(), formatAddress(*root).c_str());
    *out = *e;
    return attnSuccess;
  }

  const IfAddr* pick = nullptr;
  if (root) {
    const int fam = root->family();
    if (isLoopback(*root)) {
      // Every rank is on this host (nobody else can reach a loopback root).
      pick = firstWhere(ifs, fam, [](const IfAddr& e) { return e.loopback; });
    }
    if (!pick)  // the root's own interface, when the root is this host
      pick = firstWhere(ifs, fam, [&](const IfAddr& e) { return sameIp(e.addr, *root); });
    if (!pick) {  // the most specific subnet holding the root
      int best = -1;
      for (const IfAddr& e : ifs)
        if (!e.loopback && onSubnet(e, *root) && prefixLength(e) > best) {
          best = prefixLength(e);
          pick = &e;
        }
    }
    if (!pick && f.routeToRoot)  // where the kernel would send packets for the root
      pick = firstWhere(ifs, fam, [&](const IfAddr& e) {
        return !e.loopback && sameIp(e.addr, *f.routeToRoot);
      });
  }
  if (!pick) pick = pickWithoutRoot(f);
  if (!pick) {
    if (root && !rootLocal)
      return setError(attnInvalidArgument,
                      "no network interface of this host reaches the root %s (only loopback "
                      "is up): set ATTN_SOCKET_IFNAME to the interface the ranks share",
                      formatAddress(*root).c_str());
    pick = firstWhere(ifs, 0, [](const IfAddr& e) { return e.loopback; });
  }
  if (!pick) {
    // Not even loopback is listed (a bare namespace): 127.0.0.1 still works locally.
    static const IfAddr lo = [] {
      IfAddr e;
      e.name = "lo";
      sockaddr_in in{};
      in.sin_family = AF_INET;
      in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      std::memcpy(&e.addr.storage, &in, sizeof(in));
      e.addr.len = sizeof(in);
      e.loopback = true;
      return e;
    }();
    pick = &lo;
  }
  *out = *pick;
  return attnSuccess;
}

// Up interfaces with a usable address (IPv6 link-local needs scope ids that
// do not travel between hosts, so it is skipped).
std::vector<IfAddr> listInterfaces() {
  std::vector<IfAddr> out;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* p = ifs; p; p = p->ifa_next) {
    if (!p->ifa_addr || !(p->ifa_flags & IFF_UP)) continue;
    int fam = p->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    IfAddr e;
    e.name = p->ifa_name;
    const socklen_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    e.addr.len = len;
    std::memcpy(&e.addr.storage, p->ifa_addr, len);
    if (fam == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(&e.addr.storage)->sin6_addr))
      continue;
    if (p->ifa_netmask && p->ifa_netmask->sa_family == fam) {
      e.netmask.len = len;
      std::memcpy(&e.netmask.storage, p->ifa_netmask, len);
    }
    e.loopback = (p->ifa_flags & IFF_LOOPBACK) != 0;
    setAddressPort(&e.addr, 0);
    out.push_back(e);
  }
  freeifaddrs(ifs);
  return out;
}

namespace {

// The interface of the IPv4 default route with the lowest metric.
std::string defaultRouteInterface() {
  std::ifstream f("/proc/net/route");
  std::string line, best;
  long bestMetric = -1;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    std::string iface, dest, gw, flags, refcnt, use, metric, mask;
    if (!(ls >> iface >> dest >> gw >> flags >> refcnt >> use >> metric >> mask)) continue;
    unsigned long fl = std::strtoul(flags.c_str(), nullptr, 16);
    if (dest != "00000000" || mask != "00000000" || !(fl & 0x1 /*RTF_UP*/)) continue;
    long m = std::strtol(metric.c_str(), nullptr, 10);
    if (bestMetric < 0 || m < bestMetric) { bestMetric = m; best = iface; }
  }
  return best;
}

// The source address the kernel would use to reach `to` (a UDP connect
// sends nothing); nullopt when there is no route.
std::optional<SocketAddress> routeSource(const SocketAddress& to) {
  int s = socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return std::nullopt;
  SocketAddress dst = to;
  if (addressPort(dst) == 0) setAddressPort(&dst, 9);  // any port: nothing is sent
  std::optional<SocketAddress> src;
  if (::connect(s, dst.sa(), dst.len) == 0) {
    SocketAddress a;
    a.len = sizeof(a.storage);
    if (getsockname(s, a.sa(), &a.len) == 0) {
      setAddressPort(&a, 0);
      src = a;
    }
  }
  ::close(s);
  return src;
}

}  // namespace

attnResult_t findInterface(const SocketAddress* root, std::string* ifname, SocketAddress* addr) {
  InterfaceFacts f;
  f.interfaces = listInterfaces();
  f.defaultRoute = defaultRouteInterface();
  f.spec = settingString(Setting::kSocketIfname);
  if (root && !f.spec) f.routeToRoot = routeSource(*root);
  IfAddr pick;
  ATTN_CHECK(chooseInterface(f, root, &pick));
  ATTN_INFO(kLogBoot, "socket interface %s (%s)%s%s", pick.name.c_str(),
            addressIp(pick.addr).c_str(), root ? ", root " : "",
            root ? formatAddress(*root).c_str() : "");
  if (ifname) *ifname = pick.name;
  *addr = pick.addr;
  return attnSuccess;
}

attnResult_t findInterface(std::string* ifname, SocketAddress* addr) {
  return findInterface(nullptr, ifname, addr);
}

}  // namespace attn
