#include "src/coll/hierarchy.h"

#include <algorithm>
#include <map>

namespace attn {

namespace {

// A group of the tree: its ranks in proximity order and its subgroups.
struct Node {
  std::vector<int> ranks;
  std::vector<Node> children;
};

// Splits node's ranks by their key at `tier` (keys above already agree),
// groups in order of first appearance; recurses down to single ranks.
void split(Node& node, const std::vector<TierKeys>& keys, size_t tier) {
  if (tier == (keys.empty() ? 0 : keys[0].size())) {
    for (int r : node.ranks) node.children.push_back(Node{{r}, {}});
    return;
  }
  std::map<uint64_t, size_t> index;
  for (int r : node.ranks) {
    auto [it, fresh] = index.emplace(keys[r][tier], node.children.size());
    if (fresh) node.children.emplace_back();
    node.children[it->second].ranks.push_back(r);
  }
  for (Node& c : node.children) split(c, keys, tier + 1);
}

// Nodes at depth d (root = depth 0).
void collect(const Node& n, int d, std::vector<const Node*>* out) {
  if (d == 0) { out->push_back(&n); return; }
  for (const Node& c : n.children) collect(c, d - 1, out);
}

}  // namespace

int Hierarchy::rank(const std::vector<int>& c) const {
  size_t idx = 0, stride = 1;
  for (int k = 0; k < levels(); ++k) {
    idx += static_cast<size_t>(c[k]) * stride;
    stride *= static_cast<size_t>(shape[k]);
  }
  return rankAt[idx];
}

bool Hierarchy::worthwhile() const {
  for (int g : groupsPerTier)
    if (g > 1 && g < nranks) return true;
  return false;
}

std::string Hierarchy::describe() const {
  static const char* kNames[] = {"ranks", "hosts", "racks"};
  std::string s;
  if (!regular) {
    s = "irregular:";
    for (size_t t = 0; t < groupsPerTier.size(); ++t)
      s += " " + std::to_string(groupsPerTier[t]) + " " + (t + 1 < 3 ? kNames[t + 1] : "groups") +
           " (largest " + std::to_string(maxGroupSizePerTier[t]) + " ranks)";
    return s;
  }
  std::string names;
  for (int k = levels() - 1; k >= 0; --k) {
    s += std::to_string(shape[k]) + (k ? "x" : "");
    int t = tierOfLevel[k];
    names += std::string(t < 3 ? kNames[t] : "groups") + (k ? " x " : "");
  }
  return s.empty() ? "1 (flat)" : s + " (" + names + ")";
}

Hierarchy buildHierarchy(const std::vector<TierKeys>& keys, const std::vector<int>& order) {
  Hierarchy h;
  h.nranks = static_cast<int>(order.size());
  const int tiers = keys.empty() ? 0 : static_cast<int>(keys[0].size());
  Node root{order, {}};
  split(root, keys, 0);

  // Depth tiers+1 holds single ranks; level "inner" k sits at depth tiers-k
  // (its nodes' children are the members).
  for (int t = 0; t < tiers; ++t) {
    std::vector<const Node*> groups;
    collect(root, tiers - t, &groups);  // t = 0: hosts, 1: racks
    int mx = 0;
    for (const Node* g : groups) mx = std::max<int>(mx, static_cast<int>(g->ranks.size()));
    h.groupsPerTier.push_back(static_cast<int>(groups.size()));
    h.maxGroupSizePerTier.push_back(mx);
  }

  h.regular = true;
  std::vector<int> depthOfLevel;
  for (int k = 0; k <= tiers; ++k) {
    std::vector<const Node*> nodes;
    collect(root, tiers - k, &nodes);
    size_t members = nodes[0]->children.size();
    for (const Node* n : nodes)
      if (n->children.size() != members) h.regular = false;
    if (!h.regular) break;
    if (members > 1) {
      h.shape.push_back(static_cast<int>(members));
      h.tierOfLevel.push_back(k);
      depthOfLevel.push_back(tiers - k);
    }
  }
  if (!h.regular) {
    h.shape.clear();
    h.tierOfLevel.clear();
    return h;
  }

  // Coordinates: a rank's child index at each kept level's depth.
  h.coords.assign(h.nranks, std::vector<int>(h.levels(), 0));
  std::vector<int> path;
  auto walk = [&](auto&& self, const Node& n, int depth) -> void {
    if (n.children.empty()) {
      for (int k = 0; k < h.levels(); ++k) h.coords[n.ranks[0]][k] = path[depthOfLevel[k]];
      return;
    }
    for (size_t i = 0; i < n.children.size(); ++i) {
      path.resize(depth + 1);
      path[depth] = static_cast<int>(i);
      self(self, n.children[i], depth + 1);
    }
  };
  walk(walk, root, 0);
  h.rankAt.assign(h.nranks, -1);
  for (int r = 0; r < h.nranks; ++r) {
    size_t idx = 0, stride = 1;
    for (int k = 0; k < h.levels(); ++k) {
      idx += static_cast<size_t>(h.coords[r][k]) * stride;
      stride *= static_cast<size_t>(h.shape[k]);
    }
    h.rankAt[idx] = r;
  }
  return h;
}

int slicesAbove(const Hierarchy& h, int k) {
  int s = 1;
  for (int i = k + 1; i < h.levels(); ++i) s *= h.shape[i];
  return s;
}

int sliceOf(const Hierarchy& h, int rank, int k) {
  int s = 0;
  for (int i = k + 1; i < h.levels(); ++i) s = s * h.shape[i] + h.coords[rank][i];
  return s;
}

std::vector<int> sliceMembers(const Hierarchy& h, int rank, int k, int slice) {
  std::vector<int> c = h.coords[rank];
  // Outer coordinates from the slice index, the last level least significant.
  for (int i = h.levels() - 1; i > k; --i) {
    c[i] = slice % h.shape[i];
    slice /= h.shape[i];
  }
  std::vector<int> members(h.shape[k]);
  for (int m = 0; m < h.shape[k]; ++m) {
    c[k] = m;
    members[m] = h.rank(c);
  }
  return members;
}

}  // namespace attn
