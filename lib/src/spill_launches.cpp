// The spills of a run folder: finding them, and grouping them by the launch that wrote them.
#include "memsnap/spill.hpp"

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <map>

#include "memsnap/record_fields.hpp"

namespace memsnap {

std::vector<std::filesystem::path> find_spills(const std::filesystem::path& run_dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& dir : {run_dir / "spill", run_dir}) {
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == kSpillSuffix) out.push_back(entry.path());
    }
    if (!out.empty()) break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string spill_file_name(int rank, std::int64_t pid) {
  return "rank" + std::to_string(rank) + ".pid" + std::to_string(pid) + kSpillSuffix;
}

namespace {
// rank<R>.pid<P>.spill -> R; -1 for another name.
int rank_of_file_name(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind("rank", 0) != 0) return -1;
  char* end = nullptr;
  const long r = std::strtol(name.c_str() + 4, &end, 10);
  return end != name.c_str() + 4 && *end == '.' && r >= 0 && r < kMaxRanks ? static_cast<int>(r) : -1;
}
}  // namespace

std::vector<SpillLaunch> spill_launches(const std::vector<std::filesystem::path>& spills) {
  std::map<std::string, SpillLaunch> by_id;
  std::vector<std::filesystem::path> unread;
  for (const auto& p : spills) {
    const std::optional<RankMeta> meta = read_spill_meta(p);
    if (!meta) {
      unread.push_back(p);
      continue;
    }
    SpillLaunch& l = by_id[meta->launch];
    l.id = meta->launch;
    if (meta->start_unix_ns > 0 && (l.start_unix_ns == 0 || meta->start_unix_ns < l.start_unix_ns)) l.start_unix_ns = meta->start_unix_ns;
    l.ranks.push_back(meta->rank);
    l.files.push_back(p);
  }
  std::vector<SpillLaunch> out;
  for (auto& [id, l] : by_id) out.push_back(std::move(l));
  std::stable_sort(out.begin(), out.end(), [](const SpillLaunch& a, const SpillLaunch& b) { return a.start_unix_ns < b.start_unix_ns; });
  // A spill without a readable META (its process died at once, or the file is damaged) belongs,
  // as far as anyone can tell, to the newest launch that lacks its rank.
  for (const auto& p : unread) {
    if (out.empty()) out.emplace_back();
    const int rank = rank_of_file_name(p);
    SpillLaunch* home = &out.back();
    for (auto it = out.rbegin(); it != out.rend(); ++it) {
      if (rank >= 0 && std::find(it->ranks.begin(), it->ranks.end(), rank) == it->ranks.end()) {
        home = &*it;
        break;
      }
    }
    if (rank >= 0) home->ranks.push_back(rank);
    home->files.push_back(p);
  }
  for (auto& l : out) {
    std::sort(l.ranks.begin(), l.ranks.end());
    std::sort(l.files.begin(), l.files.end());
  }
  return out;
}

std::string launch_time_text(std::int64_t unix_ns) {
  if (unix_ns <= 0) return "at an unknown time";
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  char text[32] = {};
  if (localtime_r(&t, &tm) == nullptr || std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &tm) == 0) return "at an unknown time";
  return text;
}

LaunchChoice choose_launch(const std::filesystem::path& run_dir, const std::string& launch) {
  LaunchChoice choice;
  const std::vector<SpillLaunch> launches = spill_launches(find_spills(run_dir));
  if (launches.empty()) return choice;  // the caller says there are no spills
  auto name = [](const SpillLaunch& l) { return l.id.empty() ? std::string(kUnnamedLaunch) : l.id; };
  auto describe = [&](const SpillLaunch& l) {
    return "launch " + name(l) + " (" + std::to_string(l.ranks.size()) + (l.ranks.size() == 1 ? " rank" : " ranks") +
           ", started " + launch_time_text(l.start_unix_ns) + ")";
  };
  const SpillLaunch* pick = launch.empty() ? &launches.back() : nullptr;
  for (const auto& l : launches) {
    if (pick == nullptr && (l.id == launch || name(l) == launch)) pick = &l;
  }
  std::string others;
  for (const auto& l : launches) {
    if (&l != pick) others += (others.empty() ? "" : ", ") + describe(l);
  }
  if (pick == nullptr) {
    choice.error = run_dir.string() + " holds no record of launch " + launch + "; it holds " + others;
    return choice;
  }
  choice.files = pick->files;
  if (launch.empty() && launches.size() > 1) {
    choice.note = run_dir.string() + " holds the records of " + std::to_string(launches.size()) +
                  " launches; this store is made of the newest, " + describe(*pick) + ", and leaves out " + others +
                  "; for another: --launch " + name(launches[launches.size() - 2]);
  }
  return choice;
}

}  // namespace memsnap
