// MappedFile: a pickle's bytes mapped read-only (or read, for a pipe), with the pages the reader
// has passed given back.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "torch/pickle.hpp"

namespace memsnap::pickle {

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw PickleError("pickle: cannot open " + path + ": " + std::strerror(errno), 0);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const auto size = static_cast<std::size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      ::madvise(map, size, MADV_SEQUENTIAL);
      ::close(fd);
      m_map = map;
      m_map_size = size;
      m_data = std::string_view(static_cast<const char*>(map), size);
      return;
    }
  }
  // Not a regular file (a pipe, a device), empty, or not mappable: read it.
  char chunk[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw PickleError("pickle: cannot read " + path + ": " + std::strerror(err), 0);
    }
    m_buffer.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  m_data = m_buffer;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this == &other) return *this;
  unmap();
  m_map = std::exchange(other.m_map, nullptr);
  m_map_size = std::exchange(other.m_map_size, 0);
  const bool buffered = other.m_data.data() == other.m_buffer.data();
  m_buffer = std::move(other.m_buffer);
  m_data = buffered ? std::string_view(m_buffer) : other.m_data;
  other.m_data = {};
  return *this;
}

MappedFile::~MappedFile() { unmap(); }

void MappedFile::unmap() noexcept {
  if (m_map) ::munmap(m_map, m_map_size);
  m_map = nullptr;
  m_map_size = 0;
}

void MappedFile::release(std::size_t begin, std::size_t end) const {
  if (!m_map) return;
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  begin = (begin + page - 1) / page * page;
  end = std::min(end, m_map_size) / page * page;
  if (begin < end) ::madvise(static_cast<char*>(m_map) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace memsnap::pickle
