// The report's web assets (report/web/*), compiled into the binary by embed_web.cmake.
#pragma once

#include <string_view>

namespace memsnap::report::detail {

/// The bytes of report/web/<name> ("common.js", ...); empty if there is no such asset.
std::string_view web_asset(std::string_view name);

}  // namespace memsnap::report::detail
