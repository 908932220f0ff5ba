// The fabric model as JSON: ATTN_TOPO_DUMP_FILE writes it, ATTN_TOPO_FILE
// reads it back (whole, or as overrides of tiers and rack ids). The schema
// is documented in topology/README.md. Malformed files are refused with a
// message naming the line/column or the key; nothing throws.
#pragma once

#include <string>

#include "topology/fabric_model.h"

namespace attn {

std::string fabricToJson(const FabricModel& m);

// Loads a whole model (e.g. a dump): "ranks" must list ranks 0..n-1 once
// each with their host. Tiers missing from the file keep m's figures.
bool fabricFromJson(const std::string& text, FabricModel* m, std::string* error);

// Applies an override file to a live model: "tiers" replace figures
// (source "file"), "hosts" assign racks to hosts (by full host id or by the
// hostname before '/'), "ranks" entries with a "rack" set that rank's rack.
// Ranks beyond the model's size are an error. Calls m->finalize().
bool applyFabricOverrides(const std::string& text, FabricModel* m, std::string* error);

// Reads a file whole; false with a message when it cannot.
bool readTextFile(const std::string& path, std::string* text, std::string* error);

}  // namespace attn
