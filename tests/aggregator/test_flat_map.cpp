// The live table of the recorder and of every window replay (memsnap/detail/flat_map.hpp) against std::unordered_map.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <unordered_map>

#include "memsnap/detail/flat_map.hpp"

namespace memsnap {
namespace {

// Allocs and frees as a trace makes them, on keys that collide in the table's low bits (aligned
// addresses): every erase shifts probe runs back, so a wrong shift loses or duplicates keys.
TEST(FlatMapTest, AgreesWithUnorderedMapUnderAllocsAndFrees) {
  std::mt19937_64 rng(7);
  FlatMap<std::uint64_t> flat;
  std::unordered_map<std::uint64_t, std::uint64_t> want;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 200000; ++i) {
      const std::uint64_t key = 0x7f0000000000ull + (rng() % 3000) * 512;
      if (rng() % 2 == 0) {
        const std::uint64_t v = rng();
        auto [p, inserted] = flat.try_emplace(key, v);
        EXPECT_EQ(inserted, want.emplace(key, v).second);
        EXPECT_EQ(*p, want.at(key));
      } else {
        EXPECT_EQ(flat.erase(key), want.erase(key) == 1);
      }
      ASSERT_EQ(flat.size(), want.size());
    }
    std::size_t seen = 0;
    flat.for_each([&](std::uint64_t k, std::uint64_t v) {
      ++seen;
      ASSERT_TRUE(want.count(k));
      EXPECT_EQ(v, want.at(k));
    });
    EXPECT_EQ(seen, want.size());
    for (const auto& [k, v] : want) {
      ASSERT_NE(flat.find(k), nullptr);
      EXPECT_EQ(*flat.find(k), v);
    }
    EXPECT_EQ(flat.find(0x1234), nullptr);
    flat.clear();
    want.clear();
    EXPECT_TRUE(flat.empty());
  }
}

}  // namespace
}  // namespace memsnap
