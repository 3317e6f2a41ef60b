// The spill's record checksum: the published check value, and the instruction path (8-byte words,
// then a byte tail) equal to the table for every length and alignment.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "crc32c.hpp"  // lib/src: not installed

namespace memsnap {
namespace {

TEST(Crc32c, CheckValueOfTheCastagnoliPolynomial) {
  const char digits[] = "123456789";
  EXPECT_EQ(crc32c(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(digits, 0), 0u);
}

TEST(Crc32c, EveryLengthAndAlignmentAgreesWithTheTable) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buf(64 * 1024 + 16);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n < 80; ++n) lengths.push_back(n);
  // Long buffers too.
  for (std::size_t base : {3072u, 6144u, 9216u, 30720u}) {
    for (std::size_t d = 0; d < 20; ++d) lengths.push_back(base - 10 + d);
  }
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % (64 * 1024));
  for (std::size_t n : lengths) {
    for (std::size_t off : {0u, 1u, 3u, 7u}) {
      ASSERT_EQ(crc32c(buf.data() + off, n), crc32c_portable(buf.data() + off, n)) << "n " << n << " offset " << off;
    }
  }
}

TEST(Crc32c, ChainedPartsEqualTheWhole) {
  std::vector<unsigned char> buf(20000);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 131 + 7);
  const std::uint32_t whole = crc32c(buf.data(), buf.size());
  for (std::size_t cut : {1u, 1000u, 3072u, 9999u, 19999u}) {
    EXPECT_EQ(crc32c(buf.data() + cut, buf.size() - cut, crc32c(buf.data(), cut)), whole) << cut;
  }
}

}  // namespace
}  // namespace memsnap
