// The exception root of the aggregator and report layers: one line of what() names the file and
// what went wrong; the CLI prints it and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace memsnap {

/// Root of every exception thrown by aggregator/ and report/.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reading or writing the HDF5 store failed (names the file and the object).
class StoreError : public Error {
 public:
  using Error::Error;
};

/// Aggregation failed. what() is the headline; details() holds one line per bad rank or file.
/// Thrown on every rank of the aggregator's communicator with the same content.
class AggregateError : public Error {
 public:
  explicit AggregateError(const std::string& what, std::vector<std::string> details = {})
      : Error(what), m_details(std::move(details)) {}
  const std::vector<std::string>& details() const { return m_details; }

 private:
  std::vector<std::string> m_details;
};

}  // namespace memsnap
