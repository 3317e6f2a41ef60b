// Small string helpers of the window analysis (site names, categories, batch inference).
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace memsnap::text {

inline bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

// ASCII lower case.
inline std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace memsnap::text
