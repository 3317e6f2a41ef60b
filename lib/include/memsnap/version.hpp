#pragma once
namespace memsnap {
inline constexpr const char* kVersion = "0.1.0";
inline constexpr int kFormatVersion = 1;  // of `memsnap info --json`, summary.json and the store
}  // namespace memsnap
