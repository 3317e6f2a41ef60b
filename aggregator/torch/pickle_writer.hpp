// A small protocol-4 pickle writer for plain data, the counterpart of pickle.hpp: what it writes
// Python's pickle.load reads, with shared nodes written once and referenced after.
#pragma once

#include <string>

#include "torch/pickle.hpp"

namespace memsnap::pickle {

struct WriteOptions {
  /// Group opcodes into ~64 KiB FRAMEs as Python's protocol 4 does (readers may prefetch frames).
  bool frames = true;
};

/// Serialises `root` as a protocol-4 pickle. A node reached more than once (the same pointer, such
/// as a frame list shared by many trace entries) is written once, memoised, and referenced with
/// BINGET/LONG_BINGET afterwards. Throws ValueError for a null node.
std::string write(const ValuePtr& root, const WriteOptions& opt = {});

}  // namespace memsnap::pickle
