// Compressed datasets written fast: chunks shuffled and deflated on several threads (libdeflate
// where it was found at build time, else zlib) and handed to HDF5 already filtered with
// H5Dwrite_chunk. The dataset declares HDF5's standard shuffle and deflate filters, so any HDF5
// reader (h5py, h5dump) decompresses it with its built-in zlib, no plugin needed.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <string>

namespace memsnap::h5 {

/// Writes n items of `type` (`data` in the type's own layout) as the 1-D dataset `name`, in
/// chunks of `chunk_rows` rows, shuffled and deflated at `level` (1..9) by `threads` threads
/// (0: one per core). Throws StoreError naming `context` on failure.
void write_compressed(hid_t loc, const char* name, hid_t type, const void* data, std::size_t n, std::size_t chunk_rows,
                      int level, unsigned threads, const std::string& context);

}  // namespace memsnap::h5
