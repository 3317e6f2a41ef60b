/* memsnap C API: record a GPU (or any) allocator's history from a C or C++ program.
 *
 * Every call is safe to make at any time: before memsnap_init, after memsnap_shutdown, or when
 * recording was refused (bad config, unwritable folder); such calls do nothing. No call aborts,
 * exits or throws into the program.
 *
 *   memsnap_init(NULL);                       // config from $MEMSNAP_CONFIG and MEMSNAP_* vars
 *   for (batch...) {
 *     memsnap_record_alloc(dev, ptr, bytes, stream);
 *     memsnap_record_free(dev, ptr, bytes, stream);
 *     memsnap_step();                          // the batch ended
 *   }
 *   memsnap_shutdown();                        // also runs at exit
 */
#ifndef MEMSNAP_MEMSNAP_H
#define MEMSNAP_MEMSNAP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Device index for host (pinned) memory. */
#define MEMSNAP_HOST_DEVICE (-1)

/* Actions for memsnap_record (PyTorch's trace entry actions). */
enum memsnap_action {
  MEMSNAP_ALLOC = 0,
  MEMSNAP_FREE_REQUESTED = 1,
  MEMSNAP_FREE_COMPLETED = 2,
  MEMSNAP_SEGMENT_ALLOC = 3,
  MEMSNAP_SEGMENT_FREE = 4,
  MEMSNAP_SEGMENT_MAP = 5,
  MEMSNAP_SEGMENT_UNMAP = 6
};

/* Starts recording. config_path: a JSON or YAML file, or NULL for $MEMSNAP_CONFIG (none: the
 * defaults); MEMSNAP_<KEY> variables override single keys. Returns 0 when recording, 1 when
 * memsnap stepped aside (the reason is logged once on stderr); the program runs on either way. */
int memsnap_init(const char* config_path);

void memsnap_record_alloc(int device, uint64_t addr, uint64_t size, uint64_t stream);
void memsnap_record_free(int device, uint64_t addr, uint64_t size, uint64_t stream);
void memsnap_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream);

/* An allocation of `requested` bytes failed: records an OOM and writes the window at once. */
void memsnap_record_oom(int device, uint64_t requested, uint64_t device_free, uint64_t device_total,
                        uint64_t stream);

/* The current batch (training step) ended. */
void memsnap_step(void);

/* Writes the current window now. Returns 0 on success. */
int memsnap_dump(void);

/* Flushes and closes the record. Also runs at exit. */
void memsnap_shutdown(void);

/* 1 while recording. */
int memsnap_active(void);

#ifdef __cplusplus
}
#endif

#endif /* MEMSNAP_MEMSNAP_H */
